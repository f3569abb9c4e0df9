"""Traced `compile_step` graphs in the cache directory: a warm process skips the trace.

`torch_tpu.compile_step` traces the user's step (forward, backward,
``optimizer.step()``) with fake tensors, twice (autograd, then
functionalization): most of a small model's first step once its XLA program
is on disk. This module keeps the final graph, so a new process that calls
the same step rebuilds the graph instead of tracing it, and the graph tier
(`torch_tpu.cache.graphs`) then loads its executable without lowering it.

What is stored: the functional aten graph as plain JSON (nodes, their
targets by name - ``aten::add.Tensor``, ``operator.getitem`` - constant
arguments, and each node's shape, stride, dtype and device), the output
layout and the step's bookkeeping; no pickle. Entries live in the artifact
store (`torch_tpu.compile.persist.artifacts.ArtifactStore`): checksummed, stamped
with the torch/Python/JAX versions and a hash of torch_tpu's sources, and
only read from a directory that passes the trust check (ssh's rule: owned
by this user or root, not writable by group or others). A corrupted,
truncated or stale entry is ignored with one warning and the step traced.

What the key covers (a sound approximation of dynamo's guards): everything
the in-process key does (shapes, dtypes and devices of parameters, grads,
buffers, optimizer state and arguments, hyperparameter values, ``.grad``
None-ness, grad mode), plus a fingerprint of the Python the trace runs:
the step function's bytecode and constants (nested functions included),
the values of its defaults, closure cells and the globals its code names,
followed recursively into user functions, classes (all their methods),
objects (their attributes: a model's config, an ``argparse`` namespace) and
modules (the names used from them); the modules' and optimizers' classes
and attributes (hooks included); the compile options, matmul precision and
default dtype. Editing a function body, a hyperparameter, a constant the
step reads, or the shapes re-traces.

Code of torch, torch_tpu and JAX is covered by the versions the store
checks, the standard library's by Python's version, and that of packages
installed in site-packages (transformers, NumPy) by their version; the
user's own code (and editable installs) is walked. Tensors the trace
captured as constants (a ``torch.tensor(...)`` made in the step) are stored
with the graph when they have at most `_MAX_CONST` elements; a larger one
keeps the step from being stored.

Not covered (documented): code reached only through objects outside that
walk (a torch function monkeypatched at run time), and the contents of
containers of more than `_MAX_ITEMS` objects (described by their repr).
``TORCH_TPU_STEP_CACHE=0`` turns this tier off.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import math
import operator
import os
import sys
import threading
import types
from typing import Any

from ..._compat import torch_api
from ...cache import store as _store
from .artifacts import artifact_store
from ...runtime.precision import get_matmul_precision
from ...runtime.switches import switch_on

FORMAT = 1
_MAX_CONST = 4096      # tensor values hashed into the key up to this size
_MAX_NODES = 200_000   # a walk larger than this is not persisted
_MAX_ITEMS = 1000      # larger containers are described by their repr
# Attributes whose value differs in every process and means nothing to a
# trace (transformers' GenerationConfig stores hash(self), which is salted).
_IGNORED_ATTRS = frozenset({"_original_object_hash"})

_lock = threading.Lock()
_pending: list = []    # (key, entry) written at exit (or by save())
_atexit = False


class _Stats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.hits = 0      # steps rebuilt from disk (not traced)
        self.misses = 0    # lookups that found nothing
        self.writes = 0    # entries written
        self.rejected = 0  # entries ignored: corrupt, stale, unusable here
        self.unkeyed = 0   # steps that could not be keyed (not stored)


STATS = _Stats()


def stats() -> dict:
    return {"enabled": enabled(), "hits": STATS.hits, "misses": STATS.misses,
            "writes": STATS.writes, "rejected": STATS.rejected, "unkeyed": STATS.unkeyed}


def enabled() -> bool:
    """On unless TORCH_TPU_STEP_CACHE=0, when a cache directory is configured."""
    if not switch_on("TORCH_TPU_STEP_CACHE"):
        return False
    return _store.configured_dir() is not None


class Unkeyable(Exception):
    """Something the key cannot describe reproducibly: the step is not stored."""


# -- the key: a fingerprint of what the trace depends on --------------------------

# Covered by the versions every entry is stamped with (and checked against).
_STAMPED = frozenset({"torch", "torch_tpu", "jax", "jaxlib", "functorch", "builtins"})
_MISSING = object()
_lib_cache: dict = {}
_site: tuple | None = None


def _site_dirs() -> tuple:
    global _site
    if _site is None:
        import site
        import sysconfig

        dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
        with contextlib.suppress(Exception):
            dirs.update(site.getsitepackages())
        with contextlib.suppress(Exception):
            dirs.add(site.getusersitepackages())
        _site = tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)
    return _site


def _library(modname: str | None) -> tuple | None:
    """('name', 'version') when `modname`'s code is covered by a version: torch,
    torch_tpu, JAX (stamped on every entry), the standard library (Python's
    version), or a package installed in site-packages with a version
    (transformers, numpy); None for the user's own code, which is walked.
    (An editable install lives outside site-packages: walked.)"""
    if not modname:
        return None
    r = _lib_cache.get(modname, _MISSING)
    if r is not _MISSING:
        return r
    top = modname.split(".", 1)[0]
    r = None
    if top in _STAMPED or top in sys.stdlib_module_names:
        r = (top,)
    else:
        mod = sys.modules.get(top)
        f = getattr(mod, "__file__", None)
        if f and os.path.realpath(f).startswith(_site_dirs()):
            ver = getattr(mod, "__version__", None)
            if not isinstance(ver, str):
                try:
                    from importlib.metadata import version

                    ver = version(top)
                except Exception:
                    ver = None
            r = (top, ver) if ver else None
    _lib_cache[modname] = r
    return r


def _is_library(modname: str | None) -> bool:
    return _library(modname) is not None


def _code_names(code: types.CodeType, out: set) -> None:
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_names(c, out)


def _code_digest(code: types.CodeType, h: Any) -> None:
    """Bytecode, names and constants (nested code objects recursively);
    not line numbers, so editing a comment elsewhere does not invalidate."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                   code.co_argcount, code.co_kwonlyargcount, code.co_flags)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            h.update(b"<code>")
            _code_digest(c, h)
        else:
            h.update(repr(c).encode())
            h.update(b"\0")


class _Walker:
    """Feeds a description of Python values (and the code they lead to) to a hash."""

    def __init__(self, inputs: set):
        self.h = hashlib.sha256()
        self.seen: dict = {}
        self.inputs = inputs   # ids of tensors that are graph inputs (values not baked in)
        self.count = 0

    def emit(self, *parts: object) -> None:
        self.h.update(repr(parts).encode())
        self.h.update(b"\1")

    def walk(self, v: Any, names: set | None = None) -> None:
        import torch

        self.count += 1
        if self.count > _MAX_NODES:
            raise Unkeyable("too much state to fingerprint")
        if v is None or isinstance(v, (bool, int, str, bytes, complex)):
            self.emit(type(v).__name__, v)
            return
        if isinstance(v, float):
            self.emit("float", v.hex() if math.isfinite(v) else repr(v))
            return
        if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            self.emit(type(v).__name__, str(v))
            return
        if isinstance(v, torch.Size):
            self.emit("size", tuple(v))
            return
        vid = id(v)
        if vid in self.seen:
            self.emit("ref", self.seen[vid])
            return
        self.seen[vid] = len(self.seen)
        if isinstance(v, torch.Tensor):
            self._tensor(v)
        elif isinstance(v, (list, tuple, set, frozenset, dict)) and len(v) > _MAX_ITEMS:
            # A vocabulary, a dataset index: by its repr (C speed), or by its
            # length when that names objects by address.
            r = repr(v)
            self.emit("big", type(v).__name__, len(v),
                      None if " at 0x" in r else hashlib.sha256(r.encode()).hexdigest())
        elif isinstance(v, (list, tuple, set, frozenset)):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            self.emit(type(v).__name__, len(items))
            for x in items:
                self.walk(x)
        elif isinstance(v, dict):
            self.emit(type(v).__name__, len(v))
            for k, x in v.items():
                self.walk(k)
                self.walk(x)
        elif isinstance(v, types.FunctionType):
            self._function(v)
        elif isinstance(v, types.MethodType):
            self.emit("method")
            self.walk(v.__func__)
            self.walk(v.__self__)
        elif isinstance(v, (staticmethod, classmethod)):
            self.emit(type(v).__name__)
            self.walk(v.__func__)
        elif isinstance(v, property):
            self.emit("property")
            for f in (v.fget, v.fset, v.fdel):
                self.walk(f)
        elif isinstance(v, functools.partial):
            self.emit("partial")
            self.walk(v.func)
            self.walk(v.args)
            self.walk(v.keywords)
        elif isinstance(v, type):
            self._class(v)
        elif isinstance(v, types.ModuleType):
            self.emit("module", v.__name__)
            if not _is_library(v.__name__) and names:
                # The attributes of a user module that the code names.
                d = vars(v)
                for n in sorted(names):
                    if n in d:
                        self.emit("attr", n)
                        self.walk(d[n])
        elif isinstance(v, (types.BuiltinFunctionType, types.WrapperDescriptorType,
                            types.MethodDescriptorType, types.GetSetDescriptorType,
                            types.MemberDescriptorType, torch._ops.OpOverload,
                            torch._ops.OpOverloadPacket)):
            self.emit("builtin", getattr(v, "__module__", None), getattr(v, "__qualname__",
                                                                           repr(v)))
        else:
            self._object(v)

    def _tensor(self, t: Any) -> None:
        self.emit("tensor", tuple(t.shape), str(t.dtype), str(t.device), t.requires_grad,
                  type(t).__name__)
        if id(t) in self.inputs or isinstance(t, torch_api.FakeTensor) or t.device.type == "meta":
            return
        if t.numel() > _MAX_CONST:
            # Baked into a graph it is refused (see _check_constants); not
            # baked, its value does not matter.
            return
        self.emit("values", t.detach().cpu().reshape(-1).tolist())

    def _function(self, f: types.FunctionType) -> None:
        mod = getattr(f, "__module__", None)
        if _is_library(mod):
            self.emit("libfn", _library(mod), mod, f.__qualname__)
            return
        self.emit("fn", mod, f.__qualname__)
        _code_digest(f.__code__, self.h)
        self.walk(f.__defaults__)
        self.walk(f.__kwdefaults__)
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                val = cell.cell_contents
            except ValueError:
                self.emit("cell", name, "<empty>")
                continue
            self.emit("cell", name)
            self.walk(val)
        names: set = set()
        _code_names(f.__code__, names)
        g = f.__globals__
        for n in sorted(names):
            if n in g:
                self.emit("global", n)
                self.walk(g[n], names)

    def _class(self, c: type) -> None:
        mod = getattr(c, "__module__", None)
        if _is_library(mod):
            self.emit("libclass", _library(mod), mod, c.__qualname__)
            return
        self.emit("class", mod, c.__qualname__)
        for base in c.__mro__[1:]:
            self.walk(base)
        for n, x in c.__dict__.items():
            if n in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                continue
            self.emit("member", n)
            self.walk(x)

    def _object(self, o: object) -> None:
        import dataclasses


        t = type(o)
        self.walk(t)
        if type(o).__module__ == "numpy" and hasattr(o, "dtype") and hasattr(o, "tobytes"):
            size = getattr(o, "size", 0)
            self.emit("ndarray", getattr(o, "shape", ()), str(o.dtype),
                      hashlib.sha256(o.tobytes()).hexdigest() if size <= _MAX_CONST else size)
            return
        lib = _library(t.__module__)
        if lib is not None and (
                (lib[0] in sys.stdlib_module_names and not (
                    t.__module__ in ("argparse", "types") or dataclasses.is_dataclass(o)))
                or lib[0] in ("torch_tpu", "jax", "jaxlib")):
            # A standard-library object (a logger, a lock, a file) or one of
            # the runtime's (a compiled step, a JAX device): not state a
            # traced step reads. (Other libraries' objects - torch modules, a
            # transformers config - are walked for their data.)
            self.emit("opaque")
            return
        try:
            d = vars(o)
        except TypeError:
            d = None
        if d is not None:
            self.emit("obj", len(d))
            for k in sorted(d, key=str):
                if k in _IGNORED_ATTRS:
                    continue
                self.emit("attr", k)
                self.walk(d[k])
            return
        slots = [s for c in type(o).__mro__ for s in getattr(c, "__slots__", ())]
        if slots:
            self.emit("slots")
            for s in slots:
                self.emit("attr", s)
                self.walk(getattr(o, s, "<unset>"))
            return
        r = repr(o)
        self.emit("repr", "opaque" if " at 0x" in r else r)


def step_key(fn: Any, modules: list, optimizers: list, options: dict | None, inputs: list,
             local_key: tuple) -> str:
    """The store key of one traced step; raises Unkeyable."""
    import torch

    local = repr(local_key)
    if " at 0x" in local:
        raise Unkeyable("the step's signature holds objects without a stable description")
    w = _Walker({id(t) for t in inputs if isinstance(t, torch.Tensor)})
    w.emit("format", FORMAT, local, repr(sorted((options or {}).items(), key=str)),
           get_matmul_precision(), str(torch.get_default_dtype()),
           torch.are_deterministic_algorithms_enabled())
    w.walk(fn)
    w.walk(list(modules))
    w.walk(list(optimizers))
    return f"step:{getattr(fn, '__qualname__', '?')}:{w.h.hexdigest()}"


# -- the graph as JSON ---------------------------------------------------------------


def _enc(v: Any, index: dict) -> Any:
    import torch

    if isinstance(v, torch.fx.Node):
        return {"n": index[v]}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"f": v.hex() if math.isfinite(v) else repr(v)}
    if isinstance(v, (list, tuple)):
        return {"l" if isinstance(v, list) else "t": [_enc(x, index) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"d": {k: _enc(x, index) for k, x in v.items()}}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.memory_format):
        return {"mf": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    raise Unkeyable(f"graph argument of type {type(v).__name__}")


def _dec(v: Any, nodes: list) -> Any:
    import torch

    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "n":
        return nodes[x]
    if tag == "f":
        return float(x) if x in ("inf", "-inf", "nan") else float.fromhex(x)
    if tag == "l":
        return [_dec(y, nodes) for y in x]
    if tag == "t":
        return tuple(_dec(y, nodes) for y in x)
    if tag == "d":
        return {k: _dec(y, nodes) for k, y in x.items()}
    if tag in ("dtype", "mf", "layout"):
        val = getattr(torch, x)
        if not isinstance(val, (torch.dtype, torch.memory_format, torch.layout)):
            raise ValueError(f"not a torch {tag}: {x}")
        return val
    if tag == "device":
        return torch.device(x)
    raise ValueError(f"unknown tag {tag!r}")


def _target_name(t: Any) -> str:
    import torch

    if isinstance(t, torch._ops.OpOverload):
        return f"op:{t.name()}"
    if t is operator.getitem:
        return "operator.getitem"
    raise Unkeyable(f"graph target {t!r}")


def _resolve_target(name: str) -> Any:
    import torch

    if name == "operator.getitem":
        return operator.getitem
    if not name.startswith("op:"):
        raise ValueError(f"unknown target {name!r}")
    qual = name[3:]
    ns, rest = qual.split("::", 1)
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), op)
    return getattr(packet, overload or "default")


def _enc_val(v: Any) -> Any:
    import torch

    if isinstance(v, torch.Tensor):
        if any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
            raise Unkeyable("symbolic shapes")
        return {"T": [list(v.shape), list(v.stride()), int(v.storage_offset()),
                      str(v.dtype).removeprefix("torch."), str(v.device), v.requires_grad]}
    if isinstance(v, (list, tuple)):
        return {"l": [_enc_val(x) for x in v]}
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return {"f": v.hex() if math.isfinite(v) else repr(v)}
    raise Unkeyable(f"node value of type {type(v).__name__}")


def _dec_val(v: Any, mode: Any) -> Any:
    import torch

    if not isinstance(v, dict):
        return v
    if "T" in v:
        shape, stride, offset, dtype, device, rg = v["T"]
        dt = getattr(torch, dtype)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"not a dtype: {dtype}")
        # A meta tensor wrapped directly (what FakeTensorMode makes of a
        # factory call, without its dispatch: 10 us instead of 0.1-10 ms).
        meta = torch.empty_strided(shape, stride, dtype=dt, device="meta")
        if offset:
            meta = meta.as_strided(shape, stride, offset)
        t = torch_api.FakeTensor(mode, meta, torch.device(device))
        if rg:
            t.requires_grad_(True)
        return t
    if "l" in v:
        return [_dec_val(x, mode) for x in v["l"]]
    return _dec(v, [])


def encode(gm: Any, layout: dict, arg_pos: list, n_grads: int) -> dict:
    """The JSON form of a traced step; raises Unkeyable."""
    index: dict = {}
    nodes = []
    consts = {}
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        if n.op == "get_attr":
            consts[n.target] = _enc_const(getattr(gm, n.target, None), n.target)
        elif n.op not in ("placeholder", "call_function", "output"):
            raise Unkeyable(f"graph node {n.op}")
        target = n.target if n.op != "call_function" else _target_name(n.target)
        nodes.append({"op": n.op, "name": n.name, "target": target,
                      "args": _enc(n.args, index), "kwargs": _enc(n.kwargs, index),
                      "val": _enc_val(n.meta.get("val")) if n.op != "output" else None})
    n_out, spec = layout["out"]
    new_states = layout["new_states"]
    if not all(isinstance(k, str) for _, _, k in new_states):
        raise Unkeyable("optimizer state keys that are not strings")
    try:
        spec_text = torch_api.pytree.treespec_dumps(spec)
    except Exception as e:
        raise Unkeyable(f"output structure ({type(e).__name__})") from e
    return {"format": FORMAT, "nodes": nodes, "consts": consts, "code_sha256": _code_sha(gm),
            "out": [n_out, spec_text], "new_states": [list(k) for k in new_states],
            "arg_pos": list(arg_pos), "n_grads": n_grads}


def _enc_const(t: Any, name: str) -> list:
    """A tensor the trace captured (a torch.tensor(...) made inside the step):
    its bytes, when small; a large one (the step closed over a weight or a
    dataset) is not stored."""
    import torch

    if type(t) is not torch.Tensor or isinstance(t, torch_api.FakeTensor) or t.requires_grad:
        raise Unkeyable(f"graph constant {name} ({type(t).__name__})")
    if t.numel() > _MAX_CONST:
        raise Unkeyable(f"graph constant {name} of {t.numel()} elements")
    c = t.detach().cpu().contiguous()
    raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    return [list(c.shape), str(c.dtype).removeprefix("torch."), str(t.device), raw.hex()]


def _dec_const(v: list) -> Any:
    import torch

    shape, dtype, device, raw = v
    dt = getattr(torch, dtype)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a dtype: {dtype}")
    data = bytes.fromhex(raw)
    if not data:
        t = torch.empty(shape, dtype=dt)
    else:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape).clone()
    return t.to(device) if device != "cpu" else t


def _code_sha(gm: Any) -> str:
    return hashlib.sha256(gm.code.encode()).hexdigest()


def decode(entry: dict) -> tuple[Any, dict, list, int]:
    """(gm, layout, arg_pos, n_grads) from `encode`'s form; raises on anything odd."""
    import torch

    if entry.get("format") != FORMAT:
        raise ValueError("format")
    mode = torch_api.FakeTensorMode(allow_non_fake_inputs=True)
    graph = torch.fx.Graph()
    made: list = []
    for d in entry["nodes"]:
        op = d["op"]
        target = _resolve_target(d["target"]) if op == "call_function" else d["target"]
        n = graph.create_node(op, target, _dec(d["args"], made), _dec(d["kwargs"], made),
                              name=d["name"])
        if op != "output":
            n.meta["val"] = _dec_val(d["val"], mode)
        made.append(n)
    graph.lint()
    root = {name: _dec_const(v) for name, v in entry.get("consts", {}).items()}
    gm = torch.fx.GraphModule(root, graph)
    if _code_sha(gm) != entry["code_sha256"]:
        raise ValueError("the rebuilt graph differs from the traced one")
    n_out, spec_text = entry["out"]
    layout = {"out": (int(n_out), torch_api.pytree.treespec_loads(spec_text)),
              "new_states": [tuple(k) for k in entry["new_states"]]}
    return gm, layout, list(entry["arg_pos"]), int(entry["n_grads"])


# -- the store -------------------------------------------------------------------------


def load(key: str) -> tuple[Any, dict, list, int] | None:
    """The decoded entry under `key`, or None (a miss, or one warning and a miss)."""
    s = artifact_store()
    blob = s.get(key)   # trust, checksum and versions checked; bad entries warned about
    if blob is None:
        with _lock:
            STATS.misses += 1
        return None
    try:
        out = decode(json.loads(blob))
    except Exception as e:   # sound bytes we cannot rebuild here: trace instead
        reject(key, e)
        return None
    with _lock:
        STATS.hits += 1
    return out


def reject(key: str, e: BaseException, undo_hit: bool = False) -> None:
    """An entry that passed the store's checks but cannot be used here: one
    warning, removed (the trace that follows writes it again)."""
    with _lock:
        STATS.rejected += 1
        if undo_hit:
            STATS.hits -= 1
    _store.warn_once("step-load", f"ignored a stored compile_step graph "
                                  f"({type(e).__name__}: {e}); the step is traced again")
    artifact_store().remove(key)


def count_unkeyed() -> None:
    """Count a step that could not be keyed (traced, never stored); compile_step
    calls it when step_key fails."""
    with _lock:
        STATS.unkeyed += 1


def remember(key: str, gm: Any, layout: dict, arg_pos: list, n_grads: int) -> None:
    """Queue a traced step for writing at exit (the first step does not wait on it)."""
    global _atexit
    try:
        entry = encode(gm, layout, arg_pos, n_grads)
    except Exception:  # Unkeyable: a graph this form cannot describe (not stored)
        with _lock:
            STATS.unkeyed += 1
        return
    with _lock:
        _pending.append((key, entry))
        if not _atexit:
            atexit.register(_save_at_exit)
            _atexit = True


def save() -> int:
    """Write the steps traced in this process; their number (also run at exit)."""
    with _lock:
        todo = list(_pending)
        _pending.clear()
    s = artifact_store()
    n = 0
    for key, entry in todo:
        if s.put(key, json.dumps(entry, separators=(",", ":")).encode()):
            n += 1
    with _lock:
        STATS.writes += n
    return n


def _save_at_exit() -> None:
    try:
        save()
    except Exception:  # pragma: no cover - never fail the interpreter's exit
        pass
