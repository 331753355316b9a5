"""Rebuilds at the cost of the change, on disk too: segmented versions
(``store.version.sharding.SEGMENT_RULE``).

A full build whose change against CURRENT is small keeps CURRENT's data as it is and writes only what
changed::

    CURRENT (one version, or segments 0..S-1)          the new version
    segment j, nothing of it changed          ->  shard-j/ linked whole (every file a hard link)
    segment j, rows changed / removed / new   ->  shard-j/: arrays, digests and index.faiss hard links,
      metadata (paths, fields)                      metadata.sqlite written again (those rows deleted:
                                                    tombstones; fields as the manifest says), its manifest
    new and changed items                     ->  shard-S/: a new segment (vectors encoded, or reused
                                                    from another stored row), its own small index

so that two versions sharing 99 % of their items share their large files (disk ~1.0x plus the new
segment) and no ANN graph is rebuilt. Search merges the segments exactly as it merges hash shards
(``store.shards.sharded.ShardedIndex``). The build compacts instead (one unsharded version, its ANN index
rebuilt from stored vectors, nothing encoded again; ``indexer.build``) when deleted rows would pass
``index_segment_max_dead`` of all rows, when the change itself is larger than that share, when segments
would pass ``index_max_segments``, when a full build would choose another index type than the largest
segment has, or when a stored row failed its checksum (its file is not shared again). Products (several
photos or text fields) and hash-sharded versions are not segmented.

Tuning and measuring: a new segment's own search parameters are tuned (cheap: it is small); the version's
recall, text->image recall, match calibration and re-rank policy are taken over from CURRENT while the rows
changed since they were last measured (``CHANGED_SINCE_MEASURED``) stay within ``REMEASURE_SHARE`` of the
items, and measured again otherwise (the report says which).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccrk_settings import Settings
from indexer.ann import IndexPlan, choose_index
from indexer.build_key import without_key
from indexer.encoding import Encoded
from indexer.incremental import ReusePlan, Rows, can_link, digest_and_stat, write_rows
from indexer.pipeline import Operation, utc_now, write_ann_index
from indexer.products import wants_products
from indexer.quality_gate import QualityGate
from indexer.report import BuildReport
from indexer.shards import ShardStore
from model.runtime import Encoder
from store.layout import IMAGE_STATS_FILE, METADATA_FILE, SHARDED_FORMAT_VERSION
from store.products.channels import has_product_channels
from store.shards.sharded import load_shard_manifest
from store.shards.sharded_writer import ShardedVersionWriter, ShardStage
from store.version.manifest import IndexManifest
from store.version.metadata import StoredRow, fields_json
from store.version.reuse import REUSE_KEY, STAT_COLUMNS, StoredVectors, write_reuse_digests, write_stats
from store.version.sharding import SEGMENT_RULE, Sharding

# build_params of a segmented version: rows new, changed or removed since its measurements were taken.
CHANGED_SINCE_MEASURED = "rows_changed_since_measured"
MEASURED_IN = "measured_in"  # build_params: the version whose measurements these are
REMEASURE_SHARE = 0.05  # measured again once more than this share of the items changed since


@dataclass
class SegmentPlan:
    """How a build's rows map onto CURRENT's segments, and whether it compacts instead."""

    kept: np.ndarray  # (N,) bool over Rows.items: the item stays in its own live row of CURRENT
    fresh: np.ndarray  # positions in Rows.items written to the new segment
    tombstoned: int  # live rows of CURRENT marked deleted by this build
    total_rows: int  # rows of the new version, deleted ones included
    segments: int
    compact: str = ""  # why the build compacts instead ("": it writes segments)


def _segment_factories(stored: StoredVectors) -> list[tuple[int, str]]:
    """(total rows, index factory) of each of CURRENT's segments."""
    if not stored.segmented:
        return [(stored.rows, stored.manifest.index_factory)]
    return [(int(s["total_rows"]), str(s["index_factory"])) for s in stored.manifest.sharding["shards"]]


def plan_segments(
    rows: Rows, reuse: ReusePlan, settings: Settings, index_factory: str | None
) -> SegmentPlan | None:
    """The segment plan of a build that may reuse CURRENT (None: not applicable, today's way: no reuse,
    rows exactly the parent's, CURRENT holds products, or this build writes them: their channels span the
    whole version)."""
    stored = reuse.stored
    if stored is None or reuse.why_not or can_link(rows, reuse) or wants_products(rows.items, settings):
        return None
    if not stored.segmented and has_product_channels(stored.path):
        return None
    n = len(rows.items)
    kept = np.fromiter(
        (pr >= 0 and reuse.live.get(it.id) == pr for it, pr in zip(rows.items, rows.parent_row, strict=True)),
        dtype=bool,
        count=n,
    )
    fresh = np.flatnonzero(~kept)
    tombstoned = len(reuse.live) - int(kept.sum())
    total = stored.rows + int(fresh.size)
    segments = len(stored.folders) + (1 if fresh.size else 0)
    plan = SegmentPlan(kept, fresh, tombstoned, total, segments)
    limit = settings.index_segment_max_dead
    dead = total - n
    largest = max(_segment_factories(stored))[1]
    full = choose_index(
        n,
        stored.manifest.embed_dim,
        exact_max_items=settings.exact_max_items,
        memory_budget_mb=settings.memory_budget_mb,
        factory=index_factory,
    ).factory
    if reuse.mismatched:
        plan.compact = f"{len(reuse.mismatched)} stored row(s) failed their checksum: files written anew"
    elif dead > limit * total:
        plan.compact = f"{dead:,} of {total:,} rows would be deleted ones ({dead / total:.0%} > {limit:.0%})"
    elif max(fresh.size, tombstoned) > limit * n:
        plan.compact = (
            f"the change ({fresh.size:,} rows new or changed, {tombstoned:,} removed) passes {limit:.0%} of "
            f"{n:,} items"
        )
    elif segments > settings.index_max_segments:
        plan.compact = f"{segments} segments would pass index_max_segments {settings.index_max_segments}"
    elif full != largest:
        plan.compact = f"a full build of {n:,} items chooses {full}, the largest segment has {largest}"
    return plan


def _parent_segments(stored: StoredVectors) -> list[IndexManifest]:
    if not stored.segmented:
        return [stored.manifest]
    sharding = Sharding.from_dict(stored.manifest.sharding)
    return [load_shard_manifest(stored.path, sharding, i)[0] for i in range(sharding.shard_count)]


def _rewrite_segment(
    writer: ShardedVersionWriter,
    j: int,
    folder: Path,
    sm: IndexManifest,
    rows: list[StoredRow],
    stats: np.ndarray,
    names: set[str],
) -> None:
    """Segment ``j`` of the new version: its files linked from ``folder``, its metadata ``rows`` (fields
    as text, of field ``names``) and its rows' file stats ``stats`` written."""
    stage = writer.shard(j)
    own = (METADATA_FILE, IMAGE_STATS_FILE)
    stage.link_from(folder, [f for f in sm.checksums if f not in own and "/" not in f])
    stage.write_metadata(rows, text_names=names)
    write_stats(stage.stage, stats)
    params = without_key(sm.build_params)
    params.pop("shard", None)
    stage.seal(
        dataclasses.replace(
            copy.deepcopy(sm),
            format_version=1,
            version=writer.version,
            created_at=utc_now(),
            count=sum(1 for r in rows if not r[4]),
            skipped=[],
            parent_version=sm.version,
            checksums={},
            build_params=params,
            sharding={},
        )
    )


def write_new_segment(
    writer: ShardedVersionWriter,
    index: int,
    rows: Rows,
    stored: StoredVectors | None,
    store: ShardStore | None,
    template: IndexManifest,
    settings: Settings,
    index_factory: str | None,
) -> tuple[ShardStage, IndexManifest, IndexPlan]:
    """Segment ``index``: ``rows`` (vectors reused from ``stored`` or taken from the encoded ``store``),
    with digests, metadata and its own index (chosen for its size); to be tuned and sealed."""
    m, d = len(rows.items), template.embed_dim
    stage = writer.shard(index)
    tokens, width = int(template.rerank["tokens"]), int(template.rerank["width"])
    dtype = str(template.rerank["dtype"]) if tokens else "fp16"
    reuse = ReusePlan(rows.digests, rows.parent_row, stored=stored)
    with stage.arrays(m, d, tokens=tokens, width=width, rerank_dtype=dtype) as arrays:
        checksums = write_rows(arrays, rows, reuse, store)
    write_reuse_digests(stage.stage, rows.digests, checksums, rows.stats)
    stage.write_metadata((r, it.id, str(it.path), it.fields, False) for r, it in enumerate(rows.items))
    factory = index_factory if m > settings.exact_max_items else None
    plan, notes = write_ann_index(
        stage,
        m,
        d,
        settings,
        factory,
        memory_budget_mb=settings.memory_budget_mb,
        where=f" of segment {index}",
    )
    params = {k: v for k, v in template.build_params.items() if k == REUSE_KEY}
    manifest = dataclasses.replace(
        copy.deepcopy(template),
        format_version=1,
        version=writer.version,
        created_at=utc_now(),
        count=m,
        total_rows=m,
        index_factory=plan.factory,
        search_params={},
        skipped=[],
        parent_version=None,
        checksums={},
        sharding={},
        build_params={**plan.build_params, **notes, "estimated_index_bytes": plan.estimated_bytes, **params},
    )
    return stage, manifest, plan


def _measured(parent: IndexManifest, changed: int, n: int) -> tuple[IndexManifest | None, int]:
    """CURRENT's manifest when its measurements may be taken over (rows changed since they were taken,
    this build's included, within ``REMEASURE_SHARE``), and that count."""
    since = int(parent.build_params.get(CHANGED_SINCE_MEASURED, 0)) + changed
    if parent.measured_recall_at_10 is None or since > REMEASURE_SHARE * max(1, n):
        return None, 0
    return parent, since


def build_segments(
    op: Operation,
    rows: Rows,
    reuse: ReusePlan,
    seg: SegmentPlan,
    encoded: Encoded,
    encoder: Encoder,
    template: IndexManifest,
    gate: QualityGate | None,
    *,
    index_factory: str | None,
    work_dir: Path,
) -> BuildReport:
    """Write the version as CURRENT's segments (linked, or their metadata written again) plus one new
    segment of the fresh rows (see the module docstring), then tune, measure or take over, and publish."""
    from indexer.sharded import publish_sharded  # indexer.sharded imports this module for ``add``

    stored, settings, report = reuse.stored, op.settings, op.report
    assert stored is not None
    manifests = _parent_segments(stored)
    where = {int(rows.parent_row[i]): rows.items[i] for i in np.flatnonzero(seg.kept)}
    n = len(rows.items)
    what = f"the new version of {op.name!r}"
    with op.new_sharded_version(op.guard.need, what, seg.segments, rule=SEGMENT_RULE) as w:
        linked, rewritten = 0, 0
        kept_rows = rows.parent_row[seg.kept]
        kept_stats = rows.stats[seg.kept] if rows.stats is not None else None
        for j, (folder, sm) in enumerate(zip(stored.folders, manifests, strict=True)):
            offset = int(stored.offsets[j])
            old = reuse.parent_rows[j]
            stats = np.zeros((len(old), STAT_COLUMNS), np.int64)
            mine = (kept_rows >= offset) & (kept_rows < offset + len(old))
            if kept_stats is not None:
                stats[kept_rows[mine] - offset] = kept_stats[mine]
            # Fields as stored text: the kept rows' encoded once (compared, then written as they are),
            # the deleted rows' carried over unparsed; only their field names are read.
            new: list[StoredRow] = []
            names: set[str] = set()
            for row, item_id, path, text, deleted in old:
                it = None if deleted else where.get(offset + row)
                if it is None:
                    new.append((row, item_id, path, text, True))
                    names.update(json.loads(text) if text else ())
                else:
                    new.append((row, item_id, str(it.path), fields_json(it.fields), False))
                    names.update(it.fields)
            if new == old and np.array_equal(stats, stored.stats[offset : offset + len(old)]):
                w.link_shard(j, folder)
                linked += 1
            else:
                _rewrite_segment(w, j, folder, sm, new, stats, names)
                rewritten += 1
        to_tune: dict[int, tuple[ShardStage, IndexManifest, IndexPlan]] = {}
        global_row = np.zeros(n, np.int64)
        global_row[seg.kept] = rows.parent_row[seg.kept]
        if seg.fresh.size:
            fresh = Rows(
                [rows.items[i] for i in seg.fresh],
                rows.parent_row[seg.fresh],
                rows.digests[seg.fresh],
                None if rows.stats is None else rows.stats[seg.fresh],
            )
            s = len(stored.folders)
            to_tune[s] = write_new_segment(
                w, s, fresh, stored, encoded.store, template, settings, index_factory
            )
            global_row[seg.fresh] = stored.rows + np.arange(seg.fresh.size)
        report.ann_index = (
            f"segments: {linked} linked whole, {rewritten} with rows deleted or metadata changed "
            f"(index files shared)"
            + "".join(f", 1 new of {seg.fresh.size:,} rows ({t[2].factory})" for t in to_tune.values())
            + f"; {seg.tombstoned:,} rows of {stored.manifest.version} marked deleted"
        )
        changed = int(seg.fresh.size) + seg.tombstoned
        measured, since = _measured(stored.manifest, changed, n)
        manifest = dataclasses.replace(
            template,
            format_version=SHARDED_FORMAT_VERSION,
            version=w.version,
            created_at=utc_now(),
            count=n,
            total_rows=seg.total_rows,
        )
        if measured is not None:
            manifest.build_params = {
                **manifest.build_params,
                CHANGED_SINCE_MEASURED: since,
                MEASURED_IN: measured.build_params.get(MEASURED_IN, measured.version),
            }
            report.notes.append(
                "recall, match calibration and re-rank policy taken over from "
                f"{manifest.build_params[MEASURED_IN]}: {since:,} of {n:,} rows changed since they were "
                f"measured (<= {REMEASURE_SHARE:.0%}); measured again beyond that, and on compaction"
            )
        captioned = [(int(global_row[i]), it) for i, it in enumerate(rows.items) if it.captions]
        return publish_sharded(
            op,
            w,
            manifest,
            to_tune,
            encoder,
            captioned,
            gate,
            items_indexed=n,
            work_dir=work_dir,
            measured=measured,
        )


def add_segment(
    op: Operation,
    parent_stored: StoredVectors,
    encoded: Encoded,
    encoder: Encoder,
    gate: QualityGate | None,
    *,
    work_dir: Path,
) -> BuildReport:
    """An ``add`` to a segmented version: every segment linked whole, the new items one new segment."""
    from indexer.sharded import publish_sharded

    pm, items = parent_stored.manifest, encoded.ok_items
    s = len(parent_stored.folders)
    what = f"the new version of {op.name!r}"
    with op.new_sharded_version(op.guard.need, what, s + 1, rule=SEGMENT_RULE) as w:
        for j, folder in enumerate(parent_stored.folders):
            w.link_shard(j, folder)
        fresh = Rows(list(items), np.full(len(items), -1, np.int64), *digest_and_stat(items))
        template = dataclasses.replace(pm, build_params=without_key(pm.build_params))
        to_tune = {s: write_new_segment(w, s, fresh, None, encoded.store, template, op.settings, None)}
        total = parent_stored.rows + len(items)
        manifest = dataclasses.replace(
            pm,
            version=w.version,
            created_at=utc_now(),
            count=pm.count + len(items),
            total_rows=total,
            skipped=encoded.skipped,
            parent_version=pm.version,
            checksums={},
            build_params=without_key(pm.build_params),
        )
        manifest.build_params.pop(CHANGED_SINCE_MEASURED, None)
        manifest.build_params.pop(MEASURED_IN, None)
        captioned = [(parent_stored.rows + i, it) for i, it in enumerate(items) if it.captions]
        return publish_sharded(
            op, w, manifest, to_tune, encoder, captioned, gate, items_indexed=len(items), work_dir=work_dir
        )


def segmented_parent(path: Path, manifest: IndexManifest) -> StoredVectors | None:
    """The stored vectors of a segmented version (None: not segmented, or without digests)."""
    if not manifest.is_sharded or not Sharding.from_dict(manifest.sharding).segmented:
        return None
    key = manifest.build_params.get(REUSE_KEY)
    return StoredVectors.open(path, manifest, str(key)) if key else None
