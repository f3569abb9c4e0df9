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
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import numpy as np
import torch

from ..runtime import rng as tpu_random
from ..runtime import executor, programs
from ..runtime import storage as st
from ..runtime.switches import switch_value
from . import padding
from .graph_key import precision_token
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
    def __init__(self, mode="bucket", buckets=None, max_specializations=64):
        if mode not in ("bucket", "exact"):
            raise ValueError(f"dynamic shape policy must be 'bucket' or 'exact', not {mode!r}")
        self.mode = mode
        self.buckets = sorted(int(b) for b in buckets) if buckets else None
        self.max_specializations = int(max_specializations)

    @classmethod
    def from_options(cls, options):
        mode = options.get("dynamic") or switch_value("TORCH_TPU_DYNAMIC")
        buckets = options.get("buckets") or _env_buckets()
        cap = options.get("max_specializations") or switch_value("TORCH_TPU_MAX_SPECIALIZATIONS")
        return cls(mode, buckets, int(cap))

    # -- entry -------------------------------------------------------------

    def run(self, graph, args, arrays, ints):
        if self.mode == "bucket" and graph.pad_ok is not False:
            try:
                return self._run_padded(graph, args)
            except _CallUnsafe:
                pass
            except PadUnsafe as e:
                graph.pad_ok = False
                warnings.warn(
                    f"torch_tpu: a {graph.kind} graph with dynamic shapes cannot be padded "
                    f"to buckets ({e}); it compiles once per distinct shape instead",
                    stacklevel=4)
        return self._run_exact(graph, args, arrays, ints)

    # -- exact shapes ------------------------------------------------------

    def _run_exact(self, graph, args, arrays, ints):
        if arrays is None:
            arrays = graph.read_inputs(args)
        key = graph.signature(arrays, ints)
        exes = graph.executables
        entry = exes.get(key)
        if entry is None:
            entry = exes[key] = graph._build(arrays, ints, graph.consts, key)
            if len(exes) > self.max_specializations:
                exes.pop(next(iter(exes)))
                if not graph.warned_cap:
                    graph.warned_cap = True
                    warnings.warn(
                        f"torch_tpu: a {graph.kind} graph was compiled for more than "
                        f"{self.max_specializations} input shapes; pad or bucket the inputs "
                        "(see torch_tpu.compile.dynamic)", stacklevel=4)
        elif isinstance(exes, collections.OrderedDict):
            exes.move_to_end(key)
        return graph._execute(entry, args, arrays)

    # -- buckets -----------------------------------------------------------

    def _plan(self, graph):
        """Which placeholder carries which symbol (once per graph)."""
        plan = graph.pad_plan
        if plan is not None:
            return plan
        symbols = []
        int_syms = []      # (position, symbol) of SymInt placeholders that are one symbol
        # (position, dim, symbol) of tensor dims that are one symbol
        tensor_dims: list[tuple[int, int, Any]] = []
        for pos, n in enumerate(graph.program.placeholders):
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
        plan = graph.pad_plan = (symbols, int_syms, tensor_dims)
        return plan

    def _run_padded(self, graph, args):
        symbols, int_syms, tensor_dims = self._plan(graph)
        program = graph.program
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
        history = graph.seen_sizes
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
        for pos in graph.tensor_pos:
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
                spec = padding.meta_spec(val, buckets, exact)
            except PadUnsafe:  # merged dims: only readable when produced padded
                raise _CallUnsafe() from None
            shape = tuple(t.shape)
            if shape == padded_shape:
                arr = _value(t, graph.device)
            elif shape == true_shape:
                if t.device.type == "tpu" and padding.is_padded_prefix(t, padded_shape):
                    arr = st.data_of(t).array
                else:
                    arr = padding.pad_to(_value(t, graph.device), padded_shape)
            else:
                raise _CallUnsafe()
            arrays.append(arr)
            specs.append(spec)
        ints = [pad_env.int(program.placeholders[p].meta["val"]) for p in graph.int_pos]
        key = ("bucket", precision_token(), graph.level(),
               tuple((str(s), buckets[s]) for s in varying),
               tuple(sorted((str(s), v) for s, v in exact.items())),
               tuple((a.shape, str(a.dtype)) for a in arrays), tuple(map(_spec_key, specs)))
        entry = graph.executables.get(key)
        if entry is None:
            entry = graph.executables[key] = self._build_padded(
                graph, arrays, ints, specs, buckets, exact, varying, key)
        compiled, out_specs = entry
        sizes = np.asarray([true[s] for s in varying], np.int32)
        rng = None
        if program.uses_rng:
            rng = tpu_random.next_key(graph.device)
        outs, muts = compiled(arrays, graph.consts, rng, sizes)
        nodes = graph.output_nodes

        def array(i, spec):
            arr = outs[spec[1]]
            t = st.wrap(arr, graph.device, spec[2])
            pspec = out_specs[spec[1]]
            if padding.spec_masked(pspec):
                if _simple(pspec):
                    t = padding.true_view(
                        t, tuple(true_env.int(s) for s in nodes[i].meta["val"].shape))
                else:  # saved for the backward graph, which reads it padded
                    padding.SPECS[st.data_of(t)] = (pspec, tuple(arr.shape), dict(true))
            return t

        # ("input_view" outputs come from static graphs only.)
        return wrap_outputs(graph, args, muts, array,
                            lambda i: true_env.int(nodes[i].meta["val"]))

    def _build_padded(self, graph, arrays, ints, specs, buckets, exact, symbols, key):
        program = graph.program
        placeholders = program.placeholders
        sym_index = {s: i for i, s in enumerate(symbols)}
        holder = {}

        def fn(arrays, consts, rng, sizes):
            inputs = [None] * len(graph.specs)
            hook = PadHook(program, buckets, sizes, sym_index, exact)
            for p, a, spec in zip(graph.tensor_pos, arrays, specs):
                inputs[p] = a
                hook.set_input(placeholders[p], a, spec)
            for p, v in zip(graph.int_pos, ints):
                inputs[p] = v
                val = placeholders[p].meta.get("val")
                if isinstance(val, torch.SymInt) and \
                        val.node.expr.free_symbols & set(buckets):
                    hook.tainted.add(placeholders[p])
            for p, s in enumerate(graph.specs):
                if s.kind == "x":
                    inputs[p] = s.static
            syms = SymEnv()
            syms.values.update(exact)
            syms.values.update(buckets)
            outs, muts = program.trace(inputs, consts, rng if program.uses_rng else None,
                                       syms, hook=hook)
            out_pad = hook.output_specs()
            arr_outs, arr_specs = [], []
            for i, (spec, v) in enumerate(zip(graph.out_specs, outs)):
                if spec[0] != "array":
                    continue
                ps = out_pad[i]
                if padding.spec_masked(ps) and not _simple(ps) and i < graph.n_user_outputs:
                    raise PadUnsafe("an output merges a padded dimension with another")
                arr_outs.append(v)
                arr_specs.append(ps)
            holder["specs"] = arr_specs
            return arr_outs, muts

        rng = np.zeros((4,), np.uint32) if program.uses_rng else None
        sizes = np.zeros((len(symbols),), np.int32)
        try:
            compiled = programs.compile(graph.name + "_bucketed",
                                         (graph.fingerprint, graph.kind, key), fn,
                                         (list(arrays), list(graph.consts), rng, sizes),
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
    """The padding spec registered for tpu tensor `t`'s value (None: none);
    compile.graph reads the specs of a graph's padded inputs with it."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu" or not st.has_data(t):
        return None
    return padding.SPECS.get(st.data_of(t))


def _value(t, device):
    if t.device.type == "tpu":
        return executor.value(t)
    return st.from_host(t, device)
