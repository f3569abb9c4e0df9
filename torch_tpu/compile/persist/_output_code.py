"""`TpuOutputCode`: a compiled tpu graph in the form AOTAutograd's bundled cache stores.

AOTAutograd bundles a graph compiler's result into its cache entry (and so
into a dynamo precompile package) only when the result is an `OutputCode`.
This wraps a `CompiledGraph`: what is pickled is the graph's FX module (with
its tensor metadata, through `torch.fx._graph_pickler.GraphPickler`) and how
the backend built it; a process that loads it rebuilds the `CompiledGraph`
on first call, and the graph tier then loads its executable from disk
without lowering it. Imported only when `torch_tpu.compile.persist.artifacts` is on
(it imports inductor's output_code module) or when pickle loads one.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

from torch.fx import GraphModule

from ..._compat import dynamo_api, torch_api
from ..._compat.dynamo_api import OutputCode  # (inductor's: see the docstring's last line)
from ..graph import CompiledGraph


class TpuOutputCode(OutputCode):
    """A `CompiledGraph` that AOTAutograd can bundle into its cache entry."""

    def __init__(self, graph: Any, frozen: dict | str) -> None:
        """`frozen`: `freeze(gm)` of the graph as AOTAutograd handed it over,
        taken before `CompiledGraph` rewrote it (effects.hoist moves
        linalg's error checks out of the graph, and a rebuilt graph must
        find them again); a string says why it could not be."""
        self._graph = graph
        self._boxed_call = True
        if isinstance(frozen, str):  # a graph GraphPickler cannot describe: runs, is not saved
            self._state: dict[str, Any] | None = None
            self._unpicklable = frozen
        else:
            self._state = {**frozen, "kind": graph.kind, "options": dict(graph.options),
                           "n_user_outputs": graph.n_user_outputs}

    @staticmethod
    def freeze(gm: GraphModule) -> dict | str:
        """The graph as bytes (and its node values as plain data where it is
        static), or why it cannot be: taken at once, since AOTAutograd copies
        and pickles the result later, in places (the lazy backward, under
        no_dispatch) where fake tensors cannot be described."""
        try:
            vals = _static_vals(gm)
            return {"gm": _pickler().dumps(gm, _WITHOUT_VALS if vals is not None else None),
                    "vals": vals}
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def pair_with(self, backward: TpuOutputCode) -> None:
        """Mark a forward graph and its backward: a process that loads them
        rebuilds the backward with the forward, at its first call, on the
        calling thread (the backward's own first call runs on autograd's
        device thread, where the same rebuild took 80-90 ms instead of 9)."""
        if self._state is not None and backward._state is not None:
            token = uuid.uuid4().hex
            self._state["pair"] = backward._state["pair"] = token  # (dicts shared with copies)

    def __call__(self, inputs: Any) -> Any:
        if self._graph is None:
            self._graph = _graph_of(self._state)  # (raises without a state)
            assert self._state is not None
            if self._state["kind"] == "forward" and "pair" in self._state:
                backward = _UNBUILT.pop(self._state["pair"], None)
                if backward is not None:
                    _graph_of(backward)
        return self._graph(inputs)

    def __getstate__(self):
        if self._state is None:
            # AOTAutograd catches this: the function's package is not saved.
            import pickle

            raise pickle.PicklingError(f"tpu graph not serializable ({self._unpicklable})")
        return {k: v for k, v in self._state.items() if k != _BUILT}

    def __setstate__(self, state):
        self._state = state
        self._graph = None  # rebuilt on first call, outside AOTAutograd's copies
        self._boxed_call = True
        if state.get("pair") is not None and state["kind"] == "backward":
            _UNBUILT[state["pair"]] = state

    def __deepcopy__(self, memo):
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    # OutputCode's interface: nothing to prepare, post-process or bundle.
    def prepare_for_serialization(self) -> None:
        pass

    def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
        pass

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


# A rebuilt graph is kept in its state dict, which AOTAutograd's copies of a
# TpuOutputCode share (see __deepcopy__), so it is rebuilt once.
_BUILT = "_torch_tpu_built"
# pair token -> state of a loaded backward not rebuilt yet (see pair_with)
_UNBUILT: dict[str, dict] = {}


def _graph_of(state: dict | None) -> CompiledGraph:
    """The `CompiledGraph` of an unpickled state, rebuilt on first use."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if state is None:  # only an unpickled graph is rebuilt, and pickling needs the state
        raise RuntimeError("torch_tpu: a tpu graph without its saved state cannot be rebuilt")
    graph = state.get(_BUILT)
    if graph is None:
        # loads() is typed as object; what was dumped is the graph's GraphModule.
        mode = torch_api.FakeTensorMode(shape_env=ShapeEnv())
        gm = cast(GraphModule, dynamo_api.GraphPickler.loads(state["gm"], mode))
        if state.get("vals") is not None:
            _restore_vals(gm, state["vals"], mode)
        gm.recompile()
        examples = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        graph = state[_BUILT] = CompiledGraph(gm, examples, state["kind"], state["options"],
                                              n_user_outputs=state["n_user_outputs"])
    return graph


# -- tpu tensors held by a graph ------------------------------------------------
#
# A graph can hold real tpu tensors: the constants dynamo lifts out of the traced
# code (`torch.tensor([1., 2.], device=x.device)` becomes `_tensor_constant0`).
# Pickle would save their storage through torch's legacy storage writer, which
# reads a tpu storage's memory by address (a tensor torch_tpu never made, with no
# device data): such graphs were not saved, with a warning ending "please report
# this". They are saved as host copies and put back on their device when loaded.


def _pickler() -> Any:
    """GraphPickler, with tpu tensors pickled as host copies."""
    global _TpuGraphPickler
    if _TpuGraphPickler is None:
        class Pickler(dynamo_api.GraphPickler):
            def reducer_override(self, obj: object) -> Any:
                if _is_real_tpu_tensor(obj):
                    return _tpu_tensor, _host_parts(obj)
                return super().reducer_override(obj)

        _TpuGraphPickler = Pickler
    return _TpuGraphPickler


_TpuGraphPickler: Any = None


def _is_real_tpu_tensor(obj: object) -> bool:
    import torch

    return (isinstance(obj, torch.Tensor) and not isinstance(obj, torch_api.FakeTensor)
            and type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type == "tpu")


def _host_parts(t: Any) -> tuple:
    """What `_tpu_tensor` rebuilds `t` from: a host copy (made outside the fake
    mode AOTAutograd may have active), its device, whether it is a Parameter and
    its requires_grad."""
    with torch_api.unset_fake_temporarily():
        host = t.detach().cpu()
    return host, str(t.device), type(t) is not type(host), bool(t.requires_grad)


def _tpu_tensor(host: Any, device: str, parameter: bool, requires_grad: bool) -> Any:
    """A tpu tensor back from `_host_parts`, on its device."""
    import torch

    with torch_api.unset_fake_temporarily():
        t = host.to(device)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


# -- node values in a compact form ----------------------------------------------

# GraphPickler describes each node's fake tensor in full (view chains,
# storages, symbolic sizes), and rebuilding ~50 of them was most of a warm
# process's first compiled step. A static graph's values need only shape,
# strides, offset, dtype, device and requires_grad (all the backend reads):
# those are saved beside the graph, which is pickled without them.


def _keep_meta(key: str) -> bool:
    return key not in ("val", "tensor_meta", "example_value") and \
        dynamo_api.node_metadata_key_filter_safe(key)  # (GraphPickler's default filter)


def _without_vals() -> Any:
    return dynamo_api.GraphPicklerOptions(node_metadata_key_filter=_keep_meta)


_WITHOUT_VALS = _without_vals()


def _describe(val: Any) -> Any:
    """A static value as plain data; raises TypeError for anything else."""
    import torch

    if val is None or isinstance(val, (bool, int, float)):  # (SymInt/SymFloat are neither)
        return ("c", val)
    if isinstance(val, torch.Tensor):
        if val.is_sparse or val.layout != torch.strided or type(val).__name__ not in (
                "FakeTensor", "Tensor"):
            raise TypeError("not a plain strided tensor")
        shape, stride = tuple(val.shape), tuple(val.stride())
        if not all(type(d) is int for d in shape + stride):
            raise TypeError("symbolic")
        return ("t", shape, stride, int(val.storage_offset()), val.dtype, str(val.device),
                bool(val.requires_grad))
    if isinstance(val, (list, tuple)):
        return ("l" if isinstance(val, list) else "u", [_describe(v) for v in val])
    raise TypeError(type(val).__name__)


def _static_vals(gm: GraphModule) -> list | None:
    """Each node's "val" as plain data, or None (then GraphPickler keeps them)."""
    try:
        return [_describe(n.meta.get("val")) for n in gm.graph.nodes]
    except TypeError:
        return None


def _make(desc: Any, mode: Any) -> Any:
    """A fake tensor from its description: a meta tensor of that layout,
    wrapped as fake (no dispatch through the modes active at the first call,
    which cost a millisecond a tensor)."""
    import torch

    kind = desc[0]
    if kind == "c":
        return desc[1]
    if kind in ("l", "u"):
        items = [_make(d, mode) for d in desc[1]]
        return items if kind == "l" else tuple(items)
    _, shape, stride, offset, dtype, device, requires_grad = desc
    extent = offset if 0 in shape else \
        offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    with torch_api.disable_current_modes():
        meta = torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
        if requires_grad:
            meta.requires_grad_(True)
        return torch_api.FakeTensor(mode, meta, torch.device(device))


def _restore_vals(gm: GraphModule, vals: list, mode: Any) -> None:
    for node, desc in zip(gm.graph.nodes, vals):
        if desc != ("c", None):
            node.meta["val"] = _make(desc, mode)
