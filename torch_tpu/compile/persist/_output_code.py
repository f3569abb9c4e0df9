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

from typing import Any, cast

from torch._inductor.output_code import OutputCode
from torch.fx import GraphModule
from ..graph import CompiledGraph


class TpuOutputCode(OutputCode):
    """A `CompiledGraph` that AOTAutograd can bundle into its cache entry."""

    def __init__(self, graph):
        from torch.fx._graph_pickler import GraphPickler

        self._graph = graph
        self._boxed_call = True
        # Serialized now: AOTAutograd copies and pickles the result later, in
        # places (the lazy backward, under no_dispatch) where fake tensors
        # cannot be described.
        try:
            self._state: dict[str, Any] | None = {
                "gm": GraphPickler.dumps(graph.gm), "kind": graph.kind,
                "options": dict(graph.options), "n_user_outputs": graph.n_user_outputs}
        except Exception as e:  # a graph GraphPickler cannot describe: runs, is not saved
            self._state = None
            self._unpicklable = f"{type(e).__name__}: {e}"

    def __call__(self, inputs: Any) -> Any:
        if self._graph is None:
            self._rebuild()
        return self._graph(inputs)

    def _rebuild(self) -> None:
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        s = self._state
        if s is None:  # only an unpickled graph is rebuilt, and pickling needs the state
            raise RuntimeError("torch_tpu: a tpu graph without its saved state cannot be rebuilt")
        # loads() is typed as object; what was dumped is the graph's GraphModule.
        gm = cast(GraphModule, GraphPickler.loads(s["gm"], FakeTensorMode(shape_env=ShapeEnv())))
        gm.recompile()
        examples = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        self._graph = CompiledGraph(gm, examples, s["kind"], s["options"],
                                    n_user_outputs=s["n_user_outputs"])

    def __getstate__(self):
        if self._state is None:
            # AOTAutograd catches this: the function's package is not saved.
            import pickle

            raise pickle.PicklingError(f"tpu graph not serializable ({self._unpicklable})")
        return self._state

    def __setstate__(self, state):
        self._state = state
        self._graph = None  # rebuilt on first call, outside AOTAutograd's copies
        self._boxed_call = True

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
