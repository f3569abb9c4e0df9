"""The import structure of the torch_tpu package, measured with `ast`.

    python tools/import_graph.py            # summary
    python tools/import_graph.py --list     # also every function-local import
    python tools/import_graph.py --json     # machine-readable
    python tools/import_graph.py --check    # exit 1 unless within the rules (.ci/run)

It reads the source only (nothing is imported) and reports

- **module-level import cycles**: strongly connected components of the
  graph of imports executed when a module is imported (top-level statements,
  including those under module-level `if`/`try`, and those under `if
  TYPE_CHECKING:`: they never run, but a circle through a type-only import
  is still two modules that each need the other to be read or changed, and
  the day one of them is needed at run time it is a real cycle). Importing
  `a.b.c` also runs `a.b`'s
  `__init__`, so an edge goes to each package on the way too (except the
  importer's own packages, which are initialized before it runs);
- **cycles between subpackages** (`torch_tpu.runtime`, `torch_tpu.ops`,
  ...): the same graph with modules collapsed to their subpackage, or to the
  module itself where the layer list names it alone
  (`torch_tpu.jax_op`). The layer rule wants none;
- **upward edges**: imports, module-level or function-local alike, from a
  module to one in a higher layer of the list in docs/architecture.md (the
  fenced ```layers block: one layer a line, bottom first; a line names
  subpackages or modules, and a module belongs to the longest name that
  prefixes it). A module may import its own layer and lower ones only; an
  upper layer that must be called from below installs a hook instead;
- the count of **function-local imports** of torch_tpu modules: import
  statements inside a function or method (one per imported module: `from .
  import a, b` counts two, `from .m import a, b` one). They are for laziness
  only (start-up cost, an optional dependency), each with a one-line reason
  on its line or the line above: a comment starting `# lazy:` or
  `# optional:`. At most FUNCTION_LOCAL_BUDGET of them;
- **uses of another module's private names**: `from torch_tpu.m import _name`
  (or `from .m import _name`), and `alias._name` where `alias` is a name an
  import binds to a torch_tpu module anywhere in the file (`from . import m as
  alias`, `import torch_tpu.m`, through `alias.sub._name` too), `_name` not a
  dunder. A name other modules use is part of its module's surface: public,
  with a docstring saying what for. A private submodule (`ops/nn/_common.py`)
  is private to its package: its siblings may import it, other packages may
  not. Each (module, name) is reported once, at its first use.

`--check` fails on a cycle, an upward edge, a function-local import over the
budget or one without its reason, or a use of another module's private name.
Written for issue 15 (one clean runtime layer), extended for issue 36
(imports go down, no private names across modules) and issue 52 (type-only
imports count).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections import defaultdict

ROOT = "torch_tpu"
FUNCTION_LOCAL_BUDGET = 40
LAYERS_DOC = os.path.join("docs", "architecture.md")
_REASON = re.compile(r"#\s*(lazy|optional)\b")


def _modules(pkg_dir: str) -> dict[str, str]:
    """Module name -> file path for every .py file under the package."""
    out = {}
    base = os.path.dirname(os.path.abspath(pkg_dir))
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, base)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = path
    return out


def _extension_modules(pkg_dir: str) -> set[str]:
    """Modules with no .py source: compiled extensions, named by their .pyi stub."""
    base = os.path.dirname(os.path.abspath(pkg_dir))
    out = set()
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__"))]
        for f in filenames:
            if f.endswith(".pyi"):
                out.add(".".join(os.path.relpath(os.path.join(dirpath, f), base)[:-4]
                                 .split(os.sep)))
    return out


def _from_module(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement in `package` reads from."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts)
    return f"{base}.{node.module}" if node.module else base


class _Collector(ast.NodeVisitor):
    """Import statements of one module, each tagged module-level or local."""

    def __init__(self, module: str, is_pkg: bool, modules: dict, lines: list | None = None):
        self.module = module
        self.lines = lines or []
        self.package = module if is_pkg else module.rpartition(".")[0]
        self.modules = modules
        self.depth = 0  # function nesting
        self.found: list[tuple[str, int, bool]] = []  # (target, line, local)
        self.reasons: dict[int, bool] = {}  # line of a local import -> has its reason

    def _add(self, target: str, line: int):
        if target == ROOT or target.startswith(ROOT + "."):
            local = self.depth > 0
            if local and (target, line, True) in self.found:
                return  # `from .m import a, b`: one import of m
            self.found.append((target, line, local))
            if local:
                self.reasons[line] = self._has_reason(line)

    def _has_reason(self, line: int) -> bool:
        here = self.lines[line - 1] if line <= len(self.lines) else ""
        above = self.lines[line - 2].strip() if line >= 2 else ""
        return bool(_REASON.search(here)) or (above.startswith("#")
                                              and bool(_REASON.search(above)))

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Import(self, node):
        for a in node.names:
            self._add(a.name, node.lineno)

    def visit_ImportFrom(self, node):
        base = _from_module(self.package, node)
        for a in node.names:
            sub = f"{base}.{a.name}"
            # `from pkg import name`: a submodule if one exists, else a name in pkg.
            self._add(sub if sub in self.modules else base, node.lineno)


def _private(name: str) -> bool:
    """A private name: one leading underscore, not a dunder (`__version__`)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(mod: str, pkg: str) -> bool:
    """`mod` is the package `pkg` itself or one of the modules under it."""
    return mod == pkg or mod.startswith(pkg + ".")


class _PrivateUses(ast.NodeVisitor):
    """Uses of another torch_tpu module's private names in one module.

    A name is bound to a torch_tpu module by an import anywhere in the module
    (`import torch_tpu.x`, `from . import x as alias`, in a function or under
    `if TYPE_CHECKING:` alike). A use is `from <module> import _name` or
    `alias._name` (`torch_tpu.x._name` through the chain) where `_name` is
    not a submodule: a private name of that module. A private submodule
    (`ops/nn/_common.py`) is private to its package: a module inside that
    package may import it, one outside may not.
    """

    def __init__(self, module: str, is_pkg: bool, modules: set[str]):
        self.module = module
        self.package = module if is_pkg else module.rpartition(".")[0]
        # Modules and the packages holding them (a package without an
        # __init__.py has no module of its own).
        self.modules = modules | {m.rsplit(".", i)[0] for m in modules
                                  for i in range(1, m.count(".") + 1)}
        self.aliases: dict[str, str] = {}  # local name -> torch_tpu module it is bound to
        self.found: dict[tuple[str, str], int] = {}  # (module, name) -> first line

    def _use(self, target: str, name: str, line: int):
        # `name` reached through the module `target`.
        sub = f"{target}.{name}"
        if sub in self.modules:
            if _private(name) and not _inside(self.module, target):
                self.found.setdefault((target, name), line)  # another package's private module
        elif _private(name) and target != self.module:
            self.found.setdefault((target, name), line)

    def _via(self, dotted: str, line: int):
        # Each private module on the way of `import a._b.c` / `from a._b import c`.
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            self._use(".".join(parts[:i]), parts[i], line)

    def visit_Import(self, node):
        for a in node.names:
            if a.name == ROOT or a.name.startswith(ROOT + "."):
                self._via(a.name, node.lineno)
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    self.aliases[a.name.split(".")[0]] = ROOT

    def visit_ImportFrom(self, node):
        base = _from_module(self.package, node)
        if base not in self.modules:
            return
        self._via(base, node.lineno)
        for a in node.names:
            if a.name == "*":
                continue
            self._use(base, a.name, node.lineno)
            if f"{base}.{a.name}" in self.modules:
                self.aliases[a.asname or a.name] = f"{base}.{a.name}"

    def _resolve(self, node) -> str | None:
        # The torch_tpu module an expression (`alias`, `alias.sub`) names, if any.
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if base is not None and f"{base}.{node.attr}" in self.modules:
                return f"{base}.{node.attr}"
        return None

    def visit_Attribute(self, node):
        base = self._resolve(node.value)
        if base is not None:
            self._use(base, node.attr, node.lineno)
        self.generic_visit(node)


def read_layers(doc: str) -> list[list[str]]:
    """The ```layers block of `doc`: one list of names per layer, bottom first."""
    layers: list[list[str]] = []
    inside = False
    with open(doc, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if not inside:
                inside = s == "```layers"
                continue
            if s.startswith("```"):
                break
            s = s.split("#", 1)[0].strip()
            if s:
                layers.append(s.split())
    if not layers:
        raise SystemExit(f"{doc}: no ```layers block")
    return layers


def layer_of(mod: str, layers: list[list[str]]) -> int | None:
    """The index of the layer whose longest name prefixes `mod` (None: unlisted)."""
    best, best_len = None, -1
    for i, names in enumerate(layers):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best_len:
                best, best_len = i, len(n)
    return best


def analyse(pkg_dir: str, layers: list[list[str]] | None = None) -> dict:
    modules = _modules(pkg_dir)
    imports: dict[str, list] = {}
    reasons: dict[tuple, bool] = {}
    private_uses: list[tuple[str, int, str, str]] = []  # (module, line, target, name)
    extensions = _extension_modules(pkg_dir)
    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text, path)
        c = _Collector(mod, path.endswith("__init__.py"), modules, text.splitlines())
        c.visit(tree)
        imports[mod] = c.found
        pu = _PrivateUses(mod, path.endswith("__init__.py"), set(modules) | extensions)
        pu.visit(tree)
        private_uses.extend((mod, line, target, name)
                            for (target, name), line in pu.found.items())
        for line, ok in c.reasons.items():
            reasons[(mod, line)] = ok

    graph: dict[str, set] = defaultdict(set)
    local = []
    upward = []
    unlisted = sorted(m for m in modules if layers is not None and layer_of(m, layers) is None)
    n_module_level = 0
    for mod, found in imports.items():
        for target, line, is_local in found:
            if target not in modules:
                continue
            if layers is not None:
                parts = target.split(".")
                lm = layer_of(mod, layers)
                # The target and the packages its import initializes on the way.
                for i in range(1, len(parts) + 1):
                    t = ".".join(parts[:i])
                    if t == ROOT and t != target:
                        continue  # the package itself is initialized by any import
                    # Its own packages are initialized already, but a name
                    # taken from one (`import torch_tpu; torch_tpu._load()`)
                    # is still a use of that package.
                    if t == mod or t not in modules or (mod.startswith(t + ".")
                                                        and t != target):
                        continue
                    lt = layer_of(t, layers)
                    if lm is not None and lt is not None and lt > lm:
                        upward.append((mod, line, t, "function-local" if is_local
                                       else "module-level"))
                        break
            if is_local:
                local.append((mod, line, target))
                continue
            n_module_level += 1
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # the packages on the way, then the target
                t = ".".join(parts[:i])
                # The importer's own packages are initialized already (it runs
                # inside them): no edge.
                if t != mod and t in modules and not mod.startswith(t + "."):
                    graph[mod].add(t)

    sccs = [c for c in _sccs(modules, graph) if len(c) > 1]

    names = sorted((n for layer in layers or () for n in layer), key=len, reverse=True)

    def sub(m):
        # The unit the layer list names (a subpackage, or a module listed on
        # its own such as torch_tpu.jax_op), else the subpackage.
        for n in names:
            if n != ROOT and (m == n or m.startswith(n + ".")):
                return n
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else m

    sgraph: dict[str, set] = defaultdict(set)
    witness: dict[tuple, tuple] = {}
    for a, targets in graph.items():
        for b in targets:
            sa, sb = sub(a), sub(b)
            if sa != sb and sa != ROOT and sb != ROOT:
                sgraph[sa].add(sb)
                witness.setdefault((sa, sb), (a, b))
    subs = sorted({sub(m) for m in modules} - {ROOT})
    sub_sccs = [c for c in _sccs(subs, sgraph) if len(c) > 1]
    sub_edges = sorted((a, b, witness[(a, b)]) for c in sub_sccs for a in c for b in sgraph[a]
                       if b in c)
    return {
        "modules": len(modules),
        "module_level_imports": n_module_level,
        "function_local_imports": len(local),
        "function_local": sorted(local),
        "function_local_budget": FUNCTION_LOCAL_BUDGET,
        "function_local_without_reason": sorted(
            (m, line, t) for m, line, t in local if not reasons.get((m, line), False)),
        "upward_edges": [{"from": m, "line": line, "to": t, "kind": k}
                         for m, line, t, k in sorted(upward)],
        "unlisted_modules": unlisted,
        "private_uses": [{"from": m, "line": line, "module": t, "name": n}
                         for m, line, t, n in sorted(private_uses)],
        "module_cycles": [sorted(c) for c in sccs],
        "subpackage_cycles": [sorted(c) for c in sub_sccs],
        "subpackage_cycle_edges": [{"from": a, "to": b, "via": f"{w[0]} -> {w[1]}"}
                                   for a, b, w in sub_edges],
    }


def _sccs(nodes, graph) -> list[list]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    out = []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", nargs="?",
                   default=os.path.join(os.path.dirname(os.path.dirname(
                       os.path.abspath(__file__))), ROOT))
    p.add_argument("--list", action="store_true", help="print every function-local import "
                   "(private-name uses are printed always)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true",
                   help="exit 1 on a cycle, an upward edge, a function-local import without "
                        f"its reason or more than {FUNCTION_LOCAL_BUDGET} of them, or a use of "
                        "another module's private name")
    p.add_argument("--layers", default=None,
                   help=f"the document with the ```layers block (default: {LAYERS_DOC})")
    args = p.parse_args(argv)
    doc = args.layers or os.path.join(os.path.dirname(os.path.abspath(args.package)), LAYERS_DOC)
    r = analyse(args.package, read_layers(doc))
    if args.json:
        print(json.dumps(r, indent=1))
        return _verdict(r, args.check, quiet=True)
    print(f"modules: {r['modules']}")
    print(f"imports between torch_tpu modules: {r['module_level_imports']} module-level, "
          f"{r['function_local_imports']} function-local")
    print(f"module-level import cycles (strongly connected components): "
          f"{len(r['module_cycles'])}")
    for c in r["module_cycles"]:
        print(f"  {len(c)} modules: {', '.join(c)}")
    print(f"cycles between subpackages: {len(r['subpackage_cycles'])}")
    for c in r["subpackage_cycles"]:
        print(f"  {' <-> '.join(c)}")
    for e in r["subpackage_cycle_edges"]:
        print(f"    {e['from']} -> {e['to']}  (e.g. {e['via']})")
    print(f"upward edges (layers of {os.path.relpath(doc)}, deferred included): "
          f"{len(r['upward_edges'])}")
    for e in r["upward_edges"]:
        print(f"  {e['from']}:{e['line']} -> {e['to']}  ({e['kind']})")
    if r["unlisted_modules"]:
        print(f"modules in no layer: {', '.join(r['unlisted_modules'])}")
    print(f"function-local imports without a '# lazy:' / '# optional:' reason: "
          f"{len(r['function_local_without_reason'])}")
    print(f"uses of another module's private names: {len(r['private_uses'])}")
    for u in r["private_uses"]:
        print(f"  {u['from']}:{u['line']} -> {u['module']}.{u['name']}")
    if args.list:
        print("function-local imports:")
        missing = set(map(tuple, r["function_local_without_reason"]))
        for mod, line, target in r["function_local"]:
            flag = "  (no reason)" if (mod, line, target) in missing else ""
            print(f"  {mod}:{line} -> {target}{flag}")
    return _verdict(r, args.check)


def _verdict(r: dict, check: bool, quiet: bool = False) -> int:
    if not check:
        return 0
    failures = []
    if r["module_cycles"] or r["subpackage_cycles"]:
        failures.append("import cycles")
    if r["upward_edges"]:
        failures.append(f"{len(r['upward_edges'])} upward edges")
    if r["unlisted_modules"]:
        failures.append(f"{len(r['unlisted_modules'])} modules in no layer")
    if r["function_local_imports"] > FUNCTION_LOCAL_BUDGET:
        failures.append(f"{r['function_local_imports']} function-local imports "
                        f"(budget {FUNCTION_LOCAL_BUDGET})")
    if r["private_uses"]:
        failures.append(f"{len(r['private_uses'])} uses of another module's private names")
    if r["function_local_without_reason"]:
        failures.append(f"{len(r['function_local_without_reason'])} function-local imports "
                        "without a reason comment")
    if failures:
        if not quiet:
            print("import_graph --check: FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    if not quiet:
        print("import_graph --check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
