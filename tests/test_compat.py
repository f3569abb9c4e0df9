"""The compat package: every patch of PyTorch checked against the code it was written for.

One test per patch target checks that the installed release's target is the
code the patch was written for (it fails on the release that changes it), and
one shows that a changed target turns the feature off, with one warning
naming it, and replaces nothing. `python -m torch_tpu._compat` is the same
check as a command.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings

import pytest

from torch_tpu import _compat
from torch_tpu._compat import releases

PATCHES = releases.all_patches()
IDS = [p.target for _, p in PATCHES]


def test_every_provider_has_patches_and_targets_are_unique_per_feature():
    assert len(PATCHES) >= 30
    seen: dict[str, str] = {}
    for feature, patch in PATCHES:
        assert patch.feature == feature and patch.why, patch.target
        assert seen.setdefault(patch.target, feature) == feature, \
            f"{patch.target} patched by two features"


@pytest.mark.parametrize("feature,patch", PATCHES, ids=IDS)
def test_target_is_the_code_its_patch_was_written_for(feature, patch):
    want = _compat.expected(patch.target)
    assert want is not None, f"{patch.target}: no fingerprint recorded for this release"
    assert _compat.current(patch.target) in want, (
        f"{patch.target} changed in this release: read it against the patch of "
        f"'{feature}', then record `python -m torch_tpu._compat --write`")


@contextlib.contextmanager
def _target_replaced_by(target, value):
    """`target` holds `value` for a moment, as if a new release had changed it
    (and our own patch of it, if applied, is out of the way)."""
    owner, attr = _compat._resolve(target)
    before = _compat._raw(owner, attr)
    applied = _compat._applied.pop(target, None)
    setattr(owner, attr, value)
    try:
        yield owner, attr
    finally:
        if before is _compat.ABSENT:
            delattr(owner, attr)
        else:
            setattr(owner, attr, before)
        if applied is not None:
            _compat._applied[target] = applied


def _changed(*args, **kwargs):  # a "new release's" target: another function
    return "changed"


@pytest.mark.parametrize("feature,patch", PATCHES, ids=IDS)
def test_a_changed_target_turns_its_feature_off(feature, patch):
    probe = f"probe of {patch.target}"
    sentinel = object()
    with _target_replaced_by(patch.target, _changed) as (owner, attr):
        with pytest.warns(RuntimeWarning) as record:
            ok = _compat.apply(probe, [_compat.Patch(patch.target, probe, "test",
                                                     lambda original: sentinel)])
        try:
            assert ok is False and not _compat.active(probe)
            assert getattr(owner, attr) is _changed  # nothing replaced
            [w] = [w for w in record if probe in str(w.message)]
            assert patch.target in str(w.message) and "is off" in str(w.message)
            # a second try stays off, silently
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert _compat.apply(probe, []) is False
        finally:
            _compat.restore(probe)


def test_a_feature_goes_in_whole_or_not_at_all():
    """One changed target among several: none of the feature's patches is applied."""
    feature = "probe: all or nothing"
    good = "torch_tpu._compat:_probe_good"
    bad = "torch_tpu._compat:_probe_bad"
    _compat._probe_good = _changed  # type: ignore[attr-defined]
    _compat._probe_bad = _changed  # type: ignore[attr-defined]
    fp = _compat.fingerprint(_changed)
    releases.expected("torch")[good] = frozenset({fp})
    releases.expected("torch")[bad] = frozenset({"another release's code"})
    try:
        with pytest.warns(RuntimeWarning, match="probe: all or nothing is off"):
            assert not _compat.apply(feature, [
                _compat.Patch(good, feature, "test", lambda o: "new"),
                _compat.Patch(bad, feature, "test", lambda o: "new")])
        assert _compat._probe_good is _changed and _compat._probe_bad is _changed
        releases.expected("torch")[bad] = frozenset({fp})
        _compat.restore(feature)  # (forgets the refusal too)
        assert _compat.apply(feature, [_compat.Patch(good, feature, "test", lambda o: "new"),
                                       _compat.Patch(bad, feature, "test", lambda o: "new")])
        assert _compat._probe_good == "new" and _compat.active(feature)
        assert _compat.applied()[good] == feature
        _compat.restore(feature)
        assert _compat._probe_good is _changed and not _compat.active(feature)
    finally:
        _compat.restore(feature)
        for name in (good, bad):
            releases.expected("torch").pop(name, None)
        del _compat._probe_good, _compat._probe_bad  # type: ignore[attr-defined]


def test_fingerprint_follows_source_not_identity():
    def f(x):
        return x + 1

    def g(x):
        return x + 1

    def h(x):
        return x + 2

    assert _compat.fingerprint(f) != _compat.fingerprint(h)
    # the same text under another name is another definition line: differs too
    assert _compat.fingerprint(f) != _compat.fingerprint(g)
    assert _compat.fingerprint(_compat.ABSENT) == "absent"
    assert _compat.fingerprint(len).startswith("builtin:len")


def test_the_command_lists_every_target_and_matches():
    proc = subprocess.run([sys.executable, "-m", "torch_tpu._compat"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(PATCHES)} patch targets, 0 not matching" in proc.stdout
    for target in IDS:
        assert target in proc.stdout
