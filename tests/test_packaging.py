"""The supported torch range and the build against the installed torch.

pyproject's `dependencies`, torch_tpu._version and the build backend
(build_backend/torch_tpu_backend.py) state one range; the backend asks pip
for no torch where the target environment has one in the range (the
extension is then compiled against it), and for the range otherwise. A torch
outside the range gets one message naming the range; an extension built for
another torch says the exact command that rebuilds it.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tomllib

import pytest

import torch_tpu._version as version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _backend():
    spec = importlib.util.spec_from_file_location(
        "torch_tpu_backend", os.path.join(ROOT, "build_backend", "torch_tpu_backend.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_one_range_in_pyproject_version_and_backend_and_no_torch_pin_for_the_build():
    project = _pyproject()
    assert _backend().torch_requirement() == version.TORCH_RANGE
    assert version.TORCH_RANGE in [d.replace(" ", "") for d in project["project"]["dependencies"]]
    build = project["build-system"]
    assert not [r for r in build["requires"] if r.startswith("torch")], build["requires"]
    assert build["build-backend"] == "torch_tpu_backend"


@pytest.mark.parametrize("installed, asked", [
    ("2.13.0+cpu", []), ("2.14.1+cu130", []), ("2.12.1", ["range"]), ("2.15.0", ["range"]),
    (None, ["range"])])
def test_build_asks_for_torch_only_where_the_target_has_none_in_range(installed, asked,
                                                                       monkeypatch, tmp_path):
    backend = _backend()
    monkeypatch.delenv("TORCH_TPU_NATIVE", raising=False)
    found = (installed, str(tmp_path)) if installed else None
    monkeypatch.setattr(backend, "target_torch", lambda: found)
    want = [version.TORCH_RANGE if a == "range" else a for a in asked]
    assert backend._torch_for_build() == want


def test_build_makes_the_target_torch_importable_only_without_one_of_its_own(monkeypatch, tmp_path):
    backend = _backend()
    monkeypatch.delenv("TORCH_TPU_NATIVE", raising=False)
    monkeypatch.setattr(backend, "target_torch", lambda: ("2.14.1", str(tmp_path)))
    path = list(sys.path)
    monkeypatch.setattr(sys, "path", path)
    backend._expose_target_torch()  # this process has a torch: the build uses it
    assert str(tmp_path) not in path
    monkeypatch.setattr(backend.metadata, "distributions", lambda **kw: iter(()))
    backend._expose_target_torch()
    assert path[-1] == str(tmp_path)  # after the build environment's own packages


def test_target_is_this_interpreters_site_packages():
    """pip's default isolation runs the backend with the target's interpreter
    (its site-packages off sys.path): sysconfig still names them."""
    import sysconfig

    dirs = _backend().target_site_dirs()
    assert sysconfig.get_paths()["purelib"] in dirs
    found = _backend().target_torch()
    import torch

    # (a wheel's metadata may leave out the local part: 2.14.1 for 2.14.1+cu130)
    assert found is not None and found[0].split("+")[0] == torch.__version__.split("+")[0]


@pytest.mark.parametrize("torch_version", ["2.12.1", "2.15.0", "2.15.0.dev20261201+cpu", "1.13.1"])
def test_torch_outside_the_range_gets_one_message_naming_it(torch_version):
    message = version.unsupported_torch(torch_version)
    assert message is not None
    assert version.TORCH_RANGE in message and torch_version in message
    assert version.reinstall_command() in message


@pytest.mark.parametrize("torch_version", ["2.13.0", "2.13.0+cpu", "2.14.1+cu130", "2.14.0a0+git1"])
def test_torch_in_the_range_is_accepted(torch_version):
    assert version.unsupported_torch(torch_version) is None


def test_extension_built_for_another_torch_says_how_to_rebuild():
    code = """
import json, sys, types, warnings
fake = types.ModuleType("torch_tpu.runtime._native")
fake.TORCH_VERSION = "2.0.0"
sys.modules["torch_tpu.runtime._native"] = fake
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    from torch_tpu.runtime import fastpath
from torch_tpu._version import reinstall_command
print(json.dumps([fastpath.ACTIVE, fastpath.REASON, reinstall_command(),
                  [str(w.message) for w in seen if "fast path" in str(w.message)]]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_NATIVE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout
    active, reason, command, warned = json.loads(out.strip().splitlines()[-1])
    assert not active
    assert "built for torch 2.0.0" in reason and f"`{command}`" in reason
    assert command == f"{sys.executable} -m pip install --no-deps -e {ROOT}"
    assert len(warned) == 1 and command in warned[0]
