"""The cache's trust model under attack: each test is one attack from issue 48.

The hostile user is uid 65534 (nobody): files and directories are chowned to
it (root may do that, and the tests run as root here and in CI), or a forked
child drops to it. Tests that need either skip, with the reason, when not
run as root.
"""

import os
import shutil
import sys
import tempfile
import warnings

import jax
import numpy as np
import pytest

import torch_tpu  # noqa: F401
import torch_tpu.cache as cache
from torch_tpu.cache import store as store_mod
from torch_tpu.cache.__main__ import main as cache_main
from torch_tpu.compile.persist import artifacts
from torch_tpu.runtime import programs

NOBODY = 65534
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="acting as a second user needs root "
                                                    "(chown to uid 65534, setuid in a child)")


def _cache_warnings(record):
    return [w for w in record if issubclass(w.category, cache.CacheWarning)]


def _set_dir(root) -> list:
    """cache.set_dir(root); the cache warnings it gave."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.set_dir(str(root))
    return _cache_warnings(record)


def _f32(*values):
    return jax.device_put(np.array(values, dtype=np.float32))


def _compile(name, fn, args):
    """Compile `fn` past the memory tier (a fresh function: JAX's own caches miss)."""
    return programs.compile(name, None, lambda a, b: fn(a, b), args)


def _victim(tmp_path):
    """A private directory of the victim's with two files in it."""
    victim = tmp_path / "victim-private"
    victim.mkdir(mode=0o700)
    (victim / "thesis.tex").write_text("years of work")
    (victim / ("0" * 64 + store_mod.SUFFIX)).write_bytes(b"named like an entry")
    return victim


def _as_nobody(fn):
    """(exit code, output) of `fn()` run in a forked child as uid 65534."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        out = os.fdopen(w, "w")
        try:
            os.close(r)
            sys.stdout = sys.stderr = out
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out.write(f"child failed: {e!r}")
        finally:
            out.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        output = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output


# -- (a) a forged entry swapped in while the process runs ---------------------------------


@needs_root
def test_forged_entry_swapped_in_during_a_run_is_not_loaded(cache_dir):
    """Another user renames xla-v1 away and puts in their own directory holding
    a valid-looking entry for `a * b` whose payload computes `a + b`."""
    s = cache.disk_store()
    x, y = _f32(2.0, 3.0), _f32(5.0, 7.0)
    _compile("trust_mul", lambda a, b: a * b, (x, y))
    (mul_key,) = cache.last_compile_keys()
    _compile("trust_add", lambda a, b: a + b, (x, y))
    (add_key,) = cache.last_compile_keys()
    add_payload = s.get(add_key, count=False)
    assert add_payload is not None and s.get(mul_key, count=False) is not None

    tier = cache_dir / store_mod.SUBDIR
    os.rename(tier, cache_dir / "xla-v1.old")
    tier.mkdir(mode=0o755)
    forged = tier / s._name_for(mul_key)
    forged.write_bytes(store_mod.encode_entry(mul_key, s._env or {}, add_payload,
                                              created=0.0))
    for p in (tier, forged):
        os.chown(p, NOBODY, NOBODY)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = _compile("trust_mul", lambda a, b: a * b, (x, y))(x, y)
        out2 = _compile("trust_mul", lambda a, b: a * b, (x, y))(x, y)
    np.testing.assert_array_equal(np.asarray(out), [10.0, 21.0])   # a * b, not a + b
    np.testing.assert_array_equal(np.asarray(out2), [10.0, 21.0])
    ws = _cache_warnings(record)
    assert len(ws) == 1 and "owned by another user" in str(ws[0].message)
    assert "owned by another user" in s.info()["status"]
    assert [p.name for p in tier.iterdir()] == [forged.name]  # nothing written there


def test_directory_replaced_by_our_own_is_used_again(cache_dir):
    """The same swap done by this user (or root: trusted) is followed: the new
    directory passes the check and serves its entries; nothing is lost."""
    s = cache.disk_store()
    s.put("k", b"old")
    os.rename(cache_dir / store_mod.SUBDIR, cache_dir / "moved")
    fresh = store_mod.DiskStore(str(cache_dir), shared=None)
    fresh.put("k", b"new")
    assert s.get("k") == b"new" and s.info()["status"] == "ok"


@needs_root
def test_entry_owned_by_another_user_is_refused_in_the_local_directory(cache_dir):
    s = cache.disk_store()
    s.put("k", b"v")
    os.chown(s.file_for("k"), NOBODY, NOBODY)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert s.get("k") is None
    assert len(_cache_warnings(record)) == 1


# -- (b) a symlinked tier ------------------------------------------------------------------


def test_symlinked_tier_is_refused(cache_dir, tmp_path):
    victim = _victim(tmp_path)
    root = tmp_path / "attacked"
    root.mkdir(mode=0o700)
    os.symlink(victim, root / store_mod.SUBDIR)
    assert len(_set_dir(root)) == 1
    assert not cache.is_enabled()
    assert "symbolic link" in cache.info()["status"]
    cache.disk_store().put("k", b"v")
    assert sorted(p.name for p in victim.iterdir()) == sorted(
        ["thesis.tex", "0" * 64 + store_mod.SUFFIX])


def test_symlinked_artifact_tier_is_refused(tmp_path):
    victim = _victim(tmp_path)
    root = tmp_path / "attacked"
    root.mkdir(mode=0o700)
    os.symlink(victim, root / artifacts.SUBDIR)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        s = artifacts.ArtifactStore(str(root))
    assert not s.usable and "symbolic link" in (s.problem or "")


def test_symlinked_entry_is_not_followed(cache_dir, tmp_path):
    s = cache.disk_store()
    s.put("k", b"v")
    target = tmp_path / "elsewhere.tpx"
    os.replace(s.file_for("k"), target)
    os.symlink(target, s.file_for("k"))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert s.get("k") is None
    assert target.exists() and not os.path.lexists(s.file_for("k"))


# -- (c) `clear` and `info` through a symlink ------------------------------------------------


@pytest.mark.parametrize("root_mode", [0o777, 0o700])
def test_clear_through_a_symlinked_tier_deletes_nothing_outside(tmp_path, capsys, root_mode):
    victim = _victim(tmp_path)
    before = sorted(p.name for p in victim.iterdir())
    root = tmp_path / "attacked"
    root.mkdir()
    os.chmod(root, root_mode)
    os.symlink(victim, root / store_mod.SUBDIR)
    os.symlink(victim, root / artifacts.SUBDIR)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert cache_main(["info", "--dir", str(root)]) != 0
        info = capsys.readouterr().out
        assert cache_main(["clear", "--dir", str(root)]) != 0
        cleared = capsys.readouterr().err
    assert "status    : ok" not in info and "unrecognised" not in info
    assert "refused" in cleared
    assert sorted(p.name for p in victim.iterdir()) == before


def test_clear_removes_links_in_the_tier_not_their_targets(cache_dir, tmp_path, capsys):
    victim = _victim(tmp_path)
    tier = cache_dir / store_mod.SUBDIR
    os.symlink(victim, tier / ("1" * 64 + store_mod.SUFFIX))
    os.symlink(victim / "thesis.tex", tier / ("2" * 64 + store_mod.SUFFIX))
    assert cache_main(["clear", "--dir", str(cache_dir)]) == 0
    # a link is never an entry (never read as one): clear counts it among the
    # unrecognised items it removes, as `info` does
    out = capsys.readouterr().out
    assert "removed 0 cached program(s), 2 unrecognised item(s)" in out, out
    assert list(tier.iterdir()) == [] and (victim / "thesis.tex").exists()


# -- (d) a read-only `clear` ------------------------------------------------------------------


@pytest.fixture
def searchable_dir():
    """A directory of root's that uid 65534 can reach (pytest's are 0700)."""
    base = tempfile.mkdtemp(prefix="torch_tpu-trust-")
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_read_only_clear_fails_with_a_non_zero_exit(searchable_dir):
    """`clear` run by a user who cannot delete the entries (a directory of
    root's: trusted, read-only for them) removes nothing and says so."""
    root = os.path.join(searchable_dir, "cache")
    tier = os.path.join(root, store_mod.SUBDIR)
    s = store_mod.DiskStore(root, shared=None)
    s.put("a", b"1")
    s.put("b", b"2")
    for p in (root, tier):
        os.chmod(p, 0o755)
    for name in os.listdir(tier):
        os.chmod(os.path.join(tier, name), 0o644)
    code, out = _as_nobody(lambda: cache_main(["clear", "--dir", root]))
    assert code not in (0, 99), out
    assert "could not remove 2" in out
    assert len(os.listdir(tier)) == 2


def test_clear_leaves_a_symlinked_artifact_tier_alone(cache_dir, tmp_path, capsys):
    victim = _victim(tmp_path)
    cache.disk_store().put("k", b"v")
    os.symlink(victim, cache_dir / artifacts.SUBDIR)
    assert cache_main(["clear", "--dir", str(cache_dir)]) == 1
    assert "removed 1" in capsys.readouterr().out
    assert len(list(victim.iterdir())) == 2


# -- (e) `info` creates nothing ---------------------------------------------------------------


def test_info_on_a_missing_directory_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "not-there" / "cache"
    assert cache_main(["info", "--dir", str(missing)]) == 0
    assert "does not exist" in capsys.readouterr().out
    assert cache_main(["clear", "--dir", str(missing)]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert not (tmp_path / "not-there").exists()


# -- (f) a world-writable root, and the directories above it ------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_world_writable_root_is_refused_by_the_executable_tier(cache_dir, tmp_path, mode):
    root = tmp_path / "open-root"
    (root / store_mod.SUBDIR).mkdir(parents=True, mode=0o700)
    os.chmod(root, mode)  # 1777: sticky, as /tmp, but /tmp itself is no cache root
    assert len(_set_dir(root)) == 1
    assert not cache.is_enabled()
    assert "writable by other users" in cache.info()["status"]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert not artifacts.ArtifactStore(str(root)).usable  # the pickle tier agrees


@pytest.mark.parametrize("mode, ok", [(0o777, False), (0o1777, True), (0o755, True)])
def test_directories_above_the_root(cache_dir, tmp_path, mode, ok):
    """Above the root, a sticky directory of root's (as /tmp) is accepted; one
    that others may write without the sticky bit (they could rename the root
    away) is not."""
    parent = tmp_path / "parent"
    parent.mkdir()
    os.chmod(parent, mode)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cache.set_dir(str(parent / "cache"))
        assert artifacts.ArtifactStore(str(parent / "cache")).usable == ok
    assert cache.is_enabled() == ok
    if not ok:
        assert "writable by other users" in cache.info()["status"]


@needs_root
def test_sticky_ancestor_owned_by_another_user_is_refused(cache_dir, tmp_path):
    parent = tmp_path / "their-tmp"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    os.chown(parent, NOBODY, NOBODY)
    _set_dir(parent / "cache")
    assert not cache.is_enabled() and "owned by another user" in cache.info()["status"]


def test_symlinked_root_resolving_to_a_checked_directory_is_used(cache_dir, tmp_path):
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    cache.set_dir(str(tmp_path / "link"))
    assert cache.is_enabled() and cache.info()["status"] == "ok"
    cache.disk_store().put("k", b"v")
    assert (real / store_mod.SUBDIR / cache.disk_store()._name_for("k")).is_file()


def test_output_written_by_the_child_helper_is_read():
    """The fork helper itself: a sanity check of what (d) relies on."""
    if not AS_ROOT:
        pytest.skip("setuid to 65534 needs root")
    code, out = _as_nobody(lambda: (print(os.getuid()), 3)[1])
    assert code == 3 and out.strip() == str(NOBODY)

