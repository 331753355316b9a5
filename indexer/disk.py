"""Disk space of index operations: the pre-flight estimate, array files written without memory maps, and
disk-full failures explained as a ``DiskSpaceError`` that names the path and the space.

Why no writable memory maps: when the filesystem cannot back a page of a mapped file (full disk, quota,
tmpfs size), touching that page kills the process with SIGBUS: no exception, no message, no cleanup.
``NpyWriter`` preallocates its file (``posix_fallocate``) and fills it with plain writes, so a full disk
is an ``OSError`` (ENOSPC) before or while writing, which the builder cleans up after and reports.

Convention: disk-full failures travel as ``OSError`` (ENOSPC or EDQUOT) whose ``filename`` is the file
being written (``names_full_disk`` converts sqlite's and faiss's errors and fills in missing names);
``explain_failure`` turns them into the message the CLI prints.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from ccrk_settings import Settings
from indexer.ann import choose_index
from indexer.errors import BuildError, DiskSpaceError
from indexer.sources import SourceItem

if TYPE_CHECKING:
    from model.runtime import Encoder

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Headroom over the estimate: filesystem metadata, sqlite page slack, the estimate's own error.
HEADROOM_FRACTION = 0.02
HEADROOM_MIN = 1 << 20
COPY_CHUNK = 64 << 20  # bytes per write when copying a parent's arrays (16 GB stores, bounded memory)
NPY_HEADER = 128  # numpy's format 1.0 header, padded
SHARD_OVERHEAD = 4096  # zip directory and array headers of one shard file
SHARD_ITEM_OVERHEAD = 9  # ok flag + empty kind and detail (4-byte unicode) per item
MANIFEST_BYTES = 64 << 10  # manifest.json with tuned parameters and calibration (skipped items extra)
METADATA_SAMPLE = 2000  # items whose metadata rows are measured to estimate metadata.sqlite
SQLITE_PAGE = 4096


def human(n: float) -> str:
    """Bytes for people: '812 bytes', '3.4 MiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``path`` (or its nearest existing
    parent folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it is gone)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


# -- estimates -------------------------------------------------------------------------------------------


@dataclass
class SpaceNeed:
    """Bytes an operation will still write under an index folder, by part (for the message)."""

    parts: dict[str, int]

    @property
    def headroom(self) -> int:
        return max(HEADROOM_MIN, int(sum(self.parts.values()) * HEADROOM_FRACTION))

    @property
    def total(self) -> int:
        return sum(self.parts.values()) + self.headroom

    def describe(self) -> str:
        shown = [f"{k} {human(v)}" for k, v in self.parts.items() if v]
        return ", ".join([*shown, f"headroom {human(self.headroom)}"])


def rerank_bytes_per_item(tokens: int, width: int, rerank_dtype: str) -> int:
    """One image's patch tokens in the re-rank store: fp16, or int8 plus a float32 scale per token."""
    if tokens == 0:
        return 0
    return tokens * width * 2 if rerank_dtype == "fp16" else tokens * width + tokens * 4


def shard_bytes(items: int, shards: int, d: int, tokens: int, width: int, rerank_dtype: str) -> int:
    """Shard files (``indexer.shards``) for ``items`` items in ``shards`` shards: the same arrays as the
    version, uncompressed, plus per-item flags and per-file headers."""
    per_item = d * 4 + rerank_bytes_per_item(tokens, width, rerank_dtype) + SHARD_ITEM_OVERHEAD
    return items * per_item + shards * SHARD_OVERHEAD


def metadata_bytes(items: Sequence[SourceItem], total: int) -> int:
    """metadata.sqlite for ``total`` rows, from a sample of ``items``: each row's text in the table, its id
    again in the unique index, each field value again in that field's index; B-tree pages are taken as
    2/3 full (splits leave them half to completely full)."""
    if total == 0 or not items:
        return 8 * SQLITE_PAGE
    sample = items[:: max(1, len(items) // METADATA_SAMPLE)][:METADATA_SAMPLE]
    names: set[str] = set()
    row_bytes = 0
    for item in sample:
        names.update(item.fields)
        text = json.dumps(item.fields, ensure_ascii=False)
        row_bytes += 2 * len(item.id.encode()) + len(str(item.path).encode()) + len(text.encode()) + 24
        row_bytes += sum(len(str(v).encode()) + 12 for v in item.fields.values())
    # Schema, the two tables' root pages and one root page per field index.
    fixed = (8 + min(len(names), 64)) * SQLITE_PAGE
    return int(fixed + row_bytes / len(sample) * total * 1.5)


def version_parts(
    n: int, d: int, tokens: int, width: int, rerank_dtype: str, *, index_bytes: int, metadata: int
) -> dict[str, int]:
    """The files of a version with ``n`` rows, by part (``SpaceNeed.parts``)."""
    parts = {"embeddings": NPY_HEADER + n * d * 4}
    if tokens:
        headers = NPY_HEADER * (2 if rerank_dtype == "int8" else 1)
        parts["re-rank store"] = headers + n * rerank_bytes_per_item(tokens, width, rerank_dtype)
    parts["index"] = index_bytes
    parts["metadata"] = metadata
    parts["manifest"] = MANIFEST_BYTES
    return parts


def token_shape(encoder: Encoder, image_size: int) -> tuple[int, int]:
    """(T, W) of the encoder's patch tokens, from one blank image (the space check needs them before any
    shard exists); (0, 0) for a model without a re-rank store."""
    blank = np.zeros((1, 3, image_size, image_size), dtype=np.uint8)
    tokens = np.asarray(encoder.encode_images(blank).tokens)
    return (int(tokens.shape[1]), int(tokens.shape[2])) if tokens.ndim == 3 and tokens.size else (0, 0)


def index_bytes(n: int, d: int, settings: Settings, factory: str | None) -> int:
    """The faiss index file for ``n`` vectors as ``choose_index`` plans it."""
    try:
        plan = choose_index(
            n,
            d,
            exact_max_items=settings.exact_max_items,
            memory_budget_mb=settings.memory_budget_mb,
            factory=factory,
        )
    except ValueError as exc:  # e.g. over the memory budget: the build's own message, not a traceback
        raise BuildError(f"cannot build index {factory or ''}: {str(exc).splitlines()[0]}") from exc
    return plan.estimated_bytes or 4 * n * d  # a factory override has no estimate: a flat index's size


def version_need(
    items: Sequence[SourceItem],
    *,
    d: int,
    tokens: int,
    width: int,
    rerank_dtype: str,
    index: int,
    pending: tuple[int, int] | None = None,
    parent_rows: int = 0,
    parent_metadata: int = 0,
) -> SpaceNeed:
    """What writing a version with ``items`` as new rows needs: after ``parent_rows`` copied rows whose
    metadata.sqlite has ``parent_metadata`` bytes (add), and with ``pending`` (items, shards) still to
    encode first."""
    parts: dict[str, int] = {}
    if pending is not None:
        parts["encoded shards"] = shard_bytes(*pending, d, tokens, width, rerank_dtype)
    metadata = parent_metadata + metadata_bytes(items, len(items))
    n = parent_rows + len(items)
    parts.update(version_parts(n, d, tokens, width, rerank_dtype, index_bytes=index, metadata=metadata))
    return SpaceNeed(parts)


def check_free_space(directory: Path, need: SpaceNeed, what: str) -> None:
    """Refuse (DiskSpaceError) before writing when ``need`` does not fit on the filesystem of
    ``directory``."""
    free = free_bytes(directory)
    if free < need.total:
        raise DiskSpaceError(
            f"not enough free space in {directory} for {what}: it needs about {human(need.total)} "
            f"({need.describe()}), {human(free)} is free there"
        )


# -- writing ---------------------------------------------------------------------------------------------


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
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, header)
        self.size = len(buf.getvalue()) + shape[0] * self._row_bytes
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by __exit__, or below on failure
        try:
            with names_full_disk(self.path):
                _preallocate(self._fh.fileno(), self.size)
                self._fh.write(buf.getvalue())
        except BaseException:
            self._close_quietly()
            raise

    def append(self, block: np.ndarray) -> None:
        arr = np.ascontiguousarray(block, dtype=self.dtype)
        if arr.shape[1:] != self.shape[1:] or self.rows + arr.shape[0] > self.shape[0]:
            raise BuildError(
                f"internal: block {arr.shape} does not fit {self.path.name} {self.shape} at row {self.rows}"
            )
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
                raise BuildError(
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


# -- failures --------------------------------------------------------------------------------------------


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, DiskSpaceError) or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS)


def explain_failure(
    exc: BaseException,
    index_dir: Path,
    need: SpaceNeed | None,
    current: str | None,
    kept: Sequence[Path],
    freed: int = 0,
) -> DiskSpaceError | None:
    """The message for a failure caused by a full disk (None for other failures): what could not be
    written, the space needed and free, that CURRENT is unchanged, and what was removed or kept."""
    if isinstance(exc, DiskSpaceError):
        head = str(exc)
    elif isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        what = "no space left on the device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        head = f"{what} writing {exc.filename}" if exc.filename else f"{what} under {index_dir}"
        if need is not None:
            head += f": this operation needs about {human(need.total)} in {index_dir} ({need.describe()})"
        head += f", {human(free_bytes(index_dir))} is free there now"
    else:
        return None
    tail = "Nothing was published, " + (
        f"CURRENT still names {current}" if current else "the index has no published version"
    )
    if freed:
        tail += (
            f"; its {human(freed)} of encoded shards were removed to free the space (a re-run encodes again)"
        )
    if kept:
        listing = ", ".join(f"{p} ({human(tree_bytes(p))})" for p in kept)
        tail += (
            f"; the encoded shards are kept so that a re-run resumes without encoding again: {listing} "
            "(delete to free that space)"
        )
    return DiskSpaceError(
        f"{head}. {tail}. Free space there, or build under another --index-root (CCRK_INDEX_ROOT)"
    )
