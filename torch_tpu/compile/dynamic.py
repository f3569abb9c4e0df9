"""Dynamic shapes: the policy for graphs whose sizes change between calls.

XLA compiles for static shapes. A graph captured with symbolic sizes (dynamo
does this by itself after it sees a size change, or for dims marked with
`torch._dynamo.mark_dynamic`, or with `torch.compile(dynamic=True)`) is run
by one of two policies, chosen with ``torch.compile(..., options={"dynamic":
...})`` or ``TORCH_TPU_DYNAMIC``:

``"bucket"`` (default)
    Every symbolic size `v` is rounded up to a bucket `b` (the next power of
    two, at least 8, or the sizes listed in ``options["buckets"]`` /
    ``TORCH_TPU_BUCKETS="64,128,512"``). Inputs are padded to the bucket, the
    graph runs at the bucket size with `v` as a runtime input, and the
    padding is masked out of every reduction, softmax, matmul contraction
    and loss (padding.py), so results equal the unpadded ones. Outputs are
    views of the real part (no copy). One executable per bucket: a sweep of
    sequence lengths 1..N compiles about log2(N) times per graph instead of
    N. (Each new input shape still needs one tiny padding program, and
    dynamo keeps sizes 0 and 1 as separate graphs.)

    A graph whose padding cannot be masked exactly (a convolution or a
    BatchNorm over the dynamic dim, a slice that cuts it, a size used as a
    number) falls back to ``"exact"``, with one warning naming the reason.

``"exact"``
    One executable per distinct input shape, each compiled once and kept in
    both tiers of the compile cache. At most ``max_specializations`` (default
    64, ``TORCH_TPU_MAX_SPECIALIZATIONS``) are kept per graph; past that the
    least recently used is dropped (one warning): the number of programs in
    memory stays bounded, but new shapes keep compiling - bucket your inputs.

A symbolic `CompiledGraph` (compile/graph.py) owns one `Policy`, which keeps
that graph's executables and what it learned about its sizes; the policy
reads the graph's `GraphSpec` (compile/graph_spec.py) and calls back into
the graph only through the `build` and `execute` it is given per call.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..runtime import rng as tpu_random
from ..runtime import executor, programs
from ..runtime import storage as st
from ..runtime.switches import switch_value
from . import padding
from .graph_key import precision_token, specialization
from .graph_spec import GraphSpec
from .lowering import SymEnv
from .outputs import wrap_outputs
from .padding import PadHook, PadUnsafe


class _CallUnsafe(Exception):
    """This call's inputs cannot be padded (the graph may still pad others)."""


def _env_buckets():
    text = switch_value("TORCH_TPU_BUCKETS")
    if not text:
        return None
    return sorted(int(x) for x in text.replace(";", ",").split(",") if x.strip())


class Policy:
    """How one symbolic graph runs, and what it has compiled and seen."""

    def __init__(self, mode="bucket", buckets=None, max_specializations=64):
        if mode not in ("bucket", "exact"):
            raise ValueError(f"dynamic shape policy must be 'bucket' or 'exact', not {mode!r}")
        self.mode = mode
        self.buckets = sorted(int(b) for b in buckets) if buckets else None
        self.max_specializations = int(max_specializations)
        # specialization key (exact) or bucketed key -> entry, least recently used first
        self.executables: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self.pad_ok: bool | None = None  # False once padding to buckets proved unsafe
        self.pad_plan: tuple | None = None  # see _plan
        self.seen_sizes: dict[Any, set[int]] = {}  # symbol -> values seen (changing: padded)
        self.warned_cap = False

    @classmethod
    def from_options(cls, options):
        mode = options.get("dynamic") or switch_value("TORCH_TPU_DYNAMIC")
        buckets = options.get("buckets") or _env_buckets()
        cap = options.get("max_specializations") or switch_value("TORCH_TPU_MAX_SPECIALIZATIONS")
        return cls(mode, buckets, int(cap))

    # -- entry -------------------------------------------------------------

    def run(self, spec: GraphSpec, args: list, ints: list[int], consts: list,
            build: Callable[..., Any], execute: Callable[..., list]) -> list:
        """Run graph `spec` on `args` (its int inputs `ints`, its constants
        `consts`): padded to buckets where it can be, else at exact shapes
        through `build(arrays, ints, consts, key)` (the graph's entry for one
        specialization) and `execute(entry, args, arrays)` (its results)."""
        if self.mode == "bucket" and self.pad_ok is not False:
            try:
                return self._run_padded(spec, args, consts)
            except _CallUnsafe:
                pass
            except PadUnsafe as e:
                self.pad_ok = False
                warnings.warn(
                    f"torch_tpu: a {spec.kind} graph with dynamic shapes cannot be padded "
                    f"to buckets ({e}); it compiles once per distinct shape instead",
                    stacklevel=4)
        return self._run_exact(spec, args, ints, consts, build, execute)

    # -- exact shapes ------------------------------------------------------

    def _run_exact(self, spec, args, ints, consts, build, execute):
        arrays = read_inputs(spec, args)
        key = specialization(spec, arrays, ints)
        exes = self.executables
        entry = exes.get(key)
        if entry is None:
            entry = exes[key] = build(arrays, ints, consts, key)
            if len(exes) > self.max_specializations:
                exes.pop(next(iter(exes)))
                if not self.warned_cap:
                    self.warned_cap = True
                    warnings.warn(
                        f"torch_tpu: a {spec.kind} graph was compiled for more than "
                        f"{self.max_specializations} input shapes; pad or bucket the inputs "
                        "(see torch_tpu.compile.dynamic)", stacklevel=4)
        else:
            exes.move_to_end(key)
        return execute(entry, args, arrays)

    # -- buckets -----------------------------------------------------------

    def _plan(self, spec):
        """Which placeholder carries which symbol (once per graph)."""
        plan = self.pad_plan
        if plan is not None:
            return plan
        symbols = []
        int_syms = []      # (position, symbol) of SymInt placeholders that are one symbol
        # (position, dim, symbol) of tensor dims that are one symbol
        tensor_dims: list[tuple[int, int, Any]] = []
        for pos, n in enumerate(spec.program.placeholders):
            val = n.meta.get("val")
            if isinstance(val, torch.SymInt):
                expr = val.node.expr
                for s in expr.free_symbols:
                    if s not in symbols:
                        symbols.append(s)
                if expr.is_Symbol:
                    int_syms.append((pos, expr))
            elif isinstance(val, torch.Tensor):
                for d, size in enumerate(val.shape):
                    if isinstance(size, torch.SymInt):
                        expr = size.node.expr
                        for s in expr.free_symbols:
                            if s not in symbols:
                                symbols.append(s)
                        if expr.is_Symbol:
                            tensor_dims.append((pos, d, expr))
        symbols.sort(key=str)
        plan = self.pad_plan = (symbols, int_syms, tensor_dims)
        return plan

    def _run_padded(self, spec, args, consts):
        symbols, int_syms, tensor_dims = self._plan(spec)
        program = spec.program
        # 1. the real size of each symbol
        true = {}
        for pos, sym in int_syms:
            true[sym] = int(args[pos])
        seen: dict[Any, int] = {}  # symbol -> the smallest size given for it
        for pos, d, sym in tensor_dims:
            t = args[pos]
            if not isinstance(t, torch.Tensor) or registered_spec(t) is not None:
                continue
            seen[sym] = min(seen.get(sym, 1 << 62), int(t.shape[d]))
        for sym, v in seen.items():
            true.setdefault(sym, v)
        if any(s not in true for s in symbols):
            raise PadUnsafe("a dynamic size is not given by any input")
        # Only sizes seen to change are padded; the others (a hidden size
        # under dynamic=True, say) stay exact and part of the key.
        history = self.seen_sizes
        for s in symbols:
            history.setdefault(s, set()).add(true[s])
        varying = [s for s in symbols if len(history[s]) > 1]
        if not varying:
            raise _CallUnsafe()
        buckets = {s: padding.next_bucket(true[s], self.buckets) for s in varying}
        exact = {s: true[s] for s in symbols if s not in buckets}
        true_env, pad_env = SymEnv(), SymEnv()
        true_env.values.update(true)
        pad_env.values.update(exact)
        pad_env.values.update(buckets)
        # 2. inputs at bucket size
        arrays, specs = [], []
        for pos in spec.tensor_pos:
            t = args[pos]
            val = program.placeholders[pos].meta["val"]
            padded_shape = tuple(pad_env.int(s) for s in val.shape)
            true_shape = tuple(true_env.int(s) for s in val.shape)
            reg = registered_spec(t)
            if reg is not None and tuple(reg[1]) == padded_shape and \
                    tuple(t.shape) == padded_shape:
                arrays.append(st.data_of(t).array)
                specs.append(reg[0])
                continue
            try:
                pspec = padding.meta_spec(val, buckets, exact)
            except PadUnsafe:  # merged dims: only readable when produced padded
                raise _CallUnsafe() from None
            shape = tuple(t.shape)
            if shape == padded_shape:
                arr = _value(t, spec.device)
            elif shape == true_shape:
                if t.device.type == "tpu" and padding.is_padded_prefix(t, padded_shape):
                    arr = st.data_of(t).array
                else:
                    arr = padding.pad_to(_value(t, spec.device), padded_shape)
            else:
                raise _CallUnsafe()
            arrays.append(arr)
            specs.append(pspec)
        ints = [pad_env.int(program.placeholders[p].meta["val"]) for p in spec.int_pos]
        key = ("bucket", precision_token(), spec.level(),
               tuple((str(s), buckets[s]) for s in varying),
               tuple(sorted((str(s), v) for s, v in exact.items())),
               tuple((a.shape, str(a.dtype)) for a in arrays), tuple(map(_spec_key, specs)))
        entry = self.executables.get(key)
        if entry is None:
            entry = self.executables[key] = self._build_padded(
                spec, arrays, ints, consts, specs, buckets, exact, varying, key)
        compiled, out_specs = entry
        sizes = np.asarray([true[s] for s in varying], np.int32)
        rng = None
        if program.uses_rng:
            rng = tpu_random.next_key(spec.device)
        outs, muts = compiled(arrays, consts, rng, sizes)
        nodes = spec.output_nodes

        def array(i, out_spec):
            arr = outs[out_spec[1]]
            t = st.wrap(arr, spec.device, out_spec[2])
            pspec = out_specs[out_spec[1]]
            if padding.spec_masked(pspec):
                if _simple(pspec):
                    t = padding.true_view(
                        t, tuple(true_env.int(s) for s in nodes[i].meta["val"].shape))
                else:  # saved for the backward graph, which reads it padded
                    padding.SPECS[st.data_of(t)] = (pspec, tuple(arr.shape), dict(true))
            return t

        # ("input_view" outputs come from static graphs only.)
        return wrap_outputs(spec, args, muts, array,
                            lambda i: true_env.int(nodes[i].meta["val"]))

    def _build_padded(self, spec, arrays, ints, consts, specs, buckets, exact, symbols, key):
        program = spec.program
        placeholders = program.placeholders
        sym_index = {s: i for i, s in enumerate(symbols)}
        holder = {}

        def fn(arrays, consts, rng, sizes):
            inputs = [None] * len(spec.inputs)
            hook = PadHook(program, buckets, sizes, sym_index, exact)
            for p, a, pspec in zip(spec.tensor_pos, arrays, specs):
                inputs[p] = a
                hook.set_input(placeholders[p], a, pspec)
            for p, v in zip(spec.int_pos, ints):
                inputs[p] = v
                val = placeholders[p].meta.get("val")
                if isinstance(val, torch.SymInt) and \
                        val.node.expr.free_symbols & set(buckets):
                    hook.tainted.add(placeholders[p])
            for p, s in enumerate(spec.inputs):
                if s.kind == "x":
                    inputs[p] = s.static
            syms = SymEnv()
            syms.values.update(exact)
            syms.values.update(buckets)
            outs, muts = program.trace(inputs, consts, rng if program.uses_rng else None,
                                       syms, hook=hook)
            out_pad = hook.output_specs()
            arr_outs, arr_specs = [], []
            for i, (out_spec, v) in enumerate(zip(spec.out_specs, outs)):
                if out_spec[0] != "array":
                    continue
                ps = out_pad[i]
                if padding.spec_masked(ps) and not _simple(ps) and i < spec.n_user_outputs:
                    raise PadUnsafe("an output merges a padded dimension with another")
                arr_outs.append(v)
                arr_specs.append(ps)
            holder["specs"] = arr_specs
            return arr_outs, muts

        rng = np.zeros((4,), np.uint32) if program.uses_rng else None
        sizes = np.zeros((len(symbols),), np.int32)
        try:
            compiled = programs.compile(spec.name + "_bucketed",
                                         (spec.fingerprint, spec.kind, key), fn,
                                         (list(arrays), list(consts), rng, sizes),
                                         opt_level=key[2])
        except PadUnsafe:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a lowering unhappy at bucket size
            raise PadUnsafe(f"{type(e).__name__}: {e}") from e
        return compiled, holder["specs"]


def _simple(spec: tuple[padding.DimSpec, ...]) -> bool:
    """Every padded dim is one padded factor: the real part is a prefix view."""
    return all(d is None or len(d) == 1 for d in spec)


def _spec_key(spec):
    if spec is None:
        return None
    return tuple(None if d is None else tuple((size, str(sym)) for size, sym in d)
                 for d in spec)


def registered_spec(t):
    """The padding spec registered for tpu tensor `t`'s value (None: none)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu" or not st.has_data(t):
        return None
    return padding.SPECS.get(st.data_of(t))


def read_inputs(spec: GraphSpec, args: list) -> list:
    """The jax values of graph `spec`'s tensor inputs among `args`."""
    arrays = [_value(args[p], spec.device) for p in spec.tensor_pos]
    if padding.SPECS:
        unpad_inputs(spec, args, arrays)
    return arrays


def unpad_inputs(spec: GraphSpec, args: list, arrays: list) -> None:
    """Saved activations a padded graph produced padded, for an unpadded graph:
    `arrays[i]` (tensor input i of graph `spec`) replaced by its real part."""
    for i, p in enumerate(spec.tensor_pos):
        reg = registered_spec(args[p])
        if reg is not None:
            arrays[i] = padding.unpad(arrays[i], reg[0], reg[2])


def _value(t, device):
    if t.device.type == "tpu":
        return executor.value(t)
    return st.from_host(t, device)
