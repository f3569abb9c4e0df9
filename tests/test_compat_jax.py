"""JAX's private modules, read and set only through torch_tpu._compat.jax_api.

Every JAX target is recorded in the installed JAX's table (jax_<major>_<minor>.py)
and matches it; a changed target turns its feature off with one warning
naming the feature and the target, and the caller takes the safe way (no
disk tier, an op lowered instead of rebuilt, the pure-Python call path,
JAX's own cache write), never a wrong result or a crash.
"""

from __future__ import annotations

import contextlib
import warnings

import jax
import pytest
import torch

from torch_tpu import _compat
from torch_tpu._compat import jax_api, releases

TARGETS = sorted({p.target for ps in jax_api.patches().values() for p in ps})


def test_every_jax_target_is_in_the_installed_jax_table_and_matches():
    table = releases.expected("jax")
    assert table, f"no fingerprint table for {releases.describe('jax')}"
    for target in TARGETS:
        assert releases.package_of(target) == "jax"
        assert target in table, f"{target}: not recorded for {releases.describe('jax')}"
        assert _compat.current(target) in table[target], (
            f"{target} changed in {releases.describe('jax')}: read it against "
            "torch_tpu/_compat/jax_api.py, then record `python -m torch_tpu._compat --write`")
    assert set(jax_api.READS) <= set(jax_api.patches())


def test_no_module_outside_the_compat_package_imports_jax_internals():
    import pathlib
    import re

    root = pathlib.Path(jax_api.__file__).parents[1]
    private = re.compile(r"^\s*(from|import)\s+(jax\._src|jaxlib\.(?!version))", re.M)
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if "_compat" not in p.parts and private.search(p.read_text())]
    assert not found, f"JAX internals imported outside torch_tpu._compat: {found}"


def _changed(*args, **kwargs):  # a "new JAX release's" target: another function
    return "changed"


@contextlib.contextmanager
def _fresh(feature):
    """`feature` not yet checked in this process (its state put back after)."""
    features, refused = dict(_compat._features), dict(_compat._refused)
    _compat._features.pop(feature, None)
    _compat._refused.pop(feature, None)
    try:
        yield
    finally:
        _compat._features.clear()
        _compat._features.update(features)
        _compat._refused.clear()
        _compat._refused.update(refused)


@contextlib.contextmanager
def _jax_changed(feature, target=None, replace=True):
    """The first (or the given) target `feature` reads replaced by another
    function (`replace`), or, where JAX itself calls the target while the
    test runs ops, recorded with another release's fingerprint: the same
    mismatch for the check. Yields the warnings recorded meanwhile."""
    target = target or jax_api.READS[feature][0]
    owner, attr = _compat._resolve(target)
    with _fresh(feature), pytest.MonkeyPatch.context() as mp:
        if replace:
            mp.setattr(owner, attr, _changed)
        else:
            mp.setitem(releases.expected("jax"), target, frozenset({"another release"}))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            yield record
    mine = [w for w in record if feature in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in record]
    assert target in str(mine[0].message) and "is off" in str(mine[0].message)
    assert mine[0].category is RuntimeWarning


@pytest.mark.parametrize("feature", sorted(jax_api.READS))
def test_a_changed_jax_target_turns_its_feature_off_once(feature):
    with _jax_changed(feature):
        assert jax_api.usable(feature) is False
        assert jax_api.usable(feature) is False  # (no second warning)


def _program():
    """A program shaped as the executor's ([results], [new storages]), compiled."""
    x = jax.device_put(jax.numpy.arange(6.0), jax.devices()[0])
    return jax.jit(lambda arrays, dyn: ([arrays[0] * 3 + 1], [])).lower([x], []).compile()


def test_disk_tier_off_leaves_jax_cache_untouched_and_loads_nothing():
    from jax._src import compilation_cache as cc

    slot = cc._cache
    with _jax_changed(jax_api.DISK_TIER):
        assert jax_api.install_disk_tier(object()) is False
        assert cc._cache is slot  # nothing installed
        assert jax_api.load_executable("any-key", jax.devices()[0]) is None


def test_own_writes_off_stores_nothing():
    compiled = _program()
    assert jax_api.has_host_callbacks(compiled) is False
    with _jax_changed(jax_api.OWN_WRITES):
        assert jax_api.has_host_callbacks(compiled) is True  # (so never stored)
        assert jax_api.store_executable("k", "name", compiled, 0.0) is False


def test_single_writer_off_keeps_jax_write():
    from jax._src import config as jax_config

    with jax_api.no_jax_cache_write():
        assert jax_config.persistent_cache_min_compile_time_secs.value == float("inf")
    with _jax_changed(jax_api.SINGLE_WRITER, "jax._src.compiler:_cache_write"):
        before = jax_config.persistent_cache_min_compile_time_secs.value
        with jax_api.no_jax_cache_write():
            assert jax_config.persistent_cache_min_compile_time_secs.value == before


def test_eager_index_off_describes_nothing_and_ops_still_run():
    from torch_tpu.cache import eager

    compiled = _program()
    assert eager.describe(compiled) is not None
    with _jax_changed(jax_api.EAGER_INDEX, "jax._src.stages:make_args_info", replace=False):
        assert eager.describe(compiled) is None  # not indexed: lowered next time
        assert jax_api.rebuild_compiled(None, None, [], [], [], None, None, {}) is None
        x = torch.arange(5.0, device="tpu")
        torch.testing.assert_close((x.exp() - 1).cpu(), torch.arange(5.0).exp() - 1)


def test_native_call_and_precision_state_off(monkeypatch):
    from torch_tpu.runtime import precision

    assert jax_api.native_call_usable() is True
    assert jax_api.matmul_precision_state() is precision.JAX_PRECISION_STATE
    with _jax_changed(jax_api.NATIVE_CALL):
        assert jax_api.native_call_usable() is False
    with _jax_changed(jax_api.PRECISION, "jax._src.config:State.__init__"):
        assert jax_api.matmul_precision_state() is None
        monkeypatch.setattr(precision, "JAX_PRECISION_STATE", None)
        with jax.default_matmul_precision("highest"):
            assert precision._raw() == "highest"  # read from jax.config instead


def test_opt_levels_are_jax_effort_levels():
    """opt_level's constants are XLA's EffortLevel numbers, as JAX's enum has them."""
    from jax._src.config import EffortLevel

    from torch_tpu.runtime import opt_level

    assert opt_level.EFFORT == {0: EffortLevel.O0.value, 1: EffortLevel.O1.value,
                                2: EffortLevel.O2.value}
    assert opt_level.compiler_options(1)["optimization_level"] == EffortLevel.O1.value


def test_geqrf_off_raises_not_implemented(no_cpu_fallback):
    a = torch.randn(4, 3)
    qr, tau = torch.geqrf(a.to("tpu"))
    ref = torch.geqrf(a)
    torch.testing.assert_close(qr.cpu().abs(), ref[0].abs(), atol=1e-5, rtol=1e-5)
    with _jax_changed(jax_api.GEQRF, replace=False):
        with pytest.raises(NotImplementedError, match="geqrf"):
            torch.geqrf(torch.randn(5, 2).to("tpu"))


def test_distributed_state_off():
    assert jax_api.backends_started() is True  # (the tests' device is in use)
    assert jax_api.distributed_state() is not None
    with _jax_changed(jax_api.DISTRIBUTED):
        assert jax_api.distributed_state() is None
        assert jax_api.backends_started() is True  # (treated as started: restarted if allowed)


def test_erfcx_of_an_older_jax_is_not_lowered(monkeypatch):
    import jax.scipy.special as jsp

    assert jax_api.erfcx() is getattr(jsp, "erfcx", None)  # (None before JAX 0.10)
    monkeypatch.delattr(jsp, "erfcx", raising=False)
    assert jax_api.erfcx() is None
