"""PyTorch's private objects are reached through torch_tpu._compat only (issue 49 item 2).

Feature code takes them from the accessor modules (`torch_api`, `dynamo_api`,
see `torch_tpu/_compat/reads.py`), whose every name is a target that
tests/test_compat.py fingerprints; no module outside the compat package
imports a private PyTorch module or name itself.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

from torch_tpu._compat import dynamo_api, reads, torch_api

ROOT = pathlib.Path(__file__).resolve().parents[1] / "torch_tpu"
ACCESSORS = (torch_api, dynamo_api)


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split(".")[1:])


def private_torch_imports(source: str) -> list[str]:
    """Each import of a private PyTorch module or name in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "torch":
            found += [f"{node.module}.{a.name}" for a in node.names
                      if _private(node.module) or a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.split(".")[0] == "torch" and _private(a.name)]
    return found


# Files still importing a private torch module directly (none).
PENDING: dict = {}


def test_no_private_torch_import_outside_the_compat_package():
    found = {str(p.relative_to(ROOT.parent)): hits for p in sorted(ROOT.rglob("*.py"))
             if "_compat" not in p.parts and (hits := private_torch_imports(p.read_text()))}
    assert found == PENDING, "import these through torch_tpu._compat.torch_api / dynamo_api"


def test_the_scan_sees_each_form():
    src = ("import torch._dynamo.config as c\nfrom torch._decomp import x\n"
           "from torch.utils import _pytree\nfrom torch.nn.utils.stateless import _r\n"
           "from torch import nn\nimport torch.fx\n")
    assert private_torch_imports(src) == [
        "torch._dynamo.config", "torch._decomp.x", "torch.utils._pytree",
        "torch.nn.utils.stateless._r"]


@pytest.mark.parametrize("module", ACCESSORS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_name_is_its_targets_object_and_listed(module):
    table = module._NAMES
    listed = {p.target for patches in module.patches().values() for p in patches}
    for name, target in table.targets.items():
        module_name, _, attr = target.partition(":")
        assert getattr(module, name) is getattr(importlib.import_module(module_name), attr)
        assert target in listed, name
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_a_missing_target_raises_import_error_naming_it():
    names = reads.Names("here", {"group": {"gone": "torch:_torch_tpu_no_such_attribute"}})
    with pytest.raises(ImportError, match="torch:_torch_tpu_no_such_attribute"):
        names.resolve("gone", {})


def test_the_accessors_import_no_dynamo():
    code = ("import sys, torch_tpu._compat.torch_api, torch_tpu._compat.dynamo_api\n"
            "from torch_tpu._compat.torch_api import pytree\n"
            "print(sorted(m for m in ('torch._dynamo', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip() == "[]"
