"""Disk space of index operations: the pre-flight estimate, and disk-full failures explained as a
``DiskSpaceError`` that names the path and the space.

Writing a version's files so that a full disk is an error naming the file, never a SIGBUS (array files
without writable memory maps, ``names_full_disk``), is the store's (``store.files``); the estimate of what a
version needs, the refusal before writing, and the message after a failure are the indexer's, here.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ccrk_settings import Settings
from indexer.ann import choose_index
from indexer.errors import BuildError, DiskSpaceError
from indexer.sources import SourceItem
from store.files import DISK_FULL_ERRNOS

if TYPE_CHECKING:
    from model.runtime import Encoder

# Headroom over the estimate: filesystem metadata, sqlite page slack, the estimate's own error.
HEADROOM_FRACTION = 0.02
HEADROOM_MIN = 1 << 20
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


_FIELDS_JSON = json.JSONEncoder(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False), built once


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
        text = _FIELDS_JSON.encode(item.fields)
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
