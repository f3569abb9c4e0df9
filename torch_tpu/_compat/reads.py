"""Private PyTorch objects that torch_tpu reads or calls but never replaces, named once.

Where no public API gives the same result, feature code takes the private
object from an accessor module of this package (`torch_api`, `dynamo_api`)
instead of importing PyTorch's private module itself. Each accessor name
maps to one target (``"torch._decomp:decomposition_table"``), imported at
its first use and kept (a name never used imports nothing, so the accessor
modules cost nothing at ``import torch_tpu``). Their `patches()` list every
target as a patch that replaces nothing: `python -m torch_tpu._compat` and
tests/test_compat.py fingerprint them with the patched targets, so a release
that changes one is reviewed like a patch. The objects are not gated at use:
a feature built on them has no way around them, and a target that is gone
raises ImportError naming it.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import Patch

WHY = "read, not replaced: no public PyTorch API gives it"


def _same(original: Any) -> Any:
    return original


class Names:
    """The name -> target table of one accessor module.

    groups: what the names serve (the feature column of the listing) ->
    {accessor name: ``"module.path:attr"``}.
    """

    def __init__(self, module: str, groups: dict[str, dict[str, str]]) -> None:
        self.module = module
        self.groups = groups
        self.targets = {name: target for names in groups.values()
                        for name, target in names.items()}

    def resolve(self, name: str, namespace: dict[str, Any]) -> Any:
        """The object `name` stands for, stored in `namespace` (the accessor's
        globals) so that later uses are plain attribute reads."""
        target = self.targets.get(name)
        if target is None:
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
        module_name, _, attr = target.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            import torch

            raise ImportError(
                f"torch_tpu needs {target}, which torch {torch.__version__} does not have "
                f"({type(e).__name__}: {e}); see `python -m torch_tpu._compat`") from e
        namespace[name] = value
        return value

    def names(self) -> list[str]:
        return sorted(self.targets)

    def patches(self) -> dict[str, list[Patch]]:
        """Every target, as a patch that replaces nothing (for the listing and tests)."""
        return {group: [Patch(target, group, WHY, _same) for target in names.values()]
                for group, names in self.groups.items()}
