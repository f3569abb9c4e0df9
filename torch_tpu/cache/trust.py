"""Which cache directories are trusted, and using them without races.

Loading a cached executable runs machine code, and loading a compile
artifact unpickles it, so every tier (``xla-v1``, ``torch-v1``, the shared
one) reads only from a directory that no other user can change, by one
rule (ssh's, for ``~/.ssh``):

- The cache root and the tier directory in it must be real directories (a
  symbolic link in the tier's place is refused), owned by this user or
  root, and not writable by group or others (a directory made group-writable
  by a umask of 002 is refused too: ``chmod go-w`` it).
- Every directory above the root, from ``/`` down, must pass the same
  check, except that a sticky directory owned by root (``/tmp``) is
  accepted above the root (there nobody else can rename what is in it), but
  never as the root itself. Symbolic links on the way to the root are
  followed only if this user or root owns them, and where they lead is
  checked the same way.
- Entries are opened relative to the tier directory's descriptor, which
  the process holds from the check on, without following links and
  without blocking, and must be regular files owned by this user or root
  and not writable by group or others (checked with fstat after opening).
  Before each read the tier's path is compared with the held directory
  (device and inode): if it was renamed away or replaced, the path is
  checked again from ``/`` and used only if it passes (else the tier is
  dropped with one warning and programs are compiled).

Writes, removals and listings go through the same descriptor, so the cache
tools never act outside the tree they checked.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import weakref

_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))
_FILE_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))
_MAX_LINKS = 40
POSIX = hasattr(os, "getuid") and os.name == "posix"


def problem_with(st: os.stat_result, *, above_root: bool = False) -> str | None:
    """Who may change what `st` describes: None if only this user or root.

    `above_root`: a directory above the cache root, where a sticky directory
    of root's (``/tmp``) is accepted.
    """
    if not POSIX:
        return None
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return "owned by another user"
    if above_root and st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by other users"
    return None


def _components(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _open_root(path: str, create: bool) -> tuple[int | None, str | None]:
    """A descriptor of directory `path`, opened from ``/`` one component at a
    time, each checked (see the module); (None, the problem) if refused."""
    if not {os.open, os.stat, os.mkdir, os.unlink} <= os.supports_dir_fd:
        return None, "no directory descriptors on this platform (the check needs them)"
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    todo = _components(path)
    fd = os.open("/", _DIR_FLAGS)
    where, links = "/", 0
    try:
        problem = problem_with(os.fstat(fd), above_root=bool(todo))
        if problem is not None:
            return None, f"/ is {problem}"
        while todo:
            name = todo.pop(0)
            last = not todo
            try:
                st = _lstat_or_make(name, fd, create)
            except OSError as e:
                return None, f"cannot {'create' if create else 'open'} it: {e.strerror or e}"
            if st is None:
                return None, "it does not exist"
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return None, "too many symbolic links"
                if POSIX and st.st_uid not in (os.getuid(), 0):
                    return None, f"the link {os.path.join(where, name)} is owned by another user"
                target = os.readlink(name, dir_fd=fd)
                todo[:0] = _components(target)
                if target.startswith("/"):
                    os.close(fd)
                    fd, where = os.open("/", _DIR_FLAGS), "/"
                continue
            if not stat.S_ISDIR(st.st_mode):
                what = "cannot create it: " if create else ""
                return None, f"{what}{os.path.join(where, name)} is not a directory"
            new = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd, where = new, os.path.join(where, name)
            problem = problem_with(os.fstat(fd), above_root=bool(todo))
            if problem is not None:
                return None, problem if last else f"{where} is {problem}"
        result, fd = fd, -1
        return result, None
    except OSError as e:
        return None, f"cannot open it: {e.strerror or e}"
    finally:
        if fd >= 0:
            os.close(fd)


def _lstat_or_make(name: str, dir_fd: int, create: bool) -> os.stat_result | None:
    """`name` in directory `dir_fd`, not followed if a link; when it is missing,
    a private (0700) directory made first if `create`, else None."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile by another process: checked like any other
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def _open_tier(root_fd: int, name: str, create: bool) -> tuple[int | None, str | None]:
    """The tier directory `name` in the root: a real directory, never a link."""
    try:
        st = _lstat_or_make(name, root_fd, create)
        if st is None:
            return None, "it does not exist"
        if stat.S_ISLNK(st.st_mode):
            return None, f"{name} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return None, f"{name} is not a directory"
        fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, f"{name} is a symbolic link"
        return None, f"cannot {'create' if create else 'open'} it: {e.strerror or e}"
    problem = problem_with(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        return None, problem
    return fd, None


class TrustedDir:
    """A tier directory that passed the check, held open (see the module).

    `path` is where it was found; `fd` is the directory itself, whatever
    happens to `path` later.
    """

    def __init__(self, root: str, name: str, fd: int):
        self.root = root
        self.name = name
        self.path = os.path.join(root, name)
        self.fd = fd
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)
        # Closed when the last user lets go (never under a thread reading through it).
        weakref.finalize(self, os.close, fd)
        self._lock = threading.Lock()  # scans share the descriptor's offset

    @classmethod
    def open(cls, root: str, name: str, create: bool = False
             ) -> tuple[TrustedDir | None, str | None]:
        """(the checked directory `root`/`name`, None), or (None, why it is refused)."""
        root_fd, problem = _open_root(root, create)
        if root_fd is None:
            return None, problem
        try:
            fd, problem = _open_tier(root_fd, name, create)
        finally:
            os.close(root_fd)
        return (cls(root, name, fd), None) if fd is not None else (None, problem)

    def writable(self) -> bool:
        """Can this process create and remove entries in it?"""
        return os.access(".", os.W_OK | os.X_OK, dir_fd=self.fd)

    def moved(self) -> bool:
        """Is `path` no longer this directory (renamed away, replaced, removed)?"""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident

    # -- entries --------------------------------------------------------------------

    def read(self, name: str) -> tuple[bytes | None, str | None]:
        """(bytes, None), (None, None) when there is no entry, or (None, the problem).

        Never follows a link, never blocks (a FIFO in an entry's place), and
        checks after opening that it is a regular file only this user or
        root may change.
        """
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None, None
        except IsADirectoryError:
            return None, "not a file"
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ELOOP):  # a socket, a link
                return None, "not a file"
            return None, f"cannot read it ({e.strerror or e})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, "not a file"
            problem = problem_with(st)
            if problem is not None:
                return None, problem
            chunks = []
            while True:
                chunk = os.read(fd, max(st.st_size, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks), None
        except OSError as e:
            return None, f"cannot read it ({e.strerror or e})"
        finally:
            os.close(fd)

    def write(self, name: str, blob: bytes) -> None:
        """Write `blob` to a temporary file in the directory, then rename it into place."""
        tmp = f"{name}.tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                         0o600, dir_fd=self.fd)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.unlink(tmp)
            raise

    def touch(self, name: str) -> None:
        """Mark `name` as just used (eviction is least recently used first)."""
        try:
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass

    def unlink(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.fd)
            return True
        except OSError:
            return False

    def remove(self, name: str) -> tuple[bool, str | None]:
        """Remove the file, link or directory tree `name` (a link is removed,
        never followed); (gone, the error if not)."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False, None
        except OSError as e:
            return False, e.strerror or str(e)
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=self.fd)
            else:
                os.unlink(name, dir_fd=self.fd)
        except OSError as e:
            return False, e.strerror or str(e)
        return True, None

    def scan(self) -> list[tuple[str, os.stat_result | None]]:
        """[(name, stat of a regular file, or None for anything else)] in the directory."""
        out: list[tuple[str, os.stat_result | None]] = []
        try:
            with self._lock, os.scandir(self.fd) as it:
                listing = list(it)
        except OSError:
            return out
        for de in listing:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append((de.name, st if stat.S_ISREG(st.st_mode) else None))
        return out
