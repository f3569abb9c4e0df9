"""PyTorch's own compile artifacts (dynamo precompile packages) in the cache directory.

On by default (``TORCH_TPU_PRECOMPILE=0`` turns it off; no disk tier, no
packages). A process that compiled a function with
``torch.compile(backend="tpu")`` leaves, in ``<cache dir>/torch-v1/``, the
dynamo package of each compiled function (its guards, transformed bytecode
and, bundled by AOTAutograd, the forward/backward graphs). A later process
that compiles the same function loads the package at ``torch.compile(...)``
time: it skips dynamo's tracing and AOTAutograd, and the graph tier
(`torch_tpu.cache.graphs`) loads each graph's executable without lowering
it. This is PyTorch's "caching precompile"
(``torch._dynamo.config.caching_precompile``) with its storage replaced by
this module's, scoped to tpu compiles, and with the guards kept. Packages
are written when a frame's compile ends (and at exit): a marimo kernel ends
with ``os._exit``, which runs no atexit handler.

Notebook cells. marimo compiles a cell to a file named after the kernel's
process id, in no module: such a function's package is keyed by the
notebook and cell id instead, and the source of every cell the trace went
through (which dynamo, checking module sources only, leaves unchecked) is
digested into the guards, so an edited cell makes the graph stale, never
wrong (_cell_sources).

Trust model. These artifacts are pickles: loading one runs code chosen by
whoever wrote it. They are therefore only read from a directory that this
user controls, the rule ssh applies to ``~/.ssh``: the cache directory and
its ``torch-v1`` subdirectory must be owned by this user (or root) and not
writable by group or others, and so must each entry file; each entry carries
a SHA-256 of its payload in its header, checked before unpickling, and the
versions it was written by (torch, Python, JAX, the hash of torch_tpu's
sources). A directory that fails the check is used without these artifacts
(one warning naming the reason; the executable tiers, which hold no pickle,
apply their own check). A corrupted, truncated or stale entry (another
torch/JAX/torch_tpu) is ignored with one warning, and the function is traced
and compiled as in a cold process. Writers replace entries atomically, so
processes warming one directory at once all succeed.

Guards (PyTorch 2.13). PyTorch's precompile drops from the *live* guards
every guard it cannot serialize, identity guards included, so a compiled
function called with another function, or calling a global the user
rebound, would run the first graph. Here every guard stays live; an identity
guard on an object a pickle can name (a module-level function or class, a
builtin, an enum member, a module) is serialized with the object's name and
a fingerprint of its code, and a graph whose guard names an object that is
different in the loading process (same name, other code) never runs there
(_serialize_guards). A frame with any other unserializable guard (a lambda,
an instance matched by identity) is not packaged: it is traced in every
process, as without precompile.

Scope. PyTorch's switch is process-wide; here it is on only while a tpu
compile wraps its function and compiles its frames (_scope_to_tpu_compiles),
so inductor and other backends in the same process compile as without
torch_tpu. A compiled ``optimizer.step`` is never packaged by PyTorch (its
graph holds the parameters by address): it is traced in every process. The
patches in _patch mend what PyTorch 2.13 gets wrong when packaging this
backend's frames. See docs/troubleshooting.md.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import hashlib
import inspect
import linecache
import logging
import os
import pickle
import platform
import re
import sys
import threading
import types
import uuid
from typing import Any, NoReturn

from ..._compat import Patch, apply, dynamo_api
from ...cache import disk_store
from ...cache import store as _store
from ...cache.trust import TrustedDir
from ...cache.graphs import source_fingerprint
from ...runtime.switches import switch_on

MAGIC = b"TTPUPK01"
SUFFIX = ".tpk"
SUBDIR = "torch-v1"

_lock = threading.Lock()
_saving = threading.RLock()  # one save at a time (after a compile, at exit)
_local = threading.local()
STATE = {"installed": False}  # read by the backend
_saved: dict = {}   # key -> sha256 of what this process last wrote


class _Stats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.hits = 0      # packages loaded (dynamo and AOTAutograd skipped)
        self.misses = 0    # lookups that found nothing usable
        self.writes = 0    # packages written
        self.rejected = 0  # entries ignored: bad, stale or untrusted


STATS = _Stats()


def enabled() -> bool:
    """Is TORCH_TPU_PRECOMPILE on (the default) and the disk tier configured?"""
    return switch_on("TORCH_TPU_PRECOMPILE") and _store.configured_dir() is not None


def stats() -> dict:
    on = STATE["installed"] and artifact_store().usable
    return {"enabled": on, "hits": STATS.hits, "misses": STATS.misses,
            "writes": STATS.writes, "rejected": STATS.rejected}


# -- the store -------------------------------------------------------------------


def _environment() -> dict:
    """What an entry must have been written by to be loaded here."""
    import jax
    import torch

    return {"torch": torch.__version__, "python": platform.python_version(),
            "jax": jax.__version__, "torch_tpu_source": source_fingerprint(),
            "format": 1}


class ArtifactStore:
    """Checksummed pickle payloads under ``<root>/torch-v1``, read only if trusted."""

    def __init__(self, root: str | None):
        self.root = root
        self.path = os.path.join(root, SUBDIR) if root else None
        self.problem: str | None = None if root else "no cache directory"
        self.writable = False
        self._env: dict | None = None
        self._dir: TrustedDir | None = None
        if root:
            self._check(root)

    def _check(self, root: str) -> None:
        """The trust check of every tier (`torch_tpu.cache.trust`): each directory
        from ``/`` to ``torch-v1`` owned by this user or root and not writable
        by others, no link in the tier's place; the directory is then held
        open and every entry is read through it. A read-only one serves what
        it holds."""
        d, problem = TrustedDir.open(root, SUBDIR, create=True)
        self._dir, self.problem = d, problem
        self.writable = d is not None and d.writable()
        if problem is not None:
            _store.warn_once(f"artifacts:{self.path}",
                             f"not using PyTorch compile artifacts in {self.root!r} "
                             f"({problem}); torch.compile and compile_step trace "
                             "every function again")

    def _checked(self) -> TrustedDir | None:
        """The held directory, checked again if its path now leads elsewhere."""
        d = self._dir
        if d is not None and d.moved() and self.root:
            self._check(self.root)  # a replacement is used only if it passes
            d = self._dir
        return d

    @property
    def usable(self) -> bool:
        return self.problem is None

    def environment(self) -> dict:
        if self._env is None:
            self._env = _environment()
        return self._env

    def file_for(self, key: str) -> str:
        if self.path is None:
            raise RuntimeError("torch_tpu: no artifact directory (no cache directory)")
        return os.path.join(self.path, hashlib.sha256(key.encode()).hexdigest() + SUFFIX)

    def get(self, key: str) -> bytes | None:
        """The payload stored under `key` if it is sound and trusted, else None."""
        d = self._checked() if self.usable else None
        if d is None:
            return None
        fname = self.file_for(key)
        # Relative to the held directory, no link followed, owner and mode checked.
        blob, problem = d.read(os.path.basename(fname))
        if blob is None:
            if problem is not None:
                self._reject(fname, problem)
            return None
        payload, problem = self._decode(blob, key)
        if problem is not None:
            self._reject(fname, problem)
            return None
        return payload

    def _decode(self, blob: bytes, key: str) -> tuple[bytes | None, str | None]:
        return _store.decode_entry(blob, key, self.environment(), magic=MAGIC,
                                   what="artifact", of="function", stale="stale: ")

    def _reject(self, fname: str, problem: str) -> None:
        with _lock:
            STATS.rejected += 1
        _store.warn_once("artifact-bad", f"ignored the PyTorch compile artifact "
                                         f"{os.path.basename(fname)} ({problem}); the function "
                                         "is traced and compiled again")
        if not problem.startswith(("owned by", "writable by", "cannot read")):
            self._drop(fname)

    def remove(self, key: str) -> None:
        """Drop `key`'s entry (one that cannot be used here)."""
        self._drop(self.file_for(key))

    def _drop(self, fname: str) -> None:
        """Remove an entry through the held directory (no path walked again)."""
        if self.writable and self._dir is not None:
            self._dir.remove(os.path.basename(fname))

    def put(self, key: str, payload: bytes) -> bool:
        d = self._checked() if self.usable else None
        if not (d is not None and self.writable):
            return False
        try:
            _store.write_atomic(self.file_for(key),
                                _store.encode_entry(key, self.environment(), payload,
                                                    magic=MAGIC), d)
        except OSError as e:
            _store.warn_once("artifact-write", f"cannot write PyTorch compile artifacts in "
                                               f"{self.root!r} ({e.strerror or e})")
            self.writable = False
            return False
        return True


_STORE: ArtifactStore | None = None


def artifact_store() -> ArtifactStore:
    """The store in the disk tier's local directory (checked once per directory)."""
    global _STORE
    root = disk_store().root if disk_store().path is not None else None
    if _STORE is None or _STORE.root != root:
        _STORE = ArtifactStore(root)
    return _STORE


# -- dynamo's package cache, on this store -----------------------------------------


def _is_optimizer_step(fn: object) -> bool:
    """Compiled optimizer steps are never packaged by PyTorch 2.13 (their graph
    holds parameters by address) and reinstalling one clashes: not loaded."""
    import torch

    return isinstance(getattr(fn, "__self__", None), torch.optim.Optimizer)


def _tpu_backend(callback: object) -> bool:
    """Is torch_tpu's backend the one under dynamo's wrappers of `callback`
    (or named by it, as in ``backend="tpu"``)?"""
    if isinstance(callback, str):
        callback = dynamo_api.COMPILER_FNS.get(callback)
    for _ in range(16):
        inner = getattr(callback, "_torchdynamo_orig_backend", None) or \
            getattr(callback, "compiler_fn", None)
        if inner is None or inner is callback:
            break
        callback = inner
    return _in_packages(getattr(callback, "__module__", None), ("torch_tpu",))


def _package_key(source_id: str, code: Any) -> str:
    """The store key of a function's package: dynamo's id (qualified name and
    first line) plus the function's file and bytecode, so that another script
    with a function of the same name at the same line is not mistaken for it
    (dynamo also checks the sources it inlined). A notebook cell's file is
    named as the next kernel names it (_portable_filename)."""
    h = hashlib.sha256()
    for part in (_portable_filename(code.co_filename), code.co_qualname,
                 str(code.co_firstlineno),
                 " ".join(code.co_names)):
        h.update(part.encode("utf-8", "replace") + b"\0")
    h.update(code.co_code)
    return f"dynamo:{source_id}:{h.hexdigest()}"


# -- code compiled from notebook cells ----------------------------------------------

# marimo compiles each cell to a file in a directory named after the kernel's
# process id (``/tmp/marimo_<pid>/__marimo__cell_<id>_.py``), with the source
# in linecache and no module holding it: each kernel names a cell anew, and
# dynamo, which checks only the sources it inlined from modules, checks none.
_CELL_FILE = re.compile(r"^(?P<dir>.*[/\\]marimo_)\d+(?P<cell>[/\\]__marimo__cell_[^/\\]+\.py)$")


def _portable_filename(filename: str) -> str:
    """A marimo cell's file as its notebook and cell id (what the next kernel
    on the same notebook shares); any other file as it is."""
    m = _CELL_FILE.match(filename)
    if m is None:
        return filename
    notebook = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return f"marimo:{notebook}:{m['cell'][1:]}"


def _here(filename: str) -> str:
    """The file this process compiled the same cell to (marimo names it by pid)."""
    m = _CELL_FILE.match(filename)
    return filename if m is None else f"{m['dir']}{os.getpid()}{m['cell']}"


def _source_digest(filename: str, firstlineno: int) -> str | None:
    """SHA-256 of the function or class at `firstlineno` of `filename` as
    linecache holds it (inspect's block rule), or None without its lines."""
    lines = linecache.getlines(filename)
    if not lines or not 0 < firstlineno <= len(lines):
        return None
    try:
        block = "".join(inspect.getblock(lines[firstlineno - 1:]))
    except Exception:
        return None
    return hashlib.sha256(block.encode("utf-8", "replace")).hexdigest()


def _cell_sources(output_graph: Any) -> set:
    """(file, first line, source digest) of each function a frame's trace went
    through that no module holds (a notebook cell's), so that editing the cell
    makes the graph stale as editing a module's source does. Generated code
    without source lines (a dataclass's ``__init__``) is left as dynamo leaves it."""
    traced = getattr(output_graph, "traced_code", None)
    if traced is None:
        context = dynamo_api.TracingContext.try_get()
        traced = context.traced_code if context is not None else ()
    found = set()
    for code in traced:
        if inspect.getmodule(code) is None:
            digest = _source_digest(code.co_filename, code.co_firstlineno)
            if digest is not None:
                found.add((code.co_filename, code.co_firstlineno, digest))
    return found


def _changed_cell(cells: list) -> str | None:
    """The first recorded cell source that differs in this process (or is absent)."""
    for filename, firstlineno, digest in cells:
        if _source_digest(_here(filename), firstlineno) != digest:
            return f"the source at line {firstlineno} of {_portable_filename(filename)}"
    return None


def _make_dynamo_cache():
    CompilePackage = dynamo_api.CompilePackage
    counters = dynamo_api.counters

    class TpuDynamoCache(dynamo_api.DiskDynamoCache):
        """dynamo's DynamoCache with entries in the trusted artifact store."""

        def __init__(self) -> None:
            super().__init__("")

        def path_prefix(self) -> str:
            return artifact_store().path or ""

        def clear(self) -> None:
            pass  # torch_tpu.cache.clear() empties the directory

        def write(self, cache_entry: Any, path: str) -> None:
            artifact_store().put(_package_key(path, cache_entry.dynamo.codes[0].python_code),
                                 pickle.dumps(cache_entry))

        def read(self, path: str) -> NoReturn:
            raise RuntimeError("torch_tpu's package store is read through load(fn)")

        def load(self, fn):
            # Called by dynamo's _TorchDynamoContext.__call__ (torch.compile,
            # torch._dynamo.explain, ...): only a tpu compile gets a tpu package.
            caller = sys._getframe(1).f_locals.get("self")
            if _is_optimizer_step(fn) or not _tpu_backend(getattr(caller, "callback", None)):
                return None
            try:
                key = _package_key(CompilePackage.source_id_from_fn(fn),
                                   dynamo_api.innermost_fn(fn).__code__)
                blob = artifact_store().get(key)
                if blob is None:
                    with _lock:
                        STATS.misses += 1
                    counters["dynamo_cache"]["dynamo_cache_miss"] += 1
                    return None
                entry = pickle.loads(blob)

                if any(code.python_module not in sys.modules for code in entry.dynamo.codes):
                    # A module run without an entry in sys.modules (exec'd
                    # source): the package cannot be installed into it.
                    with _lock:
                        STATS.misses += 1
                    return None
                for backend in entry.backends.values():
                    dynamo_api.PrecompileContext.record_artifact(backend)
            except Exception as e:  # an entry that cannot be loaded here: trace instead
                with _lock:
                    STATS.rejected += 1
                _store.warn_once("artifact-load", f"could not load a PyTorch compile "
                                                  f"artifact ({type(e).__name__}: {e}); the "
                                                  "function is traced and compiled again")
                return None
            with _lock:
                STATS.hits += 1
            counters["dynamo_cache"]["dynamo_cache_hit"] += 1
            return entry

    return TpuDynamoCache()


def save() -> int:
    """Write the packages of functions compiled in this process; their number.

    Called after each tpu frame is compiled (a notebook's kernel, marimo's,
    ends with ``os._exit``, which runs no atexit handler) and at exit;
    callable any time. Unchanged packages are not rewritten; one that still
    lacks a graph waits for a later call (at exit it is saved without it).
    """
    return _save(final=False)


def _save(final: bool) -> int:
    if not STATE["installed"]:
        return 0
    n = 0
    with _saving, _bypass_flags_kept() as marked:
        try:
            entries, _ = dynamo_api.PrecompileContext.create_cache_entries()
        except Exception as e:  # pragma: no cover - PyTorch could not assemble them
            _store.warn_once("artifact-save", f"could not assemble compile packages: {e}")
            return 0
        if not entries:
            return 0  # (no tpu compile: the store, which imports JAX, is not opened)
        s = artifact_store()
        if not (s.usable and s.writable):
            return 0
        incomplete = marked()
        for key, entry in entries.items():
            if not final and any(id(code) in incomplete for code in entry.dynamo.codes):
                continue  # a graph of it is still being compiled: saved when it is done
            if _save_entry(s, key, entry):
                n += 1
    return n


def _save_entry(s: ArtifactStore, key: str, entry: Any) -> bool:
    """Write one package unless it is not this backend's, cannot be loaded or
    is what this process last wrote under its key."""
    codes = entry.dynamo.codes
    if all(code.bypassed for code in codes) or \
            codes[0].python_module.startswith("torch.optim"):
        return False  # nothing to load (optimizer steps are never loaded)
    if not entry.backends or not all(_is_tpu_entry(getattr(b, "content", None))
                                     for b in entry.backends.values()):
        return False  # another backend's (inductor, explain): theirs to keep
    try:
        blob = pickle.dumps(entry)
    except Exception as e:
        _store.warn_once("artifact-pickle", f"a compile package could not be saved "
                                            f"({type(e).__name__}: {e})")
        return False
    digest = hashlib.sha256(blob).hexdigest()
    if _saved.get(key) == digest or not s.put(_package_key(key, codes[0].python_code), blob):
        return False
    _saved[key] = digest
    with _lock:
        STATS.writes += 1
    return True


@contextlib.contextmanager
def _bypass_flags_kept():
    """PyTorch's create_cache_entries marks bypassed, on the live package,
    each code whose graph is not recorded yet (one still compiling), and a
    code so marked records no graph afterwards: the flags are put back on
    leaving. Yields a function giving the ids of the codes it marked."""
    recorded = list(getattr(dynamo_api.PrecompileContext, "_dynamo_cache_entries", {}).values())
    codes = [code for entry in recorded for code in entry.codes]
    before = [code.bypassed for code in codes]
    try:
        yield lambda: {id(c) for c, was in zip(codes, before) if c.bypassed and not was}
    finally:
        for code, was in zip(codes, before):
            code.bypassed = was


def _save_after_compile() -> None:
    """save(), never failing the user's call."""
    try:
        save()
    except Exception as e:  # pragma: no cover - a package that cannot be written
        _store.warn_once("artifact-save", f"could not save compile packages "
                                          f"({type(e).__name__}: {e})")


def _save_at_exit() -> None:
    try:
        _save(final=True)
    except Exception:  # pragma: no cover - never fail the interpreter's exit
        pass


# -- patches that make caching precompile usable for this backend -------------------


class _DropNoise(logging.Filter):
    """PyTorch logs one warning per guard it drops and per frame it cannot
    package; with precompile on by choice these are expected."""

    def filter(self, record):
        msg = str(record.msg)
        return not ("is dropped with caching_precompile" in msg
                    or msg.startswith("Detected a package bypass")
                    or msg == "Backend not found")


@contextlib.contextmanager
def aot_context():
    """Around the backend's AOTAutograd call: AOTAutograd's own local cache
    (plain pickles in inductor's temporary directory) is neither read nor
    written for tpu graphs; their results travel in the packages instead."""
    prev = getattr(_local, "tpu", False)
    _local.tpu = True
    try:
        yield
    finally:
        _local.tpu = prev


FEATURE = "warm start of torch.compile (PyTorch's precompile packages)"
_WHY_213 = "PyTorch 2.13's caching precompile, mended for this backend's frames"


def _init_manager(init):
    """1. A frame whose package is bypassed (a compiled optimizer step) leaves
    no serialized guards, which PyTorch 2.13 then asserts on: record an empty
    state for the bypassed entry (bypassed entries are never loaded)."""
    sig = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        # Off while the guards are built: PyTorch's precompile would drop
        # from the live guards every guard it cannot serialize (see
        # _serialize_guards for what is done with them here).
        with dynamo_api.dynamo_config.patch(caching_precompile=False):
            init(*bound.args, **bound.kwargs)
        if bound.arguments.get("save_guards") and self.guards_state is None:
            self.guards_state = b""

    return __init__


def _aot_lookup(lookup):
    """2. AOTAutograd's local cache: not for tpu graphs (see aot_context)."""
    def _lookup(*args, **kwargs):
        if getattr(_local, "tpu", False):
            return None
        return lookup(*args, **kwargs)

    return _lookup


def _aot_save(save_entry):
    def _save(key, entry, remote):
        if not _is_tpu_entry(entry):
            return save_entry(key, entry, remote)
        prev = getattr(_local, "no_write", False)
        _local.no_write = True
        try:
            return save_entry(key, entry, remote)
        finally:
            _local.no_write = prev

    return _save


def _aot_write(write):
    def _write(key, content):
        if getattr(_local, "no_write", False):
            return None
        return write(key, content)

    return _write


def _package_install(install):
    """3. A package that fails to install (a clash, a missing global) falls
    back to tracing: dynamo catches RuntimeError only."""
    def _install(self, backends):
        try:
            out = install(self, backends)
            _past_installed_names(self)
            return out
        except Exception as e:
            # Undo it, so that dynamo's fallback (a fresh package, traced
            # again) can initialize this one anew.
            with contextlib.suppress(Exception):
                _past_installed_names(self)
                self.uninstall()
            self._initialized = False
            self._codes = {}
            with _lock:
                STATS.rejected += 1
                STATS.hits = max(0, STATS.hits - 1)
            _store.warn_once("artifact-install", f"could not install a PyTorch compile "
                                                 f"package ({type(e).__name__}: {e}); the "
                                                 "function is traced and compiled again")
            raise RuntimeError(f"torch_tpu: cannot install a compile package: {e}") from e

    return _install


def _unpickle_tensor_grad(unpickle_tensor):
    """4. A tensor in a frame's locals is pickled with its `.grad`; a `.grad`
    no guard reads is pickled as PyTorch's `_Missing` placeholder, which its
    loader then assigns to the new tensor's `.grad` and fails ("assigned grad
    expected to be a Tensor or None"), so the package was not installed. No
    guard reads it: load it as None. (A classmethod of the same name: the
    pickles name it as an attribute of GuardsStatePickler.)"""
    def _unpickle_tensor(cls, meta_tensor, device, pytype, dispatch_keys_raw, grad):
        if isinstance(grad, dynamo_api.GuardMissing):
            grad = None
        return unpickle_tensor(meta_tensor, device, pytype, dispatch_keys_raw, grad)

    return _unpickle_tensor


def _code_context(code_context):
    """5. A frame whose code has no module (generated code, file "<string>":
    JAX's dataclass `__init__`s, run by a torch_tpu op after a graph break)
    cannot be named in a package, and PyTorch 2.13 raises PackageError out of
    the user's call for it. Such a frame gets an entry of its own that is
    bypassed and never saved: it is handled as without precompile."""
    @contextlib.contextmanager
    def _context(self, code):
        if code in self._codes or inspect.getmodule(code) is not None:
            with code_context(self, code):
                yield
            return
        self._current_entry = dynamo_api.DynamoCodeCacheEntry(
            python_code=None,  # never saved
            python_module="", function_names=[], guarded_codes=[], import_sources={},
            backend_ids=[], code_source=None, install_to_global=False, bypassed=True)
        try:
            yield
        finally:
            self._current_entry = None

    return _context


def _serialize(serialize):
    """6. Identity guards (a global function the frame calls, a module it
    reads, a function passed as an argument): serialized, where their object
    can be found again by name, with a fingerprint checked on load (see
    _serialize_guards, _load_guards_state and _guard_manager)."""
    def serialize_guards(self, builder, sorted_guards, output_graph):
        return _serialize_guards(serialize, self, builder, sorted_guards, output_graph)

    return serialize_guards


def _load_state(load_state):
    def load_guards_state(blob):
        return _load_guards_state(load_state, blob)

    return load_guards_state


def _guard_manager(load_manager):
    def load_guard_manager(guards_state, target_code, runtime_global_scope):
        manager = load_manager(guards_state, target_code, runtime_global_scope)
        stale = getattr(guards_state, "_torch_tpu_stale", None)
        if stale is not None:
            # Another object of that name now: this graph never runs here.
            manager.root.add_lambda_guard(
                lambda _: False, [f"torch_tpu: {stale} changed since it was compiled"], None)
        return manager

    return load_guard_manager


def _cache_key(cache_key):
    """7. AOTAutograd's cache key: its hash of the graph's inductor settings
    imports inductor's code generators (about a second, once a process), and
    a tpu graph is never looked up by it (see aot_context; it is found through
    the package). Only the check that the graph can be cached runs."""
    def autograd_cache_key(mod, example_inputs, config, *args, **kwargs):
        # (*args: compiler_config_extra; PyTorch 2.14 adds act_input_paths)
        if not getattr(_local, "tpu", False):
            return cache_key(mod, example_inputs, config, *args, **kwargs)
        gm = getattr(mod, "gm", mod)  # dynamo's GmWrapper or the module
        with dynamo_api.sanitize_gm_for_cache(gm):
            dynamo_api.check_cacheable(gm)
        return f"{dynamo_api.AOTAUTOGRAD_CACHE_PREFIX}tpu{uuid.uuid4().hex}", []

    return autograd_cache_key


# 8. Precompile for tpu compiles only (PyTorch's switch is process-wide).
# PyTorch 2.13 has one process-wide switch (``caching_precompile``), read
# when `torch.compile` wraps a function (make a package, load it), after each
# frame is compiled (record the package) and by AOTAutograd (bundle the
# graphs). Here the switch stays off; a tpu compile gets its package at wrap
# time and the switch is on only while that compile wraps its function and
# compiles its frames, so another backend in the same process (inductor,
# eager, `torch._dynamo.explain`) compiles as without torch_tpu.


def _scoped_optimize(optimize):
    """A tpu compile gets a package where precompile is usable."""
    dynamo_config = dynamo_api.dynamo_config

    def _optimize(rebuild_ctx, backend="inductor", **kwargs):
        if kwargs.get("package") is None and not dynamo_config.caching_precompile and \
                _tpu_backend(backend) and enabled() and artifact_store().usable:
            kwargs["package"] = dynamo_api.CompilePackage(fn=None, dynamo=None,
                                               ignore_inlined_sources=False)
        return optimize(rebuild_ctx, backend, **kwargs)

    return _optimize


def _scoped_wrap(wrap):
    """Precompile on while a tpu compile with a package wraps its function."""
    import torch

    dynamo_config = dynamo_api.dynamo_config

    def __call__(self, fn):
        if getattr(self, "_package", None) is None or dynamo_config.caching_precompile:
            return wrap(self, fn)
        target = dynamo_api.innermost_fn(fn.forward if isinstance(fn, torch.nn.Module) else fn)
        if not hasattr(target, "__code__"):
            # A builtin (`torch.compile(torch.linalg.inv)`): no code to
            # package, and PyTorch 2.13 fails making one. Compiled as
            # without precompile.
            _drop_package(self)
            return wrap(self, fn)
        with dynamo_config.patch(caching_precompile=True):
            return wrap(self, fn)

    return __call__


def _scoped_convert(convert):
    """Precompile on while a packaged tpu compile converts a frame; its
    package saved when the outermost conversion returns."""
    dynamo_config = dynamo_api.dynamo_config

    def convert_call(self, frame, cache_entry, hooks, frame_state, *, skip=0):
        if self._package is None or dynamo_config.caching_precompile:
            return convert(self, frame, cache_entry, hooks, frame_state, skip=skip + 1)
        with dynamo_config.patch(caching_precompile=True):
            result = convert(self, frame, cache_entry, hooks, frame_state, skip=skip + 1)
        _save_after_compile()  # the frame's package is recorded: written now, not at exit
        return result

    return convert_call


def patches() -> dict:
    """PyTorch 2.13's caching precompile, usable for this backend: its storage
    replaced by this module's (the trusted store), scoped to tpu compiles,
    identity guards kept; each target below is checked by torch_tpu._compat."""
    def p(target, make, why=_WHY_213):
        return Patch(target, FEATURE, why, make)

    guards = "torch._dynamo.guards:"
    aot = "torch._functorch._aot_autograd.autograd_cache:"
    return {FEATURE: [
        p(guards + "CheckFunctionManager.__init__", _init_manager),
        p(aot + "AOTAutogradCache._lookup", _aot_lookup),
        p(aot + "AOTAutogradCache.save", _aot_save),
        p(aot + "AOTAutogradCache._write_to_local_cache", _aot_write),
        p("torch._dynamo.package:CompilePackage.install", _package_install),
        p(guards + "GuardsStatePickler._unpickle_tensor", _unpickle_tensor_grad),
        p("torch._dynamo.package:CompilePackage.code_context", _code_context),
        p(guards + "CheckFunctionManager.serialize_guards", _serialize),
        p("torch._dynamo.package:load_guards_state", _load_state),
        p("torch._dynamo.package:load_guard_manager", _guard_manager),
        p(aot + "autograd_cache_key", _cache_key),
        p("torch._dynamo.eval_frame:_optimize", _scoped_optimize),
        p("torch._dynamo.eval_frame:_TorchDynamoContext.__call__", _scoped_wrap),
        p("torch._dynamo.convert_frame:ConvertFrameAssert.__call__", _scoped_convert),
        p("torch._dynamo.package:DynamoCache", lambda _cache: _make_dynamo_cache(),
          "the package cache's storage: entries in the trusted artifact store"),
    ]}


def _drop_package(context: Any) -> None:
    """Detach a tpu compile's package from its context and from the frame
    converters under it (dynamo's CatchErrors -> ConvertFrame -> ConvertFrameAssert)."""
    context._package = None
    obj = getattr(context, "callback", None)
    for _ in range(8):
        if obj is None:
            break
        if hasattr(obj, "_package"):
            obj._package = None
        obj = getattr(obj, "_inner_convert", None) or \
            getattr(obj, "_torchdynamo_orig_backend", None)


def _in_packages(module_name: object, packages: tuple) -> bool:
    return isinstance(module_name, str) and module_name.split(".", 1)[0] in packages


# -- identity guards in packages -------------------------------------------------------

# Guards that match an object by identity. PyTorch 2.13 refuses to serialize
# them (a frame holding one is not packaged: traced in every process), yet
# every `nn.Module.forward` that calls a module-level helper or reads a module
# holds them. An object a pickle names (a module-level function or class, a
# builtin, an enum member) is the same object in the next process if what
# bears that name there has the same code; a module is found by name.
_IDENTITY_GUARDS = frozenset(("ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH",
                              "CLOSURE_MATCH"))
_PINNED = b"TTPUPIN2"
_BY_NAME_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
                  types.WrapperDescriptorType, types.ClassMethodDescriptorType, type, enum.Enum)


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    for part in (code.co_qualname, *code.co_names, *code.co_varnames, *code.co_freevars,
                 *code.co_cellvars, f"{code.co_argcount}/{code.co_kwonlyargcount}/{code.co_flags}"):
        h.update(part.encode() + b"\0")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(_const_text(const).encode("utf-8", "replace") + b"\0")


def _const_text(const: object) -> str:
    """A constant as text that is the same in every process: a set's
    elements sorted (`x in {"a", "b"}`; string hashing, and so a frozenset's
    order, differs by process)."""
    if isinstance(const, frozenset):
        return "frozenset:{" + "|".join(sorted(_const_text(c) for c in const)) + "}"
    if isinstance(const, tuple):
        return "tuple:(" + "|".join(_const_text(c) for c in const) + ")"
    return f"{type(const).__qualname__}:{const!r}"


def _fingerprint(value: object) -> str:
    """What must hold for a guard on `value`'s identity, rebuilt in another
    process against the object of the same name, to mean the same: its kind
    and, for Python code, its bytecode (a class: its methods')."""
    h = hashlib.sha256(type(value).__qualname__.encode() + b"\0")
    if isinstance(value, types.FunctionType):
        _code_digest(value.__code__, h)
    elif isinstance(value, type):
        for name, attr in sorted(vars(value).items()):
            fn = getattr(attr, "__func__", attr)
            if isinstance(fn, types.FunctionType):
                h.update(name.encode() + b"\0")
                _code_digest(fn.__code__, h)
    return h.hexdigest()


def _by_name(value: object) -> bytes | None:
    """A pickle that names `value` (module and qualified name) if loading it
    gives back this very object; None for anything pickled by value."""
    if not isinstance(value, _BY_NAME_TYPES) or \
            "<locals>" in (getattr(value, "__qualname__", None) or ""):
        return None
    try:
        ref = pickle.dumps(value)
        return ref if pickle.loads(ref) is value else None
    except Exception:
        return None


def _serialize_guards(serialize: Any, manager: Any, builder: Any, sorted_guards: list,
                      output_graph: Any) -> bytes:
    """dynamo's serialize_guards, accepting identity guards on objects found
    by name; their names and fingerprints travel with the guards, and so do
    the digests of the notebook cells the trace went through (_cell_sources)."""
    pins = _identity_pins(manager, builder, sorted_guards, output_graph)
    if pins is None:  # dynamo refuses them (PackageError): the frame is not packaged
        return serialize(manager, builder, sorted_guards, output_graph)
    cells = _cell_sources(output_graph)
    with dynamo_api.serializable_guard_types(also=_IDENTITY_GUARDS):
        state = serialize(manager, builder, sorted_guards, output_graph)
    if not pins and not cells:
        return state
    return _PINNED + pickle.dumps((sorted(pins), sorted(cells), state))


def _identity_pins(manager: Any, builder: Any, sorted_guards: list,
                   output_graph: Any) -> set | None:
    """(by-name pickle, fingerprint) of each object an identity guard names,
    or None if a guard dynamo cannot serialize is on anything else."""
    unsupported = dynamo_api.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    pins = set()
    for guard in sorted_guards:
        kinds = {guard.create_fn_name(), *(guard.guard_types or ())}.intersection(unsupported)
        if not kinds:
            continue
        if not kinds <= _IDENTITY_GUARDS:
            return None
        try:
            value = builder.get(guard)
        except Exception:
            return None
        _keep_builtin(manager, guard.originating_source, output_graph)
        if inspect.ismodule(value):
            continue  # dynamo's pickler names modules; import finds the same one
        ref = _by_name(value)
        if ref is None:
            return None
        pins.add((ref, _fingerprint(value)))
    return pins


def _keep_builtin(manager: Any, source: Any, output_graph: Any) -> None:
    """dynamo saves only the builtins its BUILTIN_MATCH guards read; a class
    guard on one (``enumerate``) needs it in the package too."""
    builtins_name = getattr(output_graph, "name_of_builtins_dict_key_in_fglobals", None)
    if isinstance(source, dynamo_api.DictGetItemSource) and \
            isinstance(source.base, dynamo_api.GlobalSource) and \
            source.base.global_name == builtins_name and isinstance(source.index, str):
        manager.used_builtin_vars.add(source.index)


def _load_guards_state(load: Any, blob: bytes) -> Any:
    """dynamo's load_guards_state; guards whose objects changed (another
    function now bears the name) or whose notebook cells were edited are
    marked, so that their graph never runs."""
    if not blob.startswith(_PINNED):
        return load(blob)
    pins, cells, blob = pickle.loads(blob[len(_PINNED):])
    state = load(blob)
    stale = _changed_pin(pins) or _changed_cell(cells)
    if stale is not None:
        object.__setattr__(state, "_torch_tpu_stale", stale)
    return state


def _changed_pin(pins: list) -> str | None:
    """The name of the first pinned object that is another one here."""
    for ref, fingerprint in pins:
        try:
            value = pickle.loads(ref)
            same = _fingerprint(value) == fingerprint
        except Exception:
            value, same = None, False
        if not same:
            return str(getattr(value, "__qualname__", None) or "an object a guard names")
    return None


_NUMBERED = re.compile(r"^__.*_(\d{1,6})$")


def _past_installed_names(package: Any) -> None:
    """A loaded package puts the globals its cold process named into the
    frame's module (`__builtins_dict___0`, compiled functions); those names
    came from dynamo's process-wide counter, which starts again at 0 here, so
    a frame of the same module traced later in this process (one whose
    package was bypassed, or a new one) would pick an existing name and fail
    ("Name ... already exists in scope"). Move the counter past them."""
    modules = set(getattr(package, "_installed_globals", {}))
    for entry in getattr(package, "_codes", {}).values():
        mod = sys.modules.get(getattr(entry, "python_module", ""))
        if mod is not None:
            modules.add(mod)
    used = [int(m.group(1)) for mod in modules for name in list(vars(mod))
            if (m := _NUMBERED.match(name))]
    if used:
        dynamo_api.skip_unique_ids(max(used))


def _output_code() -> Any:
    """TpuOutputCode (imports torch._inductor's output code: only where
    precompile entries are read or written)."""
    from ._output_code import TpuOutputCode  # lazy: torch._inductor, for precompile only

    return TpuOutputCode


def _is_tpu_entry(entry: object) -> bool:
    TpuOutputCode = _output_code()
    fw = getattr(entry, "compiled_fw", None)
    return isinstance(getattr(fw, "result", None), TpuOutputCode)


def packaged(gm: object) -> bool:
    """Is dynamo packaging the frame of this graph? (It names the graph's
    backend id only then; a frame it bypassed, e.g. a compiled optimizer
    step, is compiled as without precompile, without AOTAutograd's key.)"""
    return STATE["installed"] and getattr(gm, "_backend_id", None) is not None


def serializable_compiler(compile_graph: Any, pending: list | None = None) -> Any:
    """`compile_graph` (gm, example_inputs) -> CompiledGraph, as the
    serializable compiler AOTAutograd bundles into packages. The forward
    and backward compilers of one frame share `pending`: a backward is
    paired with the forward before it (TpuOutputCode.pair_with), before
    AOTAutograd saves the two."""
    TpuOutputCode = _output_code()

    def compile_output_code(gm, example_inputs):
        frozen = TpuOutputCode.freeze(gm)  # before CompiledGraph rewrites gm
        graph = compile_graph(gm, example_inputs)
        code = TpuOutputCode(graph, frozen)
        if pending is not None:
            if graph.kind == "forward":
                pending[:] = [code]
            elif graph.kind == "backward" and pending:
                pending.pop().pair_with(code)
        return code

    return dynamo_api.SerializableAOTDispatchCompiler(TpuOutputCode, compile_output_code)


def install() -> bool:
    """Turn caching precompile on for tpu compiles, with this module's
    storage (when enabled() and every target is the code the patches were
    written for: torch_tpu._compat). The directory's trust check runs at the
    first tpu compile (it needs JAX's versions), not here."""
    if STATE["installed"]:
        return True
    if not enabled():
        return False
    if not apply(FEATURE, patches()[FEATURE]):
        return False
    for name in ("torch._dynamo.guards", "torch._dynamo.output_graph", "torch._dynamo.package"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    atexit.register(_save_at_exit)
    STATE["installed"] = True
    return True
