"""Writing a version's large files safely: array files without memory maps, disk-full failures that name
the file, and sharing unchanged files between versions.

Why no writable memory maps: when the filesystem cannot back a page of a mapped file (full disk, quota,
tmpfs size), touching that page kills the process with SIGBUS: no exception, no message, no cleanup.
``NpyWriter`` preallocates its file (``posix_fallocate``) and fills it with plain writes, so a full disk
is an ``OSError`` (ENOSPC) before or while writing, which the writer cleans up after and reports.

Convention: disk-full failures travel as ``OSError`` (ENOSPC or EDQUOT) whose ``filename`` is the file
being written (``names_full_disk`` converts sqlite's and faiss's errors and fills in missing names); the
indexer turns them into the message its CLI prints (``indexer.disk.explain_failure``).

``disk_bytes`` says what versions that share files take on disk together (each inode counted once).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from store.errors import VersionWriteError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
COPY_CHUNK = 64 << 20  # bytes per write when copying a parent's arrays (16 GB stores, bounded memory)


def _preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes now, so a full disk fails here (ENOSPC) rather than part way through."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        # Filesystems without fallocate support: the plain writes still report ENOSPC.
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


@contextmanager
def names_full_disk(path: Path) -> Iterator[None]:
    """Disk-full failures inside become ``OSError(ENOSPC or EDQUOT, ..., path)``: sqlite's SQLITE_FULL,
    faiss's write errors (whose message carries strerror), and OSErrors from ``write`` (no file name)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS and not exc.filename:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise
    except RuntimeError as exc:
        for code in DISK_FULL_ERRNOS:
            if os.strerror(code) in str(exc):
                raise OSError(code, os.strerror(code), str(path)) from exc
        raise


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """numpy's format 1.0 header, byte for byte what ``np.save`` writes for such an array."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


class NpyWriter:
    """An ``.npy`` file of known dtype and shape, preallocated and written front to back with plain writes
    (never a writable memory map: see the module docstring). Rows come in blocks (``append``) or from
    another array (``copy_from``); leaving the ``with`` block checks that every row was written and
    fsyncs."""

    def __init__(self, path: Path, dtype: Any, shape: tuple[int, ...]) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.rows = 0
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * self.dtype.itemsize
        header = _npy_header(self.dtype, shape)
        self.size = len(header) + shape[0] * self._row_bytes
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by __exit__, or below on failure
        try:
            with names_full_disk(self.path):
                _preallocate(self._fh.fileno(), self.size)
                self._fh.write(header)
        except BaseException:
            self._close_quietly()
            raise

    def append(self, block: np.ndarray) -> None:
        arr = np.ascontiguousarray(block, dtype=self.dtype)
        if arr.shape[1:] != self.shape[1:] or self.rows + arr.shape[0] > self.shape[0]:
            raise VersionWriteError(
                f"internal: block {arr.shape} does not fit {self.path.name} {self.shape} at row {self.rows}"
            )
        if arr.size == 0:  # no rows (e.g. an empty shard): nothing to write
            self.rows += arr.shape[0]
            return
        with names_full_disk(self.path):
            self._fh.write(memoryview(arr).cast("B"))
        self.rows += arr.shape[0]

    def copy_from(self, source: np.ndarray) -> None:
        """All rows of ``source`` (e.g. a parent version's memory-mapped file), in bounded chunks."""
        step = max(1, COPY_CHUNK // max(1, self._row_bytes))
        for start in range(0, source.shape[0], step):
            self.append(source[start : start + step])

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self._close_quietly()
            return
        try:
            if self.rows != self.shape[0]:
                raise VersionWriteError(
                    f"internal: wrote {self.rows} rows of {self.path.name}, expected {self.shape[0]}"
                )
            with names_full_disk(self.path):
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
        finally:
            self._close_quietly()

    def _close_quietly(self) -> None:
        # After a failed write the buffer may still hold bytes that cannot be written either.
        with suppress(OSError):
            self._fh.close()


def write_sparse_zeros(path: Path, dtype: Any, shape: tuple[int, ...]) -> None:
    """An all-zero ``.npy`` of ``shape`` whose data is a hole (header written, file extended): no disk
    space, no writes. For benchmarks that need a store of the real shape, never for real data."""
    dtype = np.dtype(dtype)
    header = _npy_header(dtype, shape)
    size = len(header) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with names_full_disk(path), open(path, "wb") as fh:
        fh.write(header)
        fh.truncate(size)


def link_or_copy(src: Path, dst: Path) -> bool:
    """A hard link of ``src`` at ``dst`` (True), or a copy where links are not possible (False)."""
    dst.parent.mkdir(parents=True, exist_ok=True)  # a file of a nested folder (``store.layout.NESTED_DIRS``)
    try:
        os.link(src, dst)  # published files are immutable, so sharing them between versions is safe
    except OSError:
        shutil.copy2(src, dst)
        return False
    return True


def disk_bytes(*folders: Path) -> int:
    """Bytes allocated to the files under ``folders``, each inode once (versions sharing hard links)."""
    seen: set[int] = set()
    total = 0
    for folder in folders:
        for path in Path(folder).rglob("*"):
            st = path.lstat()
            if path.is_file() and st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total
