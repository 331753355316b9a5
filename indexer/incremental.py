"""A full build at the cost of what changed: items whose image bytes are those of a row of CURRENT (same
content digest, vectors stored under the same reuse key: model fingerprint and storage options) keep that
row's stored vectors; only the others are encoded.

    plan_reuse      digest every item's image, look it up in CURRENT's stored vectors
    (``store.version.reuse``),
                    check each reused row against its stored checksum (a mismatch is encoded again)
    encode          the items left (``indexer.pipeline.Operation.encode``, resumable as ever: the work
                    folder is keyed by exactly these items, and CURRENT does not change until publishing)
    write_rows      the version's rows in manifest order, from the stored rows and the new shards, with
                    their digests; when every row is the parent's own row in order (nothing new, changed or
                    removed: a metadata-only change) the arrays are hard links to the parent's instead
    ann_index       the parent's index linked (same rows), its HNSW graph extended (rows only appended,
                    recall@10 measured against exact search reaches the target), else built anew from the
                    staged vectors: never by encoding

Vectors are the model's, so a reused row is byte for byte what encoding the image again would store
(up to the runtime's batch-size effects in the last bits, which a ``--force`` build has as well).

A small change is written as segments instead (``indexer.segments``, which uses the plan and rows of this
module). Under 500 lines: the reuse plan, the rows it yields and the ANN index that follows them
are one story, told in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ccrk_settings import Settings
from indexer.ann import EF_GRID, IndexPlan, choose_index, extend_hnsw
from indexer.pipeline import write_ann_index
from indexer.report import BuildReport, mismatch_note
from indexer.shards import ShardStore
from indexer.sources import SourceItem
from store.errors import IndexFormatError
from store.layout import (
    EMBEDDINGS_FILE,
    IMAGE_DIGESTS_FILE,
    IMAGE_STATS_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    METADATA_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    ROW_DIGESTS_FILE,
    index_dir,
)
from store.version.manifest import IndexManifest
from store.version.metadata import StoredRow, read_metadata
from store.version.reuse import (
    DIGEST_BYTES,
    STAT_COLUMNS,
    FileStats,
    KnownDigests,
    StoredVectors,
    image_digest,
    image_stat,
    row_digests,
    stat_key,
    write_reuse_digests,
    write_stats,
)
from store.version.versions import current_version
from store.version.writer import StagedFiles, VersionArrays, VersionWriter

RUN = 4096  # rows written per block
WORK_KEY = "work_key"  # build_params: the work folder of the build's encoding (removed once published)
ANN_LINKED = "index_linked_from"  # build_params: the version whose index.faiss this one shares
# build_params: what a version's tuning and quality measurements depend on besides its vectors and index
# (the captioned rows and their captions, the recall target); equal keys and shared arrays and index:
# the measurements are taken over (``measured_parent``).
QUALITY_KEY = "quality_key"
ARRAY_FILES = (
    EMBEDDINGS_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    IMAGE_DIGESTS_FILE,
    ROW_DIGESTS_FILE,
    IMAGE_STATS_FILE,
)


@dataclass
class ReusePlan:
    """Which items keep a stored row of CURRENT (``parent_row`` >= 0) and which are encoded (-1)."""

    digests: np.ndarray  # (n, 16) uint8 content digest of each item's image (zeros: unreadable)
    parent_row: np.ndarray  # (n,) int64
    stored: StoredVectors | None = None
    stats: np.ndarray | None = None  # (n, 5) int64 file stats (``store.version.reuse.image_stat``)
    parent_version: str | None = None
    new: int = 0  # ids CURRENT does not hold
    changed: int = 0  # ids CURRENT holds with other image bytes
    removed: int = 0  # live ids of CURRENT the sources no longer hold
    mismatched: list[str] = field(default_factory=list)  # ids whose stored row failed its checksum
    why_not: str = ""  # why nothing is reused, when so
    live: dict[str, int] = field(default_factory=dict)  # CURRENT's live ids: their (global) rows
    # CURRENT's metadata per segment, fields as stored (not parsed: carried over or compared as text)
    parent_rows: list[list[StoredRow]] = field(default_factory=list)

    @property
    def to_encode(self) -> np.ndarray:
        return np.flatnonzero(self.parent_row < 0)

    @property
    def reused(self) -> int:
        return int((self.parent_row >= 0).sum())

    def close(self) -> None:
        if self.stored is not None:
            self.stored.close()


def digest_images(items: Sequence[SourceItem], workers: int = 4) -> np.ndarray:
    """(n, 16) uint8 content digests of the items' images."""
    return digest_and_stat(items, workers=workers)[0]


def digest_and_stat(
    items: Sequence[SourceItem],
    known: KnownDigests | None = None,
    workers: int = 4,
    stats: FileStats | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(n, 16) uint8 content digests of the items' images and (n, 5) int64 stats of their files, taken
    before hashing (``store.version.reuse.image_stat``; zeros: not recorded; ``stats``: those of the items'
    images, taken already). A file whose stats are those recorded for a row of ``known`` is the very file
    hashed before: its digest is that row's, not read again. Hashing releases the GIL: threads suffice."""
    n = len(items)
    out = np.zeros((n, DIGEST_BYTES), np.uint8)
    taken: list[tuple[int, ...] | None] = [None] * n
    from_row = np.full(n, -1, np.int64)
    by_stat = known.rows_by_stat() if known is not None else {}
    if stats is not None and len(stats.stats) != n:
        raise IndexFormatError(f"internal: {len(stats.stats)} file stats for {n} items")
    now = stats.now_ns if stats is not None else time.time_ns()

    def digest_range(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            st = image_stat(items[i].path, now, stats.stats[i] if stats is not None else None)
            if st is not None:
                row = by_stat.get(stat_key(st))
                if row is not None:
                    from_row[i], taken[i] = row, st
                    continue
            digest = image_digest(items[i].path)
            if digest is not None:
                out[i] = np.frombuffer(digest, np.uint8)
                taken[i] = st

    threads = max(1, min(workers, os.cpu_count() or 1))
    step = max(1, -(-n // threads))  # one contiguous range per thread: no future per file
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for done in [pool.submit(digest_range, lo, min(lo + step, n)) for lo in range(0, n, step)]:
            done.result()
    hit = np.flatnonzero(from_row >= 0)
    if hit.size:
        assert known is not None
        out[hit] = known.images[from_row[hit]]
    zeros = (0,) * STAT_COLUMNS
    stats = np.array([st or zeros for st in taken], dtype=np.int64).reshape(n, STAT_COLUMNS)
    return out, stats


def plan_reuse(
    root: Path,
    name: str,
    items: Sequence[SourceItem],
    key: str,
    *,
    why_not: str = "",
    stats: FileStats | None = None,
) -> ReusePlan:
    """Look the items' images up in CURRENT of index ``name`` (vectors stored under reuse ``key``).
    ``why_not``: reuse is off for this build (--force, shards); everything is encoded but the
    counts of new, changed and removed items are still reported. ``stats``: the items' image files'
    stats, taken already (``digest_and_stat``)."""
    plan = ReusePlan(np.zeros((len(items), DIGEST_BYTES), np.uint8), np.full(len(items), -1, np.int64))
    current = current_version(root, name)
    if current is None:
        plan.digests, plan.stats = digest_and_stat(items, stats=stats)
        plan.new, plan.why_not = len(items), "no published version to reuse from"
        return plan
    path = index_dir(root, name) / current
    plan.parent_version = current
    try:
        manifest = IndexManifest.load(path / MANIFEST_FILE)
        stored = StoredVectors.open(path, manifest, key)
        folders = (
            [path / s["dir"] for s in manifest.sharding.get("shards", [])] if manifest.is_sharded else [path]
        )
        plan.parent_rows = [read_metadata(folder / METADATA_FILE, raw=True) for folder in folders]
    except IndexFormatError as exc:
        plan.digests, plan.stats = digest_and_stat(items, stats=stats)
        plan.new, plan.why_not = len(items), f"CURRENT ({current}) cannot be read for reuse: {exc}"
        return plan
    plan.digests, plan.stats = digest_and_stat(items, stored, stats=stats)
    digests = plan.digests
    live: dict[str, int] = {}
    offset = 0
    for seg_rows in plan.parent_rows:
        live.update((item_id, offset + row) for row, item_id, _, _, deleted in seg_rows if not deleted)
        offset += len(seg_rows)
    plan.live = live
    # Each item's own live row of CURRENT (-1: a new id); ids are unique, so each live row is one item's.
    own = np.fromiter((live.get(it.id, -1) for it in items), dtype=np.int64, count=len(items))
    held = own >= 0
    plan.new = int((~held).sum())
    plan.removed = len(live) - int(held.sum())
    if stored is None:
        plan.why_not = why_not or (
            f"CURRENT ({current}) holds no reusable vectors (hash-sharded, written before digests existed, "
            "or with another model or storage options)"
        )
        plan.changed = len(items) - plan.new
        return plan
    plan.stored = stored
    same = held.copy()
    same[held] = (stored.images[own[held]] == digests[held]).all(axis=1)
    plan.changed = int(held.sum() - same.sum())
    if why_not:
        plan.why_not = why_not
        return plan
    # The item's own row first (equal images under several ids keep theirs), else any row of its image.
    readable = digests.any(axis=1)
    mine = same & readable
    plan.parent_row[mine] = own[mine]
    keys = digests.tobytes()
    for i in np.flatnonzero(~same & readable).tolist():
        plan.parent_row[i] = stored.row_of_image(keys[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES])
    # Every reused row checked against its stored checksum.
    candidates = np.unique(plan.parent_row[plan.parent_row >= 0])
    bad = candidates[~stored.check(candidates)]
    if bad.size:
        hit = np.isin(plan.parent_row, bad)
        plan.mismatched = [items[i].id for i in np.flatnonzero(hit)]
        plan.parent_row[hit] = -1
    return plan


class _EncodedRows:
    """The encoded (ok) rows of a shard store, taken front to back in blocks."""

    def __init__(self, store: ShardStore | None) -> None:
        self._store = store
        self._next = 0
        self._embeds: np.ndarray | None = None
        self._tokens: np.ndarray | None = None
        self._scales: np.ndarray | None = None
        self._pos = 0

    def take(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        while m > 0:
            if self._embeds is None or self._pos >= self._embeds.shape[0]:
                if self._store is None or self._next >= self._store.count:
                    raise IndexFormatError("internal: fewer encoded rows than encoded items")
                shard = self._store.read(self._next)
                self._next += 1
                self._embeds, self._tokens, self._scales, self._pos = (
                    shard.embeds,
                    shard.tokens,
                    shard.scales,
                    0,
                )
                continue
            assert self._tokens is not None
            hi = min(self._pos + m, self._embeds.shape[0])
            sc = None if self._scales is None else self._scales[self._pos : hi]
            parts.append((self._embeds[self._pos : hi], self._tokens[self._pos : hi], sc))
            m -= hi - self._pos
            self._pos = hi
        emb = np.concatenate([p[0] for p in parts])
        tok = np.concatenate([p[1] for p in parts])
        scales = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])  # type: ignore[misc]
        return emb, tok, scales


@dataclass
class Rows:
    """The version's rows: its items in manifest order, and where each row's vectors come from."""

    items: list[SourceItem]  # decoded items (reused or encoded ok), in manifest order
    parent_row: np.ndarray  # (N,) int64: the stored row reused, -1: encoded
    digests: np.ndarray  # (N, 16) uint8 image digests
    stats: np.ndarray | None = None  # (N, 5) int64 file stats when hashed

    @property
    def all_parent_rows_in_order(self) -> bool:
        return bool(self.parent_row.size and (self.parent_row == np.arange(self.parent_row.size)).all())


def version_rows(items: Sequence[SourceItem], plan: ReusePlan, encoded_ok: np.ndarray) -> Rows:
    """The rows of the version: ``encoded_ok`` says which of ``plan.to_encode`` decoded."""
    keep = plan.parent_row >= 0
    keep[plan.to_encode[encoded_ok]] = True
    chosen = np.flatnonzero(keep)
    stats = None if plan.stats is None else plan.stats[chosen]
    return Rows([items[i] for i in chosen], plan.parent_row[chosen], plan.digests[chosen], stats)


def can_link(rows: Rows, plan: ReusePlan) -> bool:
    """Whether the version's arrays are exactly the parent's (every row the parent's own, in order)."""
    return (
        plan.stored is not None
        and not plan.stored.segmented
        and rows.parent_row.size == plan.stored.rows
        and rows.all_parent_rows_in_order
    )


def link_arrays(files: StagedFiles, plan: ReusePlan, rows: Rows) -> None:
    """The parent's arrays and digests as the version's (hard links; copies across filesystems); the file
    stats are this build's (files touched since have new ones, which the next build compares with)."""
    assert plan.stored is not None
    names = [f for f in ARRAY_FILES if f != IMAGE_STATS_FILE and (plan.stored.path / f).is_file()]
    files.link_from(plan.stored.path, names)
    if rows.stats is not None:
        write_stats(files.stage, rows.stats)


def write_rows(arrays: VersionArrays, rows: Rows, plan: ReusePlan, store: ShardStore | None) -> np.ndarray:
    """Every row into ``arrays`` in order, reused rows from the parent's stored bytes and encoded ones from
    the shards; returns the (N, 16) row checksums to store with them."""
    encoded = _EncodedRows(store)
    checksums = np.zeros((len(rows.items), DIGEST_BYTES), np.uint8)
    src = rows.parent_row
    n = src.shape[0]
    lo = 0
    while lo < n:
        reused = src[lo] >= 0
        hi = lo + 1
        while hi < n and hi - lo < RUN and (src[hi] >= 0) == reused:
            hi += 1
        if reused:
            assert plan.stored is not None
            emb, tok, sc = plan.stored.read(src[lo:hi])
            checksums[lo:hi] = plan.stored.digests[src[lo:hi]]
        else:
            emb, tok, sc = encoded.take(hi - lo)
            checksums[lo:hi] = row_digests(emb, tok, sc)
        arrays.append(emb, tok, sc)
        lo = hi
    return checksums


def reuse_off(items: Sequence[SourceItem], settings: Settings, force: bool) -> str:
    """Why this build encodes everything whatever CURRENT holds ("" when it reuses what it can)."""
    if force:
        return "--force: every item encoded"
    if settings.index_shards > 1:
        return "sharded versions do not reuse stored vectors yet: every item encoded"
    return ""


def work_key_of(base: Path, version: str) -> str | None:
    try:
        value = IndexManifest.load(base / version / MANIFEST_FILE).build_params.get(WORK_KEY)
    except IndexFormatError:
        return None
    return str(value) if value else None


def report_reuse(report: BuildReport, reuse: ReusePlan, encoded: int) -> None:
    report.items_encoded, report.items_reused = encoded, reuse.reused
    report.items_new, report.items_changed, report.items_removed = reuse.new, reuse.changed, reuse.removed
    report.reuse_mismatched = list(reuse.mismatched)
    if reuse.mismatched:
        names = [repr(m) for m in reuse.mismatched]
        report.notes.append(mismatch_note("stored row(s)", reuse.parent_version, names, ", "))
    if reuse.why_not and reuse.parent_version is not None:
        report.notes.append(f"reuse: {reuse.why_not}")


def ann_index(
    writer: VersionWriter,
    rows: Rows,
    reuse: ReusePlan,
    linked: bool,
    settings: Settings,
    factory: str | None,
) -> tuple[IndexPlan, dict[str, Any], str]:
    """The version's ANN index, never by encoding, and how it was made: the parent's own file (a hard
    link) when the rows are the parent's; the parent's HNSW graph extended when rows were only appended
    and the measured recall@10 reaches the target (``indexer.ann.extend_hnsw``); else built anew from the
    staged vectors (stored and new)."""
    n, d = len(rows.items), int(writer.embeddings().shape[1])
    plan = choose_index(
        n,
        d,
        exact_max_items=settings.exact_max_items,
        memory_budget_mb=settings.memory_budget_mb,
        factory=factory,
    )
    stored = reuse.stored
    pm = stored.manifest if stored is not None else None
    same_plan = (
        pm is not None
        and not pm.is_sharded
        and pm.index_factory == plan.factory
        and (stored.path / INDEX_FILE).is_file()
    )
    if stored is not None and pm is not None and same_plan:
        kept = {k: v for k, v in pm.build_params.items() if k in plan.build_params}
        if linked:
            try:
                writer.link_from(stored.path, [INDEX_FILE])
            except IndexFormatError as exc:  # a copy of the parent's rotted file: built anew, not taken
                plan, notes = write_ann_index(
                    writer, n, d, settings, factory, memory_budget_mb=settings.memory_budget_mb
                )
                return plan, notes, f"rebuilt from stored vectors ({pm.version}'s not taken over: {exc})"
            return plan, {**kept, ANN_LINKED: pm.version}, f"linked from {pm.version} (the same rows)"
        p = stored.rows
        appended = (
            plan.kind == "hnsw"
            and n > p
            and bool((rows.parent_row[:p] == np.arange(p)).all())
            and bool((rows.parent_row[p:] < 0).all())
        )
        if appended:
            index = faiss.read_index(str(stored.path / INDEX_FILE))
            start = int(pm.search_params.get("efSearch", 0) or EF_GRID[0])
            ef, recall = extend_hnsw(
                index, writer.embeddings(), p, ef_search=start, target=settings.target_recall
            )
            if recall >= settings.target_recall:
                writer.write_index(index)
                how = (
                    f"{pm.version}'s HNSW graph + {n - p} added (recall@10 {recall:.3f} at efSearch {ef} >= "
                    f"target {settings.target_recall})"
                )
                return (
                    plan,
                    {**kept, "hnsw_extended_from": pm.version, "hnsw_add_recall_at_10": round(recall, 4)},
                    how,
                )
            rebuilt = (
                f"rebuilt from stored vectors (HNSW add measured recall@10 {recall:.3f} < "
                f"{settings.target_recall} up to efSearch {ef})"
            )
            plan, notes = write_ann_index(
                writer, n, d, settings, factory, memory_budget_mb=settings.memory_budget_mb
            )
            return plan, notes, rebuilt
    plan, notes = write_ann_index(writer, n, d, settings, factory, memory_budget_mb=settings.memory_budget_mb)
    return plan, notes, ("rebuilt from stored vectors" if reuse.reused else "built")


def append_digests(stage: Path, parent_dir: Path, added: Sequence[SourceItem], store: ShardStore) -> bool:
    """An ``add``'s digests: the parent's, then those of the ``added`` rows (encoded into ``store``), so
    that the next build still reuses every row. False (nothing written) when the parent has none."""
    parent_dir = Path(parent_dir)
    if not (parent_dir / IMAGE_DIGESTS_FILE).is_file() or not (parent_dir / ROW_DIGESTS_FILE).is_file():
        return False
    checksums = [np.load(parent_dir / ROW_DIGESTS_FILE)]
    for i in range(store.count):
        shard = store.read(i)
        checksums.append(row_digests(shard.embeds, shard.tokens, shard.scales))
    images, stats = digest_and_stat(added)
    parent_stats = parent_dir / IMAGE_STATS_FILE
    old = np.load(parent_dir / IMAGE_DIGESTS_FILE)
    old_stats = np.load(parent_stats) if parent_stats.is_file() else np.zeros((old.shape[0], STAT_COLUMNS))
    write_reuse_digests(
        stage, np.concatenate([old, images]), np.concatenate(checksums), np.concatenate([old_stats, stats])
    )
    return True


def quality_key(captioned: Sequence[tuple[int, SourceItem]], target_recall: float) -> str:
    """The key of a version's measurements besides its vectors and index (see ``QUALITY_KEY``)."""
    digest = hashlib.sha256(json.dumps(target_recall).encode())
    for row, item in captioned:
        digest.update(json.dumps([row, item.captions], sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def measured_parent(plan: ReusePlan, linked: bool, ann_linked: bool, key: str) -> IndexManifest | None:
    """The parent's manifest when this version's measurements would repeat its own exactly: the same
    arrays and index (hard links) and the same ``quality_key``."""
    if not (linked and ann_linked) or plan.stored is None:
        return None
    parent = plan.stored.manifest
    return parent if parent.build_params.get(QUALITY_KEY) == key else None
