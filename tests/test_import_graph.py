"""tools/import_graph.py on small made-up packages: what it counts as a cycle
(issue 52: an import under `if TYPE_CHECKING:` is an edge too)."""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap

_TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "import_graph.py"


def _tool():
    spec = importlib.util.spec_from_file_location("_import_graph_under_test", _TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> str:
    """A package named torch_tpu (the tool's root) with these modules."""
    pkg = tmp_path / "torch_tpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return str(pkg)


def test_type_checking_import_closes_a_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "a.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .b import B
            """,
        "b.py": """
            import typing
            from . import a
            if typing.TYPE_CHECKING:
                from . import c
            """,
        "c.py": "",
    })
    r = _tool().analyse(pkg)
    assert r["module_cycles"] == [["torch_tpu.a", "torch_tpu.b"]]
    assert r["module_level_imports"] == 3  # a -> b, b -> a, b -> c


def test_function_local_import_is_no_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "a.py": """
            def f():
                from .b import B  # lazy: test
            """,
        "b.py": "from . import a\n",
    })
    r = _tool().analyse(pkg)
    assert r["module_cycles"] == []
    assert r["function_local_imports"] == 1 and r["function_local_without_reason"] == []
