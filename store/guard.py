"""Guarding the files an opened version reads after its open against being changed in place.

A published version is immutable, but its files can still be truncated or rewritten in place: by hand, or
through another version's hard link to the same inode (``store.version.reuse`` links unchanged files into new
versions). A memory-mapped array whose file shrank kills the whole process with SIGBUS at the first read of
a page past the new end, and Python cannot recover from that inside numpy or faiss: every index the process
serves, and ``/healthz``, would die with it. So every file a version maps (or reads through SQLite or
tantivy after its open) is opened through a ``FileGuard``:

* at open its size is checked against what it must hold (an ``.npy`` file: its header plus shape x
  itemsize) before it is mapped: a damaged file refuses the version (``IndexFormatError`` naming it);
* where the kernel allows it, the guard takes a read *lease* on the file (``F_SETLEASE``, Linux): a process
  that then opens the file for writing or truncates it, through any path or hard link, is held by the
  kernel (up to ``/proc/sys/fs/lease-break-time``, 45 s by default) until the lease is given back, and the
  lease shows as being broken. The service retires the version when it sees that (``problem``, checked per
  request and per poll), waits for its searches to end and closes it, which gives the lease back: the
  truncation happens only once nothing reads the mapping any more. No window is left while the break waits;
* where no lease can be had (the process does not own the files and lacks CAP_LEASE, a file system without
  leases such as NFS), ``problem`` compares each file's size (``fstat`` of the guard's own descriptor, the
  mapped inode whatever happens to the path) with its size at open. Then a truncation that lands while a
  search is reading the file, between its check and its reads, still ends the process: that window is a
  search's length (docs/reference/service.md).

A broken lease notifies its holder by a signal; the guard asks for SIGURG, whose default action is to
ignore it (SIGIO's, the default, ends the process), and learns of the break by asking (``F_GETLEASE``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from store.errors import IndexFormatError

try:  # Linux; elsewhere no lease is taken and sizes are compared
    import fcntl

    _LEASES = all(hasattr(fcntl, n) for n in ("F_SETLEASE", "F_GETLEASE", "F_SETSIG"))
except ImportError:  # pragma: no cover - not Linux
    _LEASES = False

# The signal a broken lease sends: ignored unless handled (SIGIO, the kernel's default, ends the process).
LEASE_SIGNAL = signal.SIGURG


@dataclass
class _Watched:
    path: Path
    fd: int
    size: int  # bytes at open, checked against what the file must hold
    leased: bool


def _take_lease(fd: int) -> bool:
    """A read lease on ``fd``'s file, notified by ``LEASE_SIGNAL``; False where the kernel refuses one."""
    if not _LEASES:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, LEASE_SIGNAL)  # before the lease: a break must never send SIGIO
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:  # EACCES: not the owner, EINVAL: no leases here, EAGAIN: open for writing elsewhere
        return False
    return True


class FileGuard:
    """The files one opened version (or its product channels) reads after its open; thread-safe."""

    def __init__(self) -> None:
        self._files: tuple[_Watched, ...] = ()
        self._lock = threading.Lock()  # guards adding and closing, not ``problem`` (it reads a tuple)

    @property
    def leased(self) -> int:
        """How many of the files hold a lease (the rest are checked by size)."""
        return sum(f.leased for f in self._files)

    def __len__(self) -> int:
        return len(self._files)

    def _open(self, path: Path) -> _Watched:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise IndexFormatError(f"cannot open {path}: {exc}") from exc
        # The lease first: from then on the size checked below cannot change unnoticed.
        leased = _take_lease(fd)
        watched = _Watched(Path(path), fd, os.fstat(fd).st_size, leased)
        with self._lock:
            self._files = (*self._files, watched)
        return watched

    def watch(self, path: Path) -> None:
        """Guard a file read after the open by other code (SQLite, tantivy): its size at open is its size."""
        self._open(Path(path))

    def watch_tree(self, folder: Path) -> None:
        """Guard every regular file under ``folder`` (a tantivy index; lock files, empty, left out)."""
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and not path.is_symlink() and not path.name.startswith("."):
                self.watch(path)

    def map_array(self, path: Path) -> np.ndarray:
        """``np.load(path, mmap_mode="r")``, mapped from the guarded descriptor only after the file's size
        was found to be what its header says (IndexFormatError naming both otherwise: a mapped array past
        its file's end is a SIGBUS at its first read)."""
        path = Path(path)
        watched = self._open(path)
        try:
            with os.fdopen(os.dup(watched.fd), "rb") as fh:
                major, minor = np.lib.format.read_magic(fh)
                if (major, minor) == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
                offset = fh.tell()
                if dtype.hasobject:
                    raise ValueError("an array of Python objects cannot be mapped")
                expected = offset + math.prod(shape) * dtype.itemsize
                if watched.size != expected:
                    raise IndexFormatError(
                        f"{path} is {watched.size} bytes, its header says {shape} {dtype} ({expected} "
                        "bytes): truncated or changed in place"
                    )
                if expected == offset:  # nothing to map (mmap refuses an empty length)
                    return np.zeros(shape, dtype, order="F" if fortran else "C")
                return np.memmap(
                    fh, dtype=dtype, mode="r", shape=shape, order="F" if fortran else "C", offset=offset
                )
        except IndexFormatError:
            self._forget(watched)
            raise
        except (OSError, ValueError, EOFError) as exc:
            self._forget(watched)
            raise IndexFormatError(f"cannot map {path}: {exc}") from exc

    def problem(self) -> str | None:
        """What is wrong with a guarded file now (one ``fcntl`` or ``fstat`` per file), None when nothing:
        a lease being broken (the file is being opened for writing or truncated: the kernel holds that
        until ``close``), or a size other than at open."""
        for f in self._files:
            try:
                if f.leased:
                    if fcntl.fcntl(f.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
                        return f"{f.path.name} is being truncated or opened for writing in place ({f.path})"
                    continue
                size = os.fstat(f.fd).st_size
            except OSError as exc:  # closed under us: the version is being closed
                return f"{f.path.name} cannot be checked ({f.path}): {exc}"
            if size != f.size:
                return f"{f.path.name} is {size} bytes, {f.size} at the open: changed in place ({f.path})"
        return None

    def _forget(self, watched: _Watched) -> None:
        with self._lock:
            self._files = tuple(f for f in self._files if f is not watched)
        self._release(watched)

    @staticmethod
    def _release(watched: _Watched) -> None:
        if watched.leased:  # given back now, not when the last mapping goes: a held truncation goes on
            with contextlib.suppress(OSError):
                fcntl.fcntl(watched.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        with contextlib.suppress(OSError):
            os.close(watched.fd)

    def close(self) -> None:
        """Give the leases back and close the descriptors (after the version's last search)."""
        with self._lock:
            files, self._files = self._files, ()
        for f in files:
            self._release(f)
