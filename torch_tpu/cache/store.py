"""The persistent (on-disk) tier of the compile cache.

What is stored
--------------
JAX already knows how to key, serialize and load a compiled XLA executable:
its persistent compilation cache computes a key from the lowered program
(StableHLO), the compile options (which carry the shardings), the devices,
the backend and jaxlib versions and the XLA flags, and turns an executable
into bytes (`executable.serialize()`) and back (`backend.deserialize_executable`).
Neither step uses pickle. What JAX's file cache lacks is what this module
adds: a checksummed entry format, atomic writes, a single warning and a
memory-only fallback when the directory is unusable, per-tier statistics,
and a size cap with least-recently-used eviction under our own directory.

`DiskStore` therefore implements JAX's small cache interface (`get(key)` /
`put(key, bytes)`) and is installed as JAX's cache object, so every
executable that torch_tpu compiles (eager op executables and compiled
graphs alike, all through `runtime.programs.compile`) is looked up on disk before
XLA compiles it, and written after.

Entry format (one file per entry, ``<sha256>.tpx``)::

    b"TTPUXC01"                          magic and format version (8 bytes)
    uint32 big-endian                    header length
    header (UTF-8 JSON)                  {"key", "size", "sha256", versions...}
    payload                              JAX's compressed executable bytes

The file name is the SHA-256 of JAX's key plus our own additions (torch_tpu,
jax and jaxlib versions, platform, device kind and count, XLA flags). A
read checks the magic, parses the JSON header (plain data, never code),
checks that the stored key and versions are the ones asked for, that the
payload has the announced length and that its SHA-256 matches. Anything
else - truncated, corrupted, or a foreign file under our name - is deleted,
counted, reported by one warning per process, and treated as a miss: the
program is recompiled and the entry rewritten.

Trust model: a serialized executable is machine code for the host or the
accelerator, so loading one is running code from the cache directory. No
pickle is involved (the payload is only handed to XLA's own executable
deserializer after its checksum matched), but the checksum protects against
accidents, not against an attacker who can write the directory. Every tier
therefore uses a directory only if no other user can change it, checked
from ``/`` down to each entry and held open so that the check cannot be
raced (`torch_tpu.cache.trust` has the exact rule): the directories are
created private (mode 0700); one owned by another user, writable by others,
or a symbolic link in the tier's place is refused (memory-only, one
warning); entries are opened relative to the held directory, never through
a link, and must be regular files of this user's or root's. A directory
that is only read-only serves what it holds and writes nothing.

Shared tier: ``TORCH_TPU_SHARED_CACHE_DIR`` names a second, read-only
directory of the same layout (a cache another process wrote, e.g. in CI,
mounted or copied here). `get` asks the local directory, then the shared
one; `put`, eviction and `clear` only ever touch the local one, and reading
a shared entry does not even update its time stamp. The shared directory
passes the same check (owned by this user or root, as is the path to it);
anything else is ignored with one warning.

Directory faults: an entry file is opened without blocking and must be a
regular file (a directory, FIFO, socket or link in its place is removed from
the local directory and the entry written again); `info` counts only regular
entry files and `clear` removes everything in the directory (a link is
removed, never followed). After any failed write the process stops writing
(reads go on), as its one warning says; a directory removed under a running
process is created again.

Writers write a temporary file in the same directory and `os.replace` it
into place, so concurrent writers of one entry both succeed and readers see
either no file or a complete one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import struct
import sys
import threading
import time
import warnings
from typing import Any

from .._version import __version__
from ..runtime.switches import switch_raw, switch_value
from .trust import TrustedDir

MAGIC = b"TTPUXC01"
SUFFIX = ".tpx"
SUBDIR = "xla-v1"
# torch.compile's packages beside it (torch_tpu.compile.persist.artifacts.SUBDIR)
PACKAGES_SUBDIR = "torch-v1"
DEFAULT_MAX_BYTES = 4 << 30


class CacheWarning(UserWarning):
    """A problem with the persistent compile cache (it keeps working without it)."""


_warned: set = set()
_warn_lock = threading.Lock()


def warn_once(kind: str, message: str) -> None:
    with _warn_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(f"torch_tpu compile cache: {message}", CacheWarning, stacklevel=3)


def default_dir() -> str:
    """The user's cache directory for torch_tpu (XDG on Linux)."""
    if sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "torch_tpu")


def configured_dir() -> str | None:
    """TORCH_TPU_CACHE_DIR if set ("" disables the disk tier), else the default."""
    value = switch_raw("TORCH_TPU_CACHE_DIR")
    if value is None:
        return default_dir()
    value = value.strip()
    return os.path.abspath(os.path.expanduser(value)) if value else None


def configured_shared_dir() -> str | None:
    """TORCH_TPU_SHARED_CACHE_DIR: a read-only tier under the local one (None: none)."""
    value = switch_value("TORCH_TPU_SHARED_CACHE_DIR")
    return os.path.abspath(os.path.expanduser(value)) if value else None


def configured_max_bytes() -> int:
    value = switch_value("TORCH_TPU_CACHE_MAX_BYTES")
    if not value:
        return DEFAULT_MAX_BYTES
    try:
        return _parse_size(value)
    except ValueError:
        warn_once("bad-size", f"TORCH_TPU_CACHE_MAX_BYTES={value!r} is not a size; "
                              f"using {DEFAULT_MAX_BYTES} bytes")
        return DEFAULT_MAX_BYTES


def _parse_size(text: str) -> int:
    text = text.strip().upper().replace("IB", "").replace("B", "")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
            break
    return int(float(text) * mult)


def environment() -> dict:
    """What, besides JAX's own key, changes a program: part of every entry's name."""
    import jax
    import jaxlib

    from ..runtime import platform  # lazy: JAX (the cache is in the start-up set)

    try:
        devs = platform.devices()
        kind, count = devs[0].device_kind, len(devs)
        plat = platform.platform()
    except Exception:  # pragma: no cover - no backend at all
        kind, count, plat = "unknown", 0, "unknown"
    return {
        "torch_tpu": __version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": plat,
        "device_kind": kind,
        "device_count": count,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
        # constants folded while compiling flush subnormals as the programs do
        # (runtime.programs.flushing_denormals); entries from before folded them kept
        "folding": "ftz",
    }


class _Stats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.write_errors = 0
        self.corrupt = 0
        self.evictions = 0
        self.shared_hits = 0
        self.bytes_read = 0
        self.bytes_written = 0


class _Local(threading.local):
    def __init__(self):
        # "hit"/"miss"/"write" collected during one compile (None: not collecting)
        self.events: list[str] | None = None
        self.keys: list[str] = []  # the JAX cache keys asked for during that compile


class DiskStore:
    """JAX's cache interface (get/put of executable bytes) over our directory."""

    def __init__(self, root: str | None = None, max_bytes: int | None = None,
                 shared: str | None | bool = True, create: bool = True):
        """`root`: the local directory (None: none); `shared`: the read-only
        shared directory (True: TORCH_TPU_SHARED_CACHE_DIR; None: none);
        `create=False`: a missing directory is reported, not made (the
        command line's `info` and `clear`)."""
        self._lock = threading.RLock()
        self.stats = _Stats()
        self._local = _Local()
        self._env: dict[str, Any] | None = None
        self._env_blob: bytes | None = None
        self.root: str | None = None
        self.path: str | None = None
        self._dir: TrustedDir | None = None      # self.path, held open and checked
        self._shared: TrustedDir | None = None   # self.shared_path, likewise
        self.writable = False
        self.reason = "not configured"
        self.shared_root: str | None = None
        self.shared_path: str | None = None
        self.shared_reason = "not configured"
        self.max_bytes = configured_max_bytes() if max_bytes is None else int(max_bytes)
        self._bytes_estimate: int | None = None
        self.set_dir(root, create=create)
        self.set_shared_dir(configured_shared_dir() if shared is True else (shared or None))

    @property
    def enabled(self) -> bool:
        """Is any directory (local or shared) in use?"""
        return self.path is not None or self.shared_path is not None

    # JAX's CacheInterface has a `_path` attribute (used in its log messages).
    @property
    def _path(self):
        return self.path

    @_path.setter
    def _path(self, value):  # pragma: no cover - JAX never sets it on ours
        pass

    # -- configuration -----------------------------------------------------

    def set_dir(self, root: str | None, create: bool = True) -> None:
        """Use `root` (None or "" disables the disk tier) if it passes the
        trust check (`torch_tpu.cache.trust`); `create`: make it if missing."""
        with self._lock:
            self.root = root or None
            self.path = None
            self._dir = None
            self.writable = False
            self._bytes_estimate = None
            if not root:
                self.reason = "disabled"
                return
            d, problem = TrustedDir.open(root, SUBDIR, create=create)
            if d is None:
                self.reason = problem or "refused"
                if create:
                    warn_once(f"dir:{root}", f"cannot use {root!r} ({problem}); compiled "
                                             "programs are kept in memory only")
                return
            self._dir, self.path = d, d.path
            self.writable = d.writable()
            self.reason = "ok" if self.writable else "read-only"
            if not self.writable:
                # A read-only directory still serves what it holds.
                warn_once(f"dir:{root}", f"{root!r} is read-only: programs cached in it are "
                                         "loaded, new ones are kept in memory only")

    def _checked(self, shared: bool) -> TrustedDir | None:
        """The local (or shared) directory, checked again from ``/`` if its path
        no longer leads to the directory held open (renamed away, replaced,
        removed): a replacement is used only if it passes the check, else the
        tier is dropped with one warning and programs are compiled."""
        d = self._shared if shared else self._dir
        if d is None or not d.moved():
            return d
        with self._lock:
            if d is not (self._shared if shared else self._dir):
                return self._shared if shared else self._dir  # another thread did it
            new, problem = TrustedDir.open(d.root, SUBDIR, create=not shared)
            if new is not None:
                if shared:
                    self._shared = new
                else:
                    self._dir, self.writable = new, self.writable and new.writable()
                    self._bytes_estimate = None
                return new
            tier = "shared" if shared else "local"
            warn_once(f"moved:{d.path}", f"the {tier} cache directory {d.path!r} was replaced "
                                         f"while this process ran and is refused ({problem}); "
                                         "programs are compiled")
            if shared:
                self._shared, self.shared_path = None, None
                self.shared_reason = problem or "refused"
            else:
                self._dir, self.path, self.writable = None, None, False
                self.reason = problem or "refused"
            return None

    def set_shared_dir(self, root: str | None) -> None:
        """Serve hits from `root` too, read-only, after the local directory (None: none).

        `root` is a cache directory written by another process (e.g. a CI job
        run with TORCH_TPU_CACHE_DIR=root) and mounted or copied here. Nothing
        in it is ever written, touched or deleted. Like the local directory it
        must be owned by this user or root and not writable by group or
        others; a shared entry file that is not is ignored.
        """
        with self._lock:
            self.shared_root = root or None
            self.shared_path = None
            self._shared = None
            if not root:
                self.shared_reason = "disabled"
                return
            d, problem = TrustedDir.open(root, SUBDIR)
            if d is None:
                self.shared_reason = problem or "refused"
                warn_once(f"shared:{root}", f"cannot use the shared directory {root!r} "
                                            f"({problem}); it serves no programs")
                return
            if self._dir is not None and d.ident == self._dir.ident:
                self.shared_reason = "same as the local directory"
                return
            self._shared, self.shared_path = d, d.path
            self.shared_reason = "ok (read-only)"

    def set_max_bytes(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = int(max_bytes)
        self._evict(0)

    # -- event tracking (which tier served the current compile) -----------

    def begin(self):
        previous = (self._local.events, self._local.keys)
        self._local.events = []
        self._local.keys = []
        return previous

    def end(self, previous):
        """The events of the compile begun by `begin` (and its JAX keys, in
        `last_keys`)."""
        events = self._local.events or []
        self.last_keys = list(self._local.keys or ())
        self._local.events, self._local.keys = previous
        return events

    @property
    def last_keys(self):
        return getattr(self._local, "last", [])

    @last_keys.setter
    def last_keys(self, keys):
        self._local.last = keys

    def note_hit(self, key: str) -> None:
        """A hit for the compile this thread has begun, on an entry another
        thread read for it (`torch_tpu.cache.prefetch`; that read was counted
        in `stats.hits` already): the compile is served by the disk tier."""
        self._event("hit", key)

    def _event(self, what, key=None):
        ev = self._local.events
        if ev is not None:
            ev.append(what)
            if key is not None and key not in self._local.keys:
                self._local.keys.append(key)

    # -- keys --------------------------------------------------------------

    def _environment_blob(self) -> bytes:
        if self._env_blob is None:
            self._env = environment()
            self._env_blob = json.dumps(self._env, sort_keys=True).encode()
        return self._env_blob

    def _name_for(self, key: str) -> str:
        digest = hashlib.sha256(key.encode() + b"\0" + self._environment_blob()).hexdigest()
        return digest + SUFFIX

    def file_for(self, key: str) -> str:
        """The local file of `key` (its name is the same in the shared directory)."""
        return os.path.join(self.path or os.path.join(self.root or "", SUBDIR),
                            self._name_for(key))

    # -- the interface JAX calls --------------------------------------------

    def get(self, key: str, count: bool = True) -> bytes | None:
        """The payload stored under `key`, or None.

        The local directory is asked first, then the shared one. `count=False`
        (the graph tier's small index entries) leaves the executable
        statistics and the per-compile events alone.
        """
        if not self.enabled:
            return None
        name = self._name_for(key)
        for shared in (False, True):
            d = self._checked(shared)
            if d is None:
                continue
            blob, problem = d.read(name)
            if blob is None:
                if problem is not None:
                    self._bad_entry(d, name, problem, shared)
                continue  # no such entry, or an unreadable one
            payload, problem = self._decode(blob, key)
            if problem is not None:
                self._bad_entry(d, name, problem, shared)
                continue
            if count:
                with self._lock:
                    self.stats.hits += 1
                    self.stats.bytes_read += len(blob)
                    if shared:
                        self.stats.shared_hits += 1
                self._event("hit", key)
            if not shared:
                d.touch(name)  # least-recently-used order for eviction
            return payload
        if count:
            self._miss(key)
        return None

    def _bad_entry(self, d: TrustedDir, name: str, problem: str, shared: bool) -> None:
        """An entry that cannot be used: counted, reported once, removed if local."""
        if problem.startswith("cannot read"):
            warn_once("read", f"{problem} ({os.path.join(d.path, name)}); recompiling")
            return
        with self._lock:
            self.stats.corrupt += 1
        where = "the shared directory's" if shared else "a"
        warn_once("shared-corrupt" if shared else "corrupt",
                  f"ignored {where} bad cache entry {name} ({problem}); "
                  "the program is recompiled")
        if not shared and self.writable:
            d.remove(name)
            self._bytes_estimate = None

    def put(self, key: str, value: bytes, count: bool = True) -> None:
        """Store `value` under `key` in the local directory (never the shared one).

        A write failure (disk full, file too large, permissions, ...) turns
        writing off for the rest of the process, with one warning; reads go
        on. An entry path taken by something else (a directory) is replaced,
        and a directory removed under a running process is created again.
        """
        d = self._checked(False)
        if not (d is not None and self.writable):
            return
        value = bytes(value)
        self._environment_blob()  # the versions go in the header (a put may come first)
        blob = encode_entry(key, self._env or {}, value, created=time.time())
        fname = self.file_for(key)
        for attempt in (0, 1):
            try:
                write_atomic(fname, blob, d)
                break
            except OSError as e:
                if attempt == 0 and self._heal(d, fname, e):
                    d = self._dir or d
                    continue
                self._write_failed(e)
                return
        with self._lock:
            if count:
                self.stats.writes += 1
                self.stats.bytes_written += len(blob)
            if self._bytes_estimate is not None:
                self._bytes_estimate += len(blob)
        if count:
            self._event("write", key)
        self._evict(len(blob))

    def _heal(self, d: TrustedDir, fname: str, e: OSError) -> bool:
        """Remove what made writing `fname` fail, if it can be; True to retry."""
        if e.errno == errno.ENOENT:
            # The directory went away (removed by hand): make it again.
            return self._checked(False) not in (None, d)
        name = os.path.basename(fname)
        try:
            st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            # A directory (or other non-file) sits at the entry's path.
            with self._lock:
                self.stats.corrupt += 1
            return d.remove(name)[0]
        return False

    def _write_failed(self, e: OSError) -> None:
        with self._lock:
            self.stats.write_errors += 1
            self.writable = False
        what = ("the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else f"cannot write ({e.strerror or e})")
        warn_once("write", f"{what} in {self.root!r}; new programs are kept in memory "
                           "only for the rest of this process")

    def _miss(self, key=None):
        with self._lock:
            self.stats.misses += 1
        self._event("miss", key)

    def _decode(self, blob: bytes, key: str) -> tuple[bytes | None, str | None]:
        """(payload, None) for a sound entry of `key`, else (None, what is wrong)."""
        return decode_entry(blob, key, self._env or {})

    # -- size, eviction, clearing ---------------------------------------------

    @staticmethod
    def _scan(d: TrustedDir | None
              ) -> tuple[list[tuple[str, int, float]], list[tuple[str, float | None]]]:
        """([(name, size, mtime)] of the entries, [(name, mtime or None) of
        anything else]) in `d`.

        An entry is a regular file named like one; anything else (a directory,
        a link or a foreign file in its place, a temporary file of a killed
        writer) is not counted.
        """
        out: list[tuple[str, int, float]] = []
        other: list[tuple[str, float | None]] = []
        for name, st in d.scan() if d is not None else ():
            if st is not None and name.endswith(SUFFIX):
                out.append((name, st.st_size, st.st_mtime))
            else:
                other.append((name, st.st_mtime if st is not None else None))
        return out, other

    def entries(self):
        """[(name, size, mtime)] of the entries in the local directory."""
        d = self._dir
        out, other = self._scan(d)
        if d is not None and self.writable:
            now = time.time()
            for name, mtime in other:
                if ".tmp-" in name and mtime is not None and now - mtime > 3600:
                    d.unlink(name)  # left behind by a killed writer
        return out

    def disk_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def _evict(self, added: int) -> None:
        if self.path is None or not self.writable or self.max_bytes <= 0:
            return
        with self._lock:
            if self._bytes_estimate is not None and self._bytes_estimate <= self.max_bytes:
                return
            entries = self.entries()
            total = sum(size for _, size, _ in entries)
            d = self._dir
            if total > self.max_bytes and d is not None:
                # Oldest first, down to 90% of the cap so that eviction is rare.
                target = int(self.max_bytes * 0.9)
                for name, size, _ in sorted(entries, key=lambda e: e[2]):
                    if total <= target:
                        break
                    if d.unlink(name):
                        total -= size
                        self.stats.evictions += 1
            self._bytes_estimate = total

    def clear(self) -> int:
        """Empty the local directory: every entry, and anything else in it that
        is not a valid entry (directories or foreign files under entry names,
        temporary files), and the compile packages beside it. The shared
        directory is never touched. Returns the number of items removed."""
        return self.clear_report()[0]

    def clear_report(self) -> tuple[int, int, str | None]:
        """`clear`, returning (items removed, items left, why the first one was
        left). Everything is removed through the checked directories' held
        descriptors: a link is removed, never followed; a tier directory that
        fails the trust check (``torch-v1`` too) is left alone, and counted."""
        removed, left, why = self.clear_counts()
        return sum(removed.values()), left, why

    def clear_counts(self) -> tuple[dict[str, int], int, str | None]:
        """`clear_report` with the items removed counted by kind, the kinds
        `info` counts: {'entries': program files, 'other_files': anything else
        in the program tier, 'packages': compile-package items beside it}."""
        removed = {"entries": 0, "other_files": 0, "packages": 0}
        left, why = 0, None
        with self._lock:
            local = self._checked(False)
            tiers: list[tuple[TrustedDir, str | None]] = []
            if local is not None:
                tiers.append((local, None))
            # PyTorch's compile packages (torch_tpu.compile.persist.artifacts) beside it.
            if local is not None and self.root:
                packages, problem = TrustedDir.open(self.root, PACKAGES_SUBDIR)
                if packages is not None:
                    tiers.append((packages, "packages"))
                elif problem != "it does not exist":
                    left, why = left + 1, f"{PACKAGES_SUBDIR}: {problem}"
            for d, kind in tiers:
                for name, st in d.scan():
                    gone, error = d.remove(name)
                    entry = st is not None and name.endswith(SUFFIX)
                    removed[kind or ("entries" if entry else "other_files")] += gone
                    if not gone and error is not None:
                        left, why = left + 1, why or error
            self._bytes_estimate = None
        return removed, left, why

    def info(self) -> dict:
        entries, other = self._scan(self._dir)
        shared, _ = self._scan(self._shared)
        packages = None
        if self._dir is not None and self.root:
            packages, _ = TrustedDir.open(self.root, PACKAGES_SUBDIR)
        s = self.stats
        return {
            "enabled": self.enabled,
            "writable": self.path is not None and self.writable,
            "dir": self.root,
            "status": self.reason,
            "hits": s.hits,
            "misses": s.misses,
            "writes": s.writes,
            "write_errors": s.write_errors,
            "corrupt": s.corrupt,
            "evictions": s.evictions,
            "entries": len(entries),
            "bytes": sum(size for _, size, _ in entries),
            "other_files": len(other),
            "packages": len(packages.scan()) if packages is not None else 0,
            "max_bytes": self.max_bytes,
            "shared_dir": self.shared_root,
            "shared_status": self.shared_reason,
            "shared_entries": len(shared),
            "shared_bytes": sum(size for _, size, _ in shared),
            "shared_hits": s.shared_hits,
        }


def encode_entry(key: str, env: dict, payload: bytes, *, magic: bytes = MAGIC,
                 **extra: Any) -> bytes:
    """An entry file's bytes: the magic, the header's length, a JSON header (the
    key, the versions in `env`, the payload's size and SHA-256, `extra`), then
    the payload. One format for the program tiers and the compile artifacts."""
    header: dict[str, Any] = dict(env)
    header.update(extra, key=key, size=len(payload),
                  sha256=hashlib.sha256(payload).hexdigest())
    hbytes = json.dumps(header, sort_keys=True).encode()
    return magic + struct.pack(">I", len(hbytes)) + hbytes + payload


def decode_entry(blob: bytes, key: str, env: dict, *, magic: bytes = MAGIC,
                 what: str = "cache entry", of: str = "program",
                 stale: str = "") -> tuple[bytes | None, str | None]:
    """(payload, None) for a sound entry of `key` written under `env`, else
    (None, what is wrong): truncation, foreign bytes, another key, another
    version, a size or checksum mismatch. `what`/`of`/`stale` word the problem
    for the tier that reads it."""
    start = len(magic) + 4
    if len(blob) < start:
        return None, "truncated"
    if blob[:len(magic)] != magic:
        return None, f"not a torch_tpu {what}"
    (hlen,) = struct.unpack(">I", blob[len(magic):start])
    if hlen > 1 << 20 or start + hlen > len(blob):
        return None, "truncated header"
    try:
        header = json.loads(blob[start:start + hlen].decode())
    except (UnicodeDecodeError, ValueError):
        return None, "unreadable header"
    if not isinstance(header, dict):
        return None, "unreadable header"
    if header.get("key") != key:
        return None, f"entry of another {of}"
    for name, want in env.items():
        if header.get(name) != want:
            return None, f"{stale}written by another {name} ({header.get(name)!r})"
    payload = blob[start + hlen:]
    if header.get("size") != len(payload):
        return None, "truncated payload"
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None, "checksum mismatch"
    return payload, None


def write_atomic(fname: str, blob: bytes, where: TrustedDir | None = None) -> None:
    """Write `blob` to a temporary file beside `fname`, then rename it into place;
    relative to `where`'s held descriptor when given (the tiers' writes)."""
    if where is not None:
        where.write(os.path.basename(fname), blob)
        return
    tmp = f"{fname}.tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, fname)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
