"""Every replacement of a PyTorch or JAX attribute, in one checked place.

torch_tpu is a guest in other people's environments, so it changes PyTorch
only where a public API cannot give the same result, only when a `tpu`
feature needs it, and only after checking that the target is still the code
the patch was written for. A feature module says *what* it replaces and why
(`Patch`: a target such as ``"torch._dynamo.eval_frame:_optimize"``, the
feature it serves, a reason, and a function that builds the replacement from
the original); this package is the one place that checks and assigns.

The check: each target's fingerprint (a hash of its source, or of a
builtin's name and signature; see `fingerprint`) must be one of those
recorded for the running release in that release's table
(``torch_2_13.py``, ``torch_2_14.py``, ``jax_0_10.py``, ...; `python -m
torch_tpu._compat` prints the table for the installed releases). A feature's
patches go in together or not at all (`apply`): on a mismatch nothing of it
is replaced, the feature is off, and one warning names the feature and the
target. A patch that was never checked can therefore never run on code it
was not written for, and a new release turns features off instead of
compiling wrongly or crashing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from . import releases

__all__ = ["Patch", "apply", "active", "restore", "fingerprint", "current", "expected",
           "refused", "verified", "ABSENT"]

MARK = "_torch_tpu_patch"  # set on every replacement: its target string


class _Absent:
    """The value of a target attribute that does not exist (an addition)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replacement: `make(original)` returns what `target` becomes.

    target: ``"module.path:Attr"`` or ``"module.path:Class.attr"``.
    feature: what the user loses if it is refused (named in the warning).
    why: the reason PyTorch's own code or public API does not suffice.
    """

    target: str
    feature: str
    why: str
    make: Callable[[Any], Any]


@dataclasses.dataclass
class _Applied:
    patch: Patch
    owner: Any
    attr: str
    raw: Any       # what owner.__dict__ held (a staticmethod/classmethod object too)
    new: Any


_lock = threading.RLock()
_applied: dict[str, _Applied] = {}          # target -> what was done
_features: dict[str, list[str]] = {}        # feature -> its targets, applied
_refused: dict[str, str] = {}               # feature -> the warning's text


def _resolve(target: str) -> tuple[Any, str]:
    """(the object holding the attribute, its name) for ``module:Qual.name``."""
    module_name, _, qual = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def _raw(owner: Any, attr: str) -> Any:
    """The attribute as stored (a class's staticmethod object, not its function)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr] if klass is owner else getattr(owner, attr)
        return ABSENT
    return getattr(owner, attr, ABSENT)


def fingerprint(obj: Any) -> str:
    """A short hash of what `obj` does, stable across Python versions.

    Python functions: their source text (whitespace at line ends ignored);
    builtins: their qualified name and text signature; a missing attribute:
    ``"absent"``. Two releases whose target differs in any line differ here.
    """
    if obj is ABSENT:
        return "absent"
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = getattr(obj, "__func__", obj)  # a bound classmethod
    if hasattr(obj, "__code__"):
        try:
            return _digest(inspect.getsource(obj))
        except (OSError, TypeError):
            return "no-source"
    if not callable(obj) or isinstance(obj, type):
        # an instance (a module-level cache object) or a class: its class's source
        klass = obj if isinstance(obj, type) else type(obj)
        try:
            text = inspect.getsource(klass)
        except (OSError, TypeError):
            return f"{klass.__qualname__}:no-source"
        return _digest(text)
    # a builtin: its name and signature (pybind11 writes it as the doc's first line)
    name = getattr(obj, "__name__", type(obj).__name__)
    sig = getattr(obj, "__text_signature__", None) or ""
    doc = (getattr(obj, "__doc__", None) or "").strip().split("\n", 1)[0]
    if not sig and doc.startswith(name + "("):
        sig = doc[len(name):]
    return f"builtin:{name}{sig}"


def _digest(text: str) -> str:
    lines = "\n".join(line.rstrip() for line in text.strip().splitlines())
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def expected(target: str) -> frozenset[str] | None:
    """The fingerprints recorded for `target` in its release's table (None: none)."""
    return releases.expected(releases.package_of(target)).get(target)


def current(target: str) -> str:
    """The fingerprint of `target` as installed now (before any patch of ours)."""
    with _lock:
        done = _applied.get(target)
        if done is not None:
            return fingerprint(done.raw)
    owner, attr = _resolve(target)
    return fingerprint(_raw(owner, attr))


def _check(patches: Iterable[Patch]) -> str | None:
    """None, or why the first patch whose target changed cannot be applied."""
    for p in patches:
        try:
            got = current(p.target)
        except (ImportError, AttributeError) as e:
            return f"{p.target} cannot be found ({type(e).__name__}: {e})"
        want = expected(p.target)
        if want is None:
            return (f"{p.target} has no recorded fingerprint for "
                    f"{releases.describe(releases.package_of(p.target))}")
        if got not in want:
            return (f"{p.target} is not the code the patch was written for "
                    f"(fingerprint {got}, expected {' or '.join(sorted(want))})")
    return None


def _refuse(feature: str, why_not: str) -> None:
    """Record `feature` as off and give its one warning (the caller holds _lock)."""
    _refused[feature] = f"torch_tpu: {feature} is off: {why_not}"
    warnings.warn(_refused[feature] + "; see `python -m torch_tpu._compat`",
                  RuntimeWarning, stacklevel=4)


def _wrap_like(raw: Any, new: Any) -> Any:
    if isinstance(raw, staticmethod):
        return staticmethod(new)
    if isinstance(raw, classmethod):
        return classmethod(new)
    return new


def apply(feature: str, patches: Iterable[Patch]) -> bool:
    """Put every patch of `feature` in place, or none (idempotent).

    False when a target differs from what its patch was written for: nothing
    of the feature is replaced and one warning (per feature and process)
    says which target and what the user loses.
    """
    patches = list(patches)
    with _lock:
        if feature in _refused:
            return False
        if all(p.target in _applied for p in patches):
            return True
        why_not = _check(p for p in patches if p.target not in _applied)
        if why_not is not None:
            _refuse(feature, why_not)
            return False
        for p in patches:
            if p.target in _applied:
                continue
            owner, attr = _resolve(p.target)
            raw = _raw(owner, attr)
            original = None if raw is ABSENT else getattr(owner, attr)
            new = p.make(original)
            try:
                setattr(new, MARK, p.target)
            except (AttributeError, TypeError):
                pass
            setattr(owner, attr, _wrap_like(raw, new))
            _applied[p.target] = _Applied(p, owner, attr, raw, new)
            _features.setdefault(feature, []).append(p.target)
        return True


def verified(feature: str, targets: Iterable[str]) -> bool:
    """Whether `targets` (read or set, not replaced) are the code `feature`
    was written for; on a mismatch, the feature's one warning and False."""
    with _lock:
        if feature in _refused:
            return False
        if feature in _features:
            return True
        why_not = _check(Patch(t, feature, "", lambda o: o) for t in targets)
        if why_not is not None:
            _refuse(feature, why_not)
            return False
        _features[feature] = []
        return True


def active(feature: str) -> bool:
    """Whether `feature`'s patches are in place."""
    with _lock:
        return feature in _features


def refused() -> dict[str, str]:
    """feature -> why it is off, for every feature whose check failed."""
    with _lock:
        return dict(_refused)


def restore(feature: str) -> None:
    """Put back what `feature` replaced (tests; a feature turned off)."""
    with _lock:
        for target in reversed(_features.pop(feature, [])):
            done = _applied.pop(target)
            if done.raw is ABSENT:
                delattr(done.owner, done.attr)
            else:
                setattr(done.owner, done.attr, done.raw)
        _refused.pop(feature, None)


def applied() -> dict[str, str]:
    """target -> feature, for every patch in place."""
    with _lock:
        return {t: a.patch.feature for t, a in _applied.items()}
