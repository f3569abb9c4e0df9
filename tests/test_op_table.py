"""The op table (torch_tpu/runtime/registry.py): one record per op with its
lowering, storage kernel, graph-mode rule and padding rule, each with the
module:line that registered it; the old per-kind tables are views of it."""

import importlib
import inspect

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.debug import op_table
from torch_tpu.runtime import registry

aten = torch.ops.aten


@pytest.fixture(scope="module")
def loaded():
    op_table.describe_op(aten.add.Tensor)  # loads the op families and compile's rules
    from torch_tpu.compile import graph_ops, padding
    from torch_tpu.ops import core
    return core, graph_ops, padding


def _source_line(source: str) -> str:
    module, line = source.rsplit(":", 1)
    lines = inspect.getsource(importlib.import_module(module)).splitlines()
    return lines[int(line) - 1]


def test_cat_has_a_lowering_a_kernel_and_a_padding_rule(loaded):
    core, graph_ops, padding = loaded
    e = op_table.describe_op("aten.cat.default")
    assert e.op is aten.cat.default
    assert e is registry.entry(aten.cat.default)
    assert e.lowering is registry.LOWERINGS[aten.cat.default]
    assert e.lowering.fn.__name__ == "cat"
    assert e.kernel is core.KERNELS[aten.cat.default]  # the argument check before its runner
    assert e.padding is padding.RULES[aten.cat.default]
    assert e.padding.__name__ == "_cat_rule"
    assert e.graph is None
    assert set(e.sources) == {"lowering", "kernel", "padding"}
    assert e.sources["lowering"].startswith("torch_tpu.ops.shape:")
    assert "@lower(aten.cat.default)" in _source_line(e.sources["lowering"])
    assert e.sources["kernel"].startswith("torch_tpu.ops.shape:")
    assert "KERNELS" in _source_line(e.sources["kernel"])
    assert e.sources["padding"].startswith("torch_tpu.compile.padding:")
    assert "@padding_rule(aten.cat.default)" in _source_line(e.sources["padding"])


def test_graph_override_and_storage_kernel(loaded):
    core, graph_ops, padding = loaded
    full = op_table.describe_op(aten.full.default)
    assert full.graph is graph_ops.GRAPH_OPS[aten.full.default]
    assert full.sources["graph"].startswith("torch_tpu.compile.graph_ops:")
    assert "@graph_op(aten.full.default" in _source_line(full.sources["graph"])
    # A view: a storage kernel (PyTorch's CPU metadata kernel), no lowering,
    # value semantics in graphs, and a padding rule.
    view = op_table.describe_op("aten::view.default")
    assert view.lowering is None and aten.view.default not in registry.LOWERINGS
    assert view.kernel is core.KERNELS[aten.view.default]
    assert view.sources["kernel"].startswith("torch_tpu.ops.core:")
    assert view.graph is graph_ops.GRAPH_OPS[aten.view.default]
    assert view.padding is padding.RULES[aten.view.default]
    assert list(view.fields()) == ["kernel", "graph", "padding"]
    # The decorator's own kind of kernel: @kernel in ops/core.py.
    set_ = op_table.describe_op(aten.set_.source_Storage_storage_offset)
    assert set_.kernel.__name__ == "set_storage_offset"
    assert "@kernel(aten.set_.source_Storage_storage_offset)" in _source_line(set_.sources["kernel"])


def test_views_are_the_table(loaded):
    for name, view in (("lowering", registry.LOWERINGS), ("kernel", registry.KERNELS),
                       ("graph", registry.GRAPH_OPS), ("padding", registry.PADDING_RULES)):
        having = {op for op, e in registry.OPS.items() if getattr(e, name) is not None}
        assert having == set(view) and len(view) == len(having) > 0
        for op in list(view)[:50]:
            assert getattr(registry.OPS[op], name) is view[op]
    assert len(registry.LOWERINGS) > 700
    core, graph_ops, padding = loaded
    assert core.KERNELS is registry.KERNELS
    assert graph_ops.GRAPH_OPS is registry.GRAPH_OPS
    assert padding.RULES is registry.PADDING_RULES


def test_duplicate_registration_raises(loaded):
    before = dict(registry.entry(aten.cat.default).sources)

    def fn(*a, **k):
        raise AssertionError("never called")

    with pytest.raises(RuntimeError, match="two lowerings registered for aten.cat.default"):
        registry.lower(aten.cat.default)(fn)
    with pytest.raises(RuntimeError, match="two kernels registered for aten.cat.default"):
        registry.kernel(aten.cat.default)(fn)
    with pytest.raises(RuntimeError, match="two kernels registered for aten.view.default"):
        registry.KERNELS[aten.view.default] = fn
    with pytest.raises(RuntimeError, match="two graph ops registered for aten.full.default"):
        registry.graph_op(aten.full.default)(fn)
    with pytest.raises(RuntimeError, match=r"two padding rules registered for aten.cat.default "
                                           r"\(the first at torch_tpu.compile.padding:\d+\)"):
        registry.padding_rule(aten.cat.default)(fn)
    e = registry.entry(aten.cat.default)
    assert e.lowering.fn is not fn and e.kernel is not fn and e.padding is not fn
    assert e.sources == before  # a refused registration changes nothing


def test_register_replace_unregister():
    op = object()  # a key no op uses
    view = registry.FieldView("padding")
    try:
        registry.padding_rule(op)(len)
        e = registry.entry(op)
        assert e.padding is len and view[op] is len
        assert e.sources["padding"] == f"{__name__}:{inspect.currentframe().f_lineno - 3}"
        with pytest.raises(RuntimeError, match="two padding rules"):
            view[op] = abs
        view.replace(op, abs)  # a rule wrapping the one before it
        assert e.padding is abs and view[op] is abs
        view.setdefault(op, len)  # present: unchanged
        assert view[op] is abs
    finally:
        del view[op]
    assert registry.entry(op) is None and op not in view


def test_cli_prints_each_field_with_its_source(capsys):
    assert op_table.main(["aten.cat.default", "aten.add.Tensor"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "aten.cat.default"
    fields = {ln.split()[0]: ln for ln in lines[1:5]}
    assert "torch_tpu.ops.shape.cat" in fields["lowering"]
    assert "torch_tpu.ops.shape:" in fields["lowering"]
    assert fields["graph"].split() == ["graph", "-"]
    assert "_cat_rule" in fields["padding"] and "torch_tpu.compile.padding:" in fields["padding"]
    assert "aten.add.Tensor" in lines
    assert op_table.main(["aten.no_such_op.default"]) == 1
