"""torch_tpu.debug.fusions: an optimized program's fusions, named by the ATen ops they came from."""

import re

import pytest
import torch

import torch_tpu
import torch_tpu.debug as dbg
from torch_tpu.debug.fusion import FusionGraph, element_bits, fusions, parse, type_bytes
from torch_tpu.runtime import programs


def _ops(node):
    return {op.rsplit(".", 1)[0] if op.count(".") == 2 else op for op in node.aten_ops}


def _check_mermaid(text):
    lines = text.splitlines()
    assert re.match(r"^(graph|flowchart) (TD|TB|LR|RL|BT)$", lines[0]), lines[0]
    declared = set()
    for line in lines[1:]:
        m = re.match(r"^  (\w+)[\[(]", line)
        if m and "-->" not in line:
            declared.add(m.group(1))
    edges = [re.match(r"^  (\w+) -->\|\"[^\"]+\"\| (\w+)$", ln) for ln in lines if "-->" in ln]
    assert edges and all(edges), [ln for ln in lines if "-->" in ln]
    for e in edges:
        assert e.group(1) in declared and e.group(2) in declared, e.group(0)
    return declared, edges


def _check_edge_bytes(g: FusionGraph):
    for e in g.edges:
        assert e.shapes
        assert e.bytes == sum(type_bytes(s) for s in e.shapes), e
        assert e.bytes > 0


def test_fused_eager_program_lists_its_aten_ops():
    x = torch.randn(4, 8, device="tpu")
    y = torch.randn(4, 8, device="tpu")
    x.cpu(), y.cpu()
    dbg.clear_compile_log()
    with torch_tpu.fused():
        z = x.sin() * y + 1
    z.cpu()
    progs = dbg.last_programs(1, name="fused eager program")
    assert progs, [e.name for e in dbg.compile_log()]
    g = fusions(progs[-1])
    assert {"aten.sin", "aten.mul", "aten.add"} <= {o.rsplit(".", 1)[0] for o in g.aten_ops}
    # XLA fuses the elementwise chain into one loop kernel holding all three.
    fused = [n for n in g.kernels if {"aten.sin", "aten.mul", "aten.add"} <= _ops(n)]
    assert len(fused) == 1 and fused[0].is_fusion and fused[0].kind == "loop", str(g)
    _check_edge_bytes(g)
    # the two [4, 8] float32 inputs flow into it: 4 * 8 * 4 bytes each
    into = [e for e in g.edges if e.dst == fused[0].id and e.shapes == ("f32[4,8]",)]
    assert len(into) >= 2 and all(e.bytes == 4 * 8 * 4 for e in into)
    text = str(g)
    assert text.splitlines()[0].startswith("fused eager program: 1 kernels")
    assert "aten.sin" in text
    _check_mermaid(g.to_mermaid())


def test_compiled_matmul_relu():
    @torch.compile(backend="tpu")
    def f(a, w):
        return torch.relu(a @ w)

    a = torch.randn(4, 8, device="tpu")
    w = torch.randn(8, 16, device="tpu")
    f(a, w).cpu()
    prog = dbg.last_graphs(1)[0]
    g = fusions(prog)
    mm, relu = g.nodes_with("aten.mm"), g.nodes_with("aten.relu")
    assert mm and relu, str(g)
    assert {"aten.mm.default", "aten.relu.default"} <= set(g.aten_ops)
    _check_edge_bytes(g)
    if mm[0] is not relu[0]:  # the matmul's [4, 16] float32 result goes through memory
        e = next(e for e in g.edges if e.src == mm[0].id and e.dst == relu[0].id)
        assert e.bytes == 4 * 16 * 4 and e.shapes == ("f32[4,16]",)
        assert g.bytes_between_kernels() >= 4 * 16 * 4
    root = g.nodes[-1]
    assert root.kind == "root" and root.shape == "f32[4,16]"
    assert any(e.dst == root.id and e.bytes == 4 * 16 * 4 for e in g.edges)
    declared, _ = _check_mermaid(g.to_mermaid())
    assert declared == {n.id for n in g.nodes}


def test_fusions_of_a_function():
    """`fusions(fn, *args)` lowers the function (nothing runs) and names its ops."""
    x = torch.randn(8, 32, device="tpu")
    m = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.GELU()).to("tpu")
    g = fusions(m, x)
    assert {"aten.addmm", "aten.gelu"} <= {o.rsplit(".", 1)[0] for o in g.aten_ops}
    assert sum(n.kind == "parameter" for n in g.nodes) == 3  # x, weight, bias
    _check_edge_bytes(g)
    _check_mermaid(g.to_mermaid())
    # and from the text alone
    again = fusions(dbg.hlo(m, x, stage="optimized"))
    assert again.aten_ops == g.aten_ops


def test_strict_op_program_is_named_after_its_op(cache_dir):
    """(cache_dir and an empty in-memory tier: cos compiles here, whatever ran
    before in this process or filled the shared cache.)"""
    x = torch.randn(3, 5, device="tpu")
    programs.clear()
    dbg.clear_compile_log()
    (x.cos()).cpu()
    progs = dbg.last_programs(1, name="aten.cos.default")
    assert progs, [e.name for e in dbg.compile_log()]
    g = fusions(progs[-1])
    assert g.aten_ops == ("aten.cos.default",)


# A hand-written module in the format XLA prints: a multi-output fusion read
# through get-tuple-element, a bitcast, a custom call, a tuple root, bf16.
_HLO = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(bf16[8,16]{1,0})->(f32[8]{0}, bf16[8,16]{1,0})}

FileNames
1 "/x.py"

%fused_computation (param_0: bf16[8,16]) -> (f32[8], bf16[8,16]) {
  %param_0 = bf16[8,16]{1,0} parameter(0)
  %exp.0 = bf16[8,16]{1,0} exponential(%param_0), metadata={op_name="jit(step)/aten.exp.default/exp"}
  %convert.0 = f32[8,16]{1,0} convert(%exp.0), metadata={op_name="jit(step)/aten.sum.dim_IntList/convert_element_type"}
  %constant.0 = f32[] constant(0)
  %reduce.0 = f32[8]{0} reduce(%convert.0, %constant.0), dimensions={1}, to_apply=%add_comp, metadata={op_name="jit(step)/aten.sum.dim_IntList/reduce_sum"}
  ROOT %tuple.0 = (f32[8]{0}, bf16[8,16]{1,0}) tuple(%reduce.0, %exp.0)
}

%add_comp (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b), metadata={op_name="jit(step)/aten.sum.dim_IntList/add"}
}

ENTRY %main.3 (p0: bf16[8,16]) -> (f32[8], bf16[8,16]) {
  %p0 = bf16[8,16]{1,0} parameter(0), metadata={op_name="x"}
  %multi = (f32[8]{0}, bf16[8,16]{1,0}) fusion(%p0), kind=kInput, calls=%fused_computation, metadata={op_name="jit(step)/aten.exp.default/exp"}
  %gte.0 = f32[8]{0} get-tuple-element(%multi), index=0
  %gte.1 = bf16[8,16]{1,0} get-tuple-element(%multi), index=1
  %bc = bf16[128]{0} bitcast(%gte.1)
  %cc = bf16[128]{0} custom-call(%bc, %gte.0), custom_call_target="my_kernel", metadata={op_name="jit(step)/mylib.kernel.default/my_kernel"}
  %bc2 = bf16[8,16]{1,0} bitcast(%cc)
  ROOT %out = (f32[8]{0}, bf16[8,16]{1,0}) tuple(%gte.0, %bc2)
}
"""


def test_parse_handwritten_module():
    g = parse(_HLO)
    assert g.module == "jit_step"
    kinds = {n.name: n.kind for n in g.nodes}
    assert kinds == {"p0": "parameter", "multi": "input", "cc": "custom-call", "ROOT": "root"}
    multi = g.node("multi")
    assert multi.aten_ops == ("aten.exp.default", "aten.sum.dim_IntList")
    assert multi.computation == "fused_computation"
    assert g.node("cc").aten_ops == ("mylib.kernel.default",) and g.node("cc").detail == "my_kernel"
    edges = {(g.node(e.src).name, g.node(e.dst).name): e for e in g.edges}
    # both outputs of the multi-output fusion reach the custom call: 2*128 + 4*8 bytes
    assert edges[("multi", "cc")].bytes == 2 * 128 + 4 * 8
    assert edges[("p0", "multi")].bytes == 2 * 128
    assert edges[("multi", "ROOT")].bytes == 4 * 8
    assert edges[("cc", "ROOT")].bytes == 2 * 128
    assert g.bytes_between_kernels() == 2 * 128 + 4 * 8
    assert g.nodes_with("aten.sum") == [multi]
    _check_edge_bytes(g)
    _check_mermaid(g.to_mermaid())
    assert str(g).splitlines()[0].startswith("jit_step: 2 kernels")


def test_sizes_and_limits():
    assert element_bits("bf16") == 16 and element_bits("f8e4m3fn") == 8
    assert element_bits("s4") == 4 and element_bits("pred") == 8
    assert type_bytes("f32[4,8]{1,0}") == 128
    assert type_bytes("(f32[2], s64[])") == 16
    assert type_bytes("s4[3]") == 2 and type_bytes("f32[]") == 4
    g = parse(_HLO)
    declared, edges = _check_mermaid(g.to_mermaid(max_nodes=2))
    assert declared <= {"n0", "n1", "more"}
    with pytest.raises(ValueError, match="no HLO computation"):
        parse("not HLO")


def test_docs_render_mermaid():
    """The guide's static pages keep a notebook's mo.mermaid as Material's Mermaid markup."""
    mo = pytest.importorskip("marimo")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import build_docs

    text = parse(_HLO).to_mermaid()
    out = build_docs._static_html(f"<div>{mo.mermaid(text).text}</div>")
    m = re.search(r'<pre class="mermaid"><code>(.*)</code></pre>', out, flags=re.S)
    assert m and "marimo-" not in out
    import html

    assert html.unescape(m.group(1)) == text
