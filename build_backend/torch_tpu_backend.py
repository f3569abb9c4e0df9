"""torch_tpu's PEP 517 build backend: setuptools', building the native
extension (setup.py, csrc/) against the torch of the environment that the
package is being installed into.

The extension loads only into the torch release it was compiled against (its
C++ ABI; runtime/fastpath.py checks). pip builds in an isolated environment,
so a fixed `torch==X` in `[build-system] requires` compiled against X whatever
torch the user had, and the fast path was then off. Here:

- the target environment already has a torch in the supported range
  (pyproject's `dependencies`): no torch is requested for the build, and that
  torch is made importable to setup.py (appended to `sys.path`, after the
  build environment's own packages);
- it has none, or one outside the range: the range is requested, and pip
  installs its newest release, the one its resolver then installs into the
  target too (install torch first to choose another).

The target is this interpreter's site-packages (pip's default isolation runs
the backend with the target's interpreter and hides its site-packages), or
the activated virtual environment (`VIRTUAL_ENV`) where a frontend runs the
backend with an interpreter of its own.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import tomllib
from importlib import metadata

from setuptools import build_meta as _setuptools
from setuptools.build_meta import build_sdist, get_requires_for_build_sdist  # noqa: F401

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OFF = ("0", "false", "no", "off")


def torch_requirement() -> str:
    """The torch requirement in pyproject's `dependencies` (`torch>=A.B,<C.D`)."""
    with open(os.path.join(_ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    found = [d.replace(" ", "") for d in deps if re.match(r"torch\s*[<>=!~]", d)]
    if len(found) != 1 or not re.fullmatch(r"torch>=\d+\.\d+,<\d+\.\d+", found[0]):
        raise RuntimeError(f"pyproject.toml: expected one `torch>=A.B,<C.D` dependency, found {found}")
    return found[0]


def _release(version: str) -> tuple[int, ...]:
    """(2, 14, 1) of '2.14.1+cu130' (the leading numbers of a version)."""
    return tuple(int(p) for p in re.findall(r"\d+", re.split(r"[^\d.]", version)[0]))


def in_range(version: str, requirement: str) -> bool:
    """Whether torch `version` satisfies `requirement` (`torch>=A.B,<C.D`)."""
    low, end = ((int(a), int(b)) for a, b in re.findall(r"(\d+)\.(\d+)", requirement))
    return low <= _release(version)[:2] < end


def target_site_dirs() -> list[str]:
    """The target environment's site-packages directories that exist."""
    dirs = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        dirs += [sysconfig.get_path(k, scheme="venv", vars={"base": venv, "platbase": venv})
                 for k in ("purelib", "platlib")]
    return [d for i, d in enumerate(dirs) if os.path.isdir(d) and d not in dirs[:i]]


def target_torch() -> tuple[str, str] | None:
    """(version, site-packages directory) of the target's torch, or None."""
    for d in target_site_dirs():
        for dist in metadata.distributions(name="torch", path=[d]):
            return dist.version, d
    return None


def _native_build() -> bool:
    """setup.py builds the extension (TORCH_TPU_NATIVE=0 skips it, and torch)."""
    return os.environ.get("TORCH_TPU_NATIVE", "").strip().lower() not in _OFF


def _torch_for_build() -> list[str]:
    """[] where the target's torch is in the supported range, else the range."""
    if not _native_build():
        return []
    found, requirement = target_torch(), torch_requirement()
    if found and in_range(found[0], requirement):
        return []
    return [requirement]


def _expose_target_torch() -> None:
    """Make the target's torch importable to setup.py, unless the build
    environment has one (then it was requested, the target's being unfit)."""
    if not _native_build() or any(metadata.distributions(name="torch")):
        return
    found = target_torch()
    if found and found[1] not in sys.path:
        sys.path.append(found[1])


def _requires(setuptools_hook, config_settings) -> list[str]:
    """setuptools' requirements (it runs setup.py for them) and torch's.

    setup.py imports torch to declare the extension: the target's torch is
    made importable, or, where torch is what is being asked for, setup.py
    runs without the extension (setuptools' own requirements do not depend
    on it)."""
    torch = _torch_for_build()
    if not torch:
        _expose_target_torch()
        return setuptools_hook(config_settings)
    saved = os.environ.get("TORCH_TPU_NATIVE")
    os.environ["TORCH_TPU_NATIVE"] = "0"
    try:
        return setuptools_hook(config_settings) + torch
    finally:
        os.environ["TORCH_TPU_NATIVE"] = saved if saved is not None else ""
        if saved is None:
            del os.environ["TORCH_TPU_NATIVE"]


def get_requires_for_build_wheel(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _expose_target_torch()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _expose_target_torch()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _expose_target_torch()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _expose_target_torch()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
