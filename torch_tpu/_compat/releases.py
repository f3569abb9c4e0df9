"""Which fingerprint tables apply: the installed PyTorch's and JAX's.

One module per release line whose targets differ: ``torch_2_13.py`` for
PyTorch 2.13.x, ``torch_2_14.py`` for 2.14.x, ``jax_0_10.py`` for JAX
0.10.x. Each holds ``FINGERPRINTS``: target -> the fingerprint(s) of the
code its patch was written for. A release without a table has every
feature that needs a patch off (one warning each); `python -m
torch_tpu._compat --write` prints the table to review for a new release.

`PROVIDERS` names every function that returns a feature's patches, so that
the command and the tests see all of them without running the features.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

# "module:function" -> a list of _compat.Patch (importing the module loads
# no JAX and no dynamo; the function may import dynamo)
PROVIDERS = (
    "torch_tpu.device.accelerator:patches",
    "torch_tpu.device.serialization:patches",
    "torch_tpu.device.printing:patches",
    "torch_tpu.device.dlpack:patches",
    "torch_tpu.distributed.fsdp_support:patches",
    "torch_tpu.compile.redirect:patches",
    "torch_tpu.compile.backend:patches",
    "torch_tpu.compile.persist.artifacts:patches",
    "torch_tpu._compat.flags:patches",
    "torch_tpu._compat.torch_api:patches",
    "torch_tpu._compat.dynamo_api:patches",
    "torch_tpu._compat.jax_api:patches",
)


def _minor(version: str) -> str:
    major, minor = version.split("+")[0].split(".")[:2]
    return f"{major}_{minor}"


def version(package: str) -> str:
    """The installed release of "torch" or "jax" (without importing JAX's runtime)."""
    if package == "torch":
        import torch

        return torch.__version__
    from importlib.metadata import version as dist_version

    return dist_version(package)


def describe(package: str = "torch") -> str:
    return f"{package} {version(package)}"


@functools.cache
def expected(package: str) -> dict[str, frozenset[str]]:
    """target -> accepted fingerprints, from `package`'s table for the installed release."""
    try:
        module: Any = importlib.import_module(
            f"{__package__}.{package}_{_minor(version(package))}")
    except ModuleNotFoundError:
        return {}
    return {target: frozenset((fps,) if isinstance(fps, str) else fps)
            for target, fps in module.FINGERPRINTS.items()}


def package_of(target: str) -> str:
    """Whose table records `target`: "jax" for jax/jaxlib targets, else "torch"."""
    root = target.split(".", 1)[0].split(":", 1)[0]
    return "jax" if root in ("jax", "jaxlib") else "torch"


def all_patches() -> list[tuple[str, Any]]:
    """(feature, Patch) for every provider's patches."""
    out = []
    for spec in PROVIDERS:
        module_name, _, fn = spec.partition(":")
        module = importlib.import_module(module_name)
        for feature, patches in getattr(module, fn)().items():
            out.extend((feature, p) for p in patches)
    return out
