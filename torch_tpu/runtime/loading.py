"""The backend's load step as a hook: `load()` is `torch_tpu._load()`.

The package (the top layer) installs its load step here when it is imported;
the layers below call `load()` and `is_loaded()` instead of importing the
package (imports go down only, docs/architecture.md). Imports nothing: it is
part of the start-up set.
"""

from __future__ import annotations

from collections.abc import Callable

_LOAD: list[Callable[[], None]] = []
_IS_LOADED: list[Callable[[], bool]] = []


def set_loader(load_fn: Callable[[], None], is_loaded_fn: Callable[[], bool]) -> None:
    """Install the package's load step and its "done" test (torch_tpu/__init__.py)."""
    _LOAD[:] = [load_fn]
    _IS_LOADED[:] = [is_loaded_fn]


def load() -> None:
    """Load the backend (JAX, the lowering table, the kernels) once, thread-safe."""
    if _LOAD:
        _LOAD[0]()


def is_loaded() -> bool:
    """Whether the backend has loaded in this process."""
    return bool(_IS_LOADED) and _IS_LOADED[0]()
