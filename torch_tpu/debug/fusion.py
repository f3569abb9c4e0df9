"""What XLA fused: an optimized program's fusions as a graph, named by ATen op.

    g = torch_tpu.debug.fusions(lambda a, b: (a.sin() * b + 1).relu(), x, y)
    print(g)                    # a table: one row per fusion, summary line first
    g.nodes[0].aten_ops         # ('aten.sin.default', 'aten.mul.Tensor', ...)
    mo.mermaid(g.to_mermaid())  # the graph, in a marimo notebook

The optimized HLO (`debug.hlo(..., stage="optimized")`) says what runs, but
as hundreds of lines of fused computations named by XLA (`%sine_add_fusion`).
Which of *my* ops did XLA put in one kernel, and how many bytes go through
memory between kernels, is what decides speed; this module answers it by
reading that text: every instruction of the entry computation that does work
(a fusion, a dot or convolution left unfused, a custom call, ...) is a node
listing the ATen ops it came from, and an edge between two nodes carries the
bytes of the array one writes and the other reads.

The ATen names come from the HLO metadata: the fused eager program
(`runtime.fused`) and the compiled-graph interpreter (`compile.lowering`)
trace each op under `jax.named_scope("aten.<op>.<overload>")`, so every HLO
instruction's `op_name` carries the op it was lowered from. Where no ATen
name is present (a strict-mode op's own program, a `jax_op`, a program
compiled by an older torch_tpu and loaded from the disk cache, whose key
ignores metadata), a node lists the JAX primitives instead (`.jax_ops`).

Parsing is plain Python over the HLO text, tolerant of what it does not know
(an unknown instruction is a node of its own opcode; an unknown element type
counts 0 bytes), so a new XLA's text degrades the view instead of breaking it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from .hlo import Program, lower

__all__ = ["FusionGraph", "FusionNode", "FusionEdge", "fusions", "parse"]


# --------------------------------------------------------------------------
# element types and shapes

_BITS = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "token": 0, "opaque": 0,
}

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_LAYOUT = re.compile(r"(\])\{[^{}]*\}")


def element_bits(dtype: str) -> int:
    """Bits of one element of HLO type `dtype` (`f32`, `bf16`, `f8e4m3fn`, ...); 0 if unknown."""
    if dtype in _BITS:
        return _BITS[dtype]
    m = re.match(r"[a-z]+?(\d+)", dtype)  # f8e4m3fn -> 8, f4e2m1fn -> 4
    return int(m.group(1)) if m else 0


def type_bytes(text: str) -> int:
    """Bytes of an HLO type: an array (`f32[4,8]{1,0}`) or a tuple of them."""
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=")
            if not d:
                continue
            if not d.isdigit():  # an unknown (dynamic) size
                n = 0
                break
            n *= int(d)
        total += (n * element_bits(dtype) + 7) // 8
    return total


def short_type(text: str) -> str:
    """An HLO type without its layouts and index comments: `f32[4,8]`."""
    text = re.sub(r"/\*[^*]*\*/", "", text)
    return _LAYOUT.sub(r"\1", text).strip()


# --------------------------------------------------------------------------
# the HLO text


@dataclass
class _Instr:
    name: str
    type: str
    opcode: str
    operands: list
    attrs: str
    op_name: str
    root: bool


@dataclass
class _Computation:
    name: str
    entry: bool
    instrs: list = field(default_factory=list)


_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations|"
                     r"called_computations)=\{?([^,}\s]+(?:,\s*[^,}\s]+)*)\}?")


def _balanced(text: str, i: int) -> int:
    """The index after the bracket group opening at text[i]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    in_str = False
    j = i
    while j < len(text):
        c = text[j]
        if in_str:
            if c == "\\":
                j += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
        j += 1
    return len(text)


def _parse_instr(line: str) -> _Instr | None:
    m = _INSTR_HEAD.match(line)
    if m is None:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        sp = rest.find(" ")
        end = sp if sp >= 0 else len(rest)
    type_text, rest = rest[:end], rest[end:].lstrip()
    om = re.match(r"([\w\-]+)\(", rest)
    if om is None:
        return None
    close = _balanced(rest, om.end() - 1)
    operand_text = rest[om.end():close - 1]
    attrs = rest[close:]
    name_m = _OP_NAME.search(attrs)
    return _Instr(name=m.group(2), type=type_text, opcode=om.group(1),
                  operands=_OPERAND.findall(operand_text), attrs=attrs,
                  op_name=name_m.group(1) if name_m else "", root=bool(m.group(1)))


def _parse_module(text: str) -> tuple[str, dict, str | None]:
    """(module name, {computation name: _Computation}, entry name)."""
    module = ""
    comps: dict = {}
    entry = None
    current = None
    for line in text.splitlines():
        if current is None:
            if line.startswith("HloModule"):
                parts = line.split()
                module = parts[1].rstrip(",") if len(parts) > 1 else ""
                continue
            m = _COMP_HEAD.match(line)
            if m:
                current = _Computation(m.group(2), bool(m.group(1)))
                comps[current.name] = current
                if current.entry:
                    entry = current.name
            continue
        if line.strip() == "}":
            current = None
            continue
        ins = _parse_instr(line)
        if ins is not None:
            current.instrs.append(ins)
    if entry is None and comps:  # no ENTRY marker: XLA prints the entry last
        entry = list(comps)[-1]
    return module, comps, entry


# --------------------------------------------------------------------------
# op names

# `aten.mul.Tensor`, `mylib.op.default`: namespace.op.overload
_OVERLOAD = re.compile(r"(?<![\w.])([A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*)(?![\w.(])")


def aten_op_of(op_name: str) -> str | None:
    """The (outermost) ATen op named in an HLO `op_name`, e.g.
    `jit(fused)/aten.sin.default/sin` -> `aten.sin.default`."""
    for part in op_name.split("/"):
        m = _OVERLOAD.search(part)
        if m:
            return m.group(1)
    return None


def _jax_op_of(op_name: str) -> str | None:
    """The JAX primitive an `op_name` ends with (`jit(fn)/aten.mul.Tensor/mul` -> `mul`)."""
    if not op_name:
        return None
    last = op_name.rsplit("/", 1)[-1]
    last = re.sub(r"^\w+\((.*)\)$", r"\1", last)  # transpose(jvp(mul)) -> jvp(mul) -> ...
    last = re.sub(r"^\w+\((.*)\)$", r"\1", last)
    if not last or last.startswith("jit(") or "[" in last:
        return None
    return last


def _unique(items: Iterable[Any]) -> tuple:
    seen: dict = {}
    for x in items:
        if x and x not in seen:
            seen[x] = None
    return tuple(seen)


# --------------------------------------------------------------------------
# the graph


@dataclass
class FusionNode:
    """One kernel of the program (or a parameter, or the program's result).

    kind: a fusion's XLA kind (`loop`, `input` (a reduction), `output` (fused
    into a dot's or convolution's output), `custom` (a library kernel such
    as XLA:CPU's dot fusions)), else the instruction's opcode (`dot`,
    `convolution`, `custom-call`, `while`, ...), `parameter`, or `root` for
    the program's result. aten_ops: the ATen ops the node computes, in
    program order; jax_ops: the JAX primitives (what `op_name` ends with;
    an instruction XLA added itself, such as a layout copy, by its opcode).
    """

    id: str
    name: str
    kind: str
    opcode: str
    shape: str
    bytes: int
    aten_ops: tuple = ()
    jax_ops: tuple = ()
    computation: str | None = None
    detail: str = ""

    @property
    def is_fusion(self) -> bool:
        return self.opcode == "fusion"

    @property
    def is_compute(self) -> bool:
        """A kernel: neither a parameter nor the program's result."""
        return self.kind not in ("parameter", "root")

    @property
    def ops(self) -> tuple:
        """The ATen ops, or the JAX primitives where no ATen name was recorded."""
        return self.aten_ops or self.jax_ops


@dataclass
class FusionEdge:
    """An array (or several) one node writes and another reads: `bytes` in all."""

    src: str
    dst: str
    bytes: int
    shapes: tuple = ()


class FusionGraph:
    """The fusions of one optimized XLA program: `.nodes`, `.edges`.

    str() is a table (summary line first); `to_mermaid()` is a flowchart for
    `mo.mermaid` or any Mermaid renderer; `.text` is the HLO it was read from.
    """

    def __init__(self, module: str, nodes: list, edges: list, text: str = "",
                 program: str | None = None):
        self.module = module
        self.program = program
        self.nodes: list[FusionNode] = nodes
        self.edges: list[FusionEdge] = edges
        self.text = text
        self._by_id = {n.id: n for n in nodes}

    def node(self, id_or_name: str) -> FusionNode:
        """A node by its id (`n3`) or its HLO instruction name."""
        if id_or_name in self._by_id:
            return self._by_id[id_or_name]
        for n in self.nodes:
            if n.name == id_or_name:
                return n
        raise KeyError(id_or_name)

    @property
    def kernels(self) -> list:
        """The nodes that do work (fusions and unfused ops), in program order."""
        return [n for n in self.nodes if n.is_compute]

    @property
    def fusions(self) -> list:
        return [n for n in self.nodes if n.is_fusion]

    @property
    def aten_ops(self) -> tuple:
        """Every ATen op named in the program, in program order."""
        return _unique(op for n in self.nodes for op in n.aten_ops)

    def nodes_with(self, aten_op: str) -> list:
        """The nodes computing `aten_op` (`aten.mul` matches every overload of it)."""
        return [n for n in self.nodes
                if any(op == aten_op or op.startswith(aten_op + ".") for op in n.aten_ops)]

    def bytes_between_kernels(self) -> int:
        """Bytes written by one kernel and read by another (through memory)."""
        return sum(e.bytes for e in self.edges
                   if self._by_id[e.src].is_compute and self._by_id[e.dst].is_compute)

    # -- views ---------------------------------------------------------------

    def summary(self) -> str:
        kinds: dict = {}
        for n in self.kernels:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        parts = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        n_params = sum(1 for n in self.nodes if n.kind == "parameter")
        name = self.program or self.module
        return (f"{name}: {len(self.kernels)} kernels ({parts or 'none'}), "
                f"{n_params} parameters, {_fmt_bytes(self.bytes_between_kernels())} "
                f"between kernels; ATen ops: {len(self.aten_ops)}")

    def __str__(self) -> str:
        rows = []
        ins: dict = {}
        for e in self.edges:
            ins[e.dst] = ins.get(e.dst, 0) + e.bytes
        for n in self.nodes:
            if n.kind == "parameter":
                continue
            ops = ", ".join(_short_op(o) for o in n.aten_ops) or (
                "(" + ", ".join(n.jax_ops) + ")" if n.jax_ops else "")
            rows.append((n.id, n.name, n.kind, _shown_shape(n.shape), _fmt_bytes(ins.get(n.id, 0)),
                         ops))
        head = ("id", "instruction", "kind", "result", "reads", "ATen ops (or JAX ops)")
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head[:-1])]
        lines = [self.summary(), ""]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
        lines.append(fmt.format(*head))
        lines.append(fmt.format(*("-" * w for w in widths), "-" * len(head[-1])))
        lines += [fmt.format(*r) for r in rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"FusionGraph({self.program or self.module!r}, {len(self.kernels)} kernels)"

    def to_mermaid(self, direction: str = "TD", max_nodes: int = 80) -> str:
        """A Mermaid flowchart: a box per kernel (its ATen ops), parameters
        and the result as rounded ends, edges labelled with bytes.

        Beyond `max_nodes` nodes the rest are left out (a note says how
        many); edges touching them go too, so every edge names a declared node.
        """
        lines = [f"flowchart {direction}"]
        shown = self.nodes[:max_nodes]
        ids = {n.id for n in shown}
        for n in shown:
            lines.append(f"  {n.id}{_mermaid_shape(n)}")
        for e in self.edges:
            if e.src in ids and e.dst in ids:
                lines.append(f'  {e.src} -->|"{_fmt_bytes(e.bytes)}"| {e.dst}')
        if len(self.nodes) > len(shown):
            lines.append(f'  more["... {len(self.nodes) - len(shown)} more nodes"]')
        lines.append("  classDef param fill:#eef,stroke:#99c")
        lines.append("  classDef unfused fill:#fee,stroke:#c99")
        params = [n.id for n in shown if n.kind in ("parameter", "root")]
        unfused = [n.id for n in shown if n.is_compute and not n.is_fusion]
        if params:
            lines.append(f"  class {','.join(params)} param")
        if unfused:
            lines.append(f"  class {','.join(unfused)} unfused")
        return "\n".join(lines)


def _shown_shape(shape: str, limit: int = 48) -> str:
    """A shape for a table cell: a long tuple as `(12 arrays: f32[8,16], ...)`."""
    if len(shape) <= limit:
        return shape
    arrays = [f"{d}[{dims}]" for d, dims in _ARRAY.findall(shape)]
    if len(arrays) > 1:
        return f"({len(arrays)} arrays: {arrays[0]}, ...)"
    return shape[:limit - 3] + "..."


def _short_op(op: str) -> str:
    """`aten.sin.default` -> `aten.sin`; other overloads kept (`aten.mul.Tensor`)."""
    return op[:-len(".default")] if op.endswith(".default") else op


def _fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - used after the loop: the unit it stopped at
        x /= 1024
        if x < 1024:
            break
    return f"{x:.1f} {unit}"


def _mermaid_text(s: str) -> str:
    return (s.replace("&", "&amp;").replace('"', "#quot;").replace("<", "&lt;")
            .replace(">", "&gt;"))


def _mermaid_shape(n: FusionNode) -> str:
    if n.kind == "parameter":
        return f'(["{_mermaid_text(n.name)}<br/>{_mermaid_text(_shown_shape(n.shape))}"])'
    if n.kind == "root":
        return f'(["result<br/>{_mermaid_text(_shown_shape(n.shape))}"])'
    ops = [_short_op(o) for o in n.aten_ops] or [f"({o})" for o in n.jax_ops]
    if len(ops) > 8:
        ops = ops[:8] + [f"... {len(ops) - 8} more"]
    title = f"{n.name} · {n.kind}"
    body = "<br/>".join(_mermaid_text(o) for o in ops)
    label = f"<b>{_mermaid_text(title)}</b>" + (f"<br/>{body}" if body else "") + (
        f"<br/><i>{_mermaid_text(_shown_shape(n.shape))}</i>")
    if n.is_fusion:
        return f'["{label}"]'
    return f'[["{label}"]]'


# --------------------------------------------------------------------------
# building the graph

# Entry instructions that move no data of their own: followed to their sources.
_PLUMBING = {"tuple", "get-tuple-element", "bitcast", "opt-barrier"}
# Sources that are not kernels: no node, no edge.
_NO_NODE = {"constant", "after-all", "partition-id", "replica-id"}
_FUSION_KINDS = {"kLoop": "loop", "kInput": "input", "kOutput": "output", "kCustom": "custom"}


def parse(text: str, program: str | None = None) -> FusionGraph:
    """The FusionGraph of an optimized HLO module's text.

    `program`: a name to show (a Program's name). When it is an ATen op
    (a strict-mode op's own program) and the text names none, every kernel
    is attributed to it.
    """
    module, comps, entry_name = _parse_module(text)
    if entry_name is None:
        raise ValueError("torch_tpu.debug.fusions: no HLO computation in the text "
                         "(expected the optimized HLO module, as debug.hlo(..., "
                         "stage='optimized') gives)")
    entry = comps[entry_name]
    memo: dict = {}

    def called(ins: _Instr) -> list:
        out = []
        for m in _CALLED.finditer(ins.attrs):
            for name in m.group(1).split(","):
                name = name.strip().lstrip("%")
                if name in comps:
                    out.append(name)
        return out

    def ops_of(comp_name: str, stack: tuple = ()) -> tuple:
        """(ATen ops, JAX ops) of a computation and those it calls."""
        if comp_name in memo:
            return memo[comp_name]
        if comp_name in stack:  # pragma: no cover - HLO has no recursion
            return (), ()
        aten, jaxo = [], []
        for ins in comps[comp_name].instrs:
            a, j = _instr_ops(ins, stack + (comp_name,))
            aten += a
            jaxo += j
        memo[comp_name] = (_unique(aten), _unique(jaxo))
        return memo[comp_name]

    def _instr_ops(ins: _Instr, stack: tuple) -> tuple:
        aten, jaxo = [], []
        for c in called(ins):
            a, j = ops_of(c, stack)
            aten += a
            jaxo += j
        if ins.opcode in ("parameter", "constant"):
            return aten, jaxo
        if ins.op_name:
            aten.append(aten_op_of(ins.op_name))
            jaxo.append(_jax_op_of(ins.op_name))
        elif ins.opcode not in _PLUMBING:  # XLA's own (a layout copy): its opcode
            jaxo.append(ins.opcode)
        return aten, jaxo

    fallback = program if program and _OVERLOAD.fullmatch(program) else None

    nodes: list[FusionNode] = []
    by_instr: dict = {}
    for ins in entry.instrs:
        if ins.opcode in _PLUMBING or ins.opcode in _NO_NODE:
            continue
        nid = f"n{len(nodes)}"
        if ins.opcode == "parameter":
            node = FusionNode(nid, ins.name, "parameter", "parameter", short_type(ins.type),
                              type_bytes(ins.type))
        else:
            aten, jaxo = _instr_ops(ins, (entry_name,))
            aten_t = _unique(aten) or ((fallback,) if fallback else ())
            kind = ins.opcode
            detail = ""
            comp = None
            if ins.opcode == "fusion":
                km = re.search(r"(?:^|[\s,])kind=(k\w+)", ins.attrs)
                kind = _FUSION_KINDS.get(km.group(1), km.group(1)) if km else "fusion"
                cs = called(ins)
                comp = cs[0] if cs else None
                bm = re.search(r'"kind":"([^"]+)"', ins.attrs)
                detail = bm.group(1) if bm else ""
            elif ins.opcode == "custom-call":
                tm = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
                detail = tm.group(1) if tm else ""
            node = FusionNode(nid, ins.name, kind, ins.opcode, short_type(ins.type),
                              type_bytes(ins.type), aten_t, _unique(jaxo), comp, detail)
        nodes.append(node)
        by_instr[ins.name] = node

    instrs = {ins.name: ins for ins in entry.instrs}

    def sources(name: str, depth: int = 0) -> list:
        """[(node, type text, value key)]: the arrays the value `name` is made of."""
        if name in by_instr:
            return [(by_instr[name], instrs[name].type, name)]
        ins = instrs.get(name)
        if ins is None or depth > 64 or ins.opcode in _NO_NODE:
            return []
        src = [s for op in ins.operands for s in sources(op, depth + 1)]
        if ins.opcode == "tuple":
            return src
        if ins.opcode == "get-tuple-element":
            im = re.search(r"\bindex=(\d+)", ins.attrs)
            i = int(im.group(1)) if im else 0
            if len(src) == 1:  # an element of a multi-output kernel's tuple
                node, _, key = src[0]
                return [(node, ins.type, f"{key}#{i}")]
            return [src[i]] if i < len(src) else src[:1]
        # bitcast, opt-barrier: the same bytes, seen under another type
        if len(src) == 1:
            return [(src[0][0], ins.type, src[0][2])]
        return src

    edges: dict = {}

    def connect(dst: FusionNode, operands: list) -> None:
        seen = set()
        for op in operands:
            for src, t, key in sources(op):
                if src is dst or key in seen:
                    continue
                seen.add(key)
                e = edges.get((src.id, dst.id))
                if e is None:
                    e = edges[(src.id, dst.id)] = FusionEdge(src.id, dst.id, 0, ())
                e.bytes += type_bytes(t)
                e.shapes = e.shapes + (short_type(t),)

    for ins in entry.instrs:
        dst = by_instr.get(ins.name)
        if dst is not None and dst.kind != "parameter":
            connect(dst, ins.operands)

    root = next((ins for ins in entry.instrs if ins.root),
                entry.instrs[-1] if entry.instrs else None)
    if root is not None:
        out = FusionNode(f"n{len(nodes)}", "ROOT", "root", "root", short_type(root.type),
                         type_bytes(root.type))
        nodes.append(out)
        connect(out, [root.name])
    order = {n.id: i for i, n in enumerate(nodes)}
    edge_list = sorted(edges.values(), key=lambda e: (order[e.dst], order[e.src]))
    return FusionGraph(module, nodes, edge_list, text, program)


def fusions(fn_or_program: Any, *args: Any, **kwargs: Any) -> FusionGraph:
    """The fusion graph of a program after XLA's optimization passes.

    `fn_or_program`: a `debug.Program` (from `lower`, `last_graphs()`,
    `last_programs()`, `compile_log()`), optimized HLO text, or anything
    `debug.lower` takes (a function, module, ATen op or fx graph), with its
    `*args` (lowered and compiled here; nothing runs on the device).
    """
    if isinstance(fn_or_program, str):
        return parse(fn_or_program)
    if isinstance(fn_or_program, Program):
        prog = fn_or_program
    else:
        prog = lower(fn_or_program, *args, **kwargs)
    return parse(prog.optimized, program=prog.name)
