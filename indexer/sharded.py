"""Sharded versions in the indexer (``CCRK_INDEX_SHARDS`` / ``ccrk index build --shards S``; the format is
``store.version.sharding``'s).

``build`` partitions the encoded items by the store's hash rule and writes each shard as an ordinary
version inside one staged version (``store.shards.sharded_writer``): its own ANN index chosen for its size
within
the memory budget, its own search parameters tuned on held-out queries. The merged index (every shard's
results merged, as the service searches it) is then measured as one: recall@10 of the merged ANN results
against exact search over all shards, text->image recall per language, the match calibration, and the
quality gate's verdict. ``add`` appends each new item to its owning shard and ``delete`` rewrites the
owning shards' metadata; the other shards are hard-linked from the parent. CURRENT switches once.

Products (several photos, searched text fields): the build writes the product channels once, beside the
shards, over the global rows (``indexer.products.write_products`` with each item's global row), calibrated
on the whole catalogue as an unsharded build calibrates them; ``delete`` hard-links them (the deleted rows
are masked by the shards' metadata); ``add`` extends them over the new global rows and calibrates again.

(A little over 400 lines: a sharded version's build, add and delete side by side, with the publishing step
they share, as ``indexer.build`` keeps its build and add.)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ccrk_settings import Settings
from indexer import disk
from indexer.ann import IndexPlan, measure_recall
from indexer.build_key import without_key
from indexer.encoding import Encoded, append_shards_split
from indexer.parent import ParentVersion, appended_metadata
from indexer.pipeline import Operation, inherit_measurements, judge, utc_now, write_ann_index
from indexer.product_reuse import FirstPhotos, ProductReuse
from indexer.product_rows import RowMove
from indexer.products import extend_products, wants_products, write_products
from indexer.quality_gate import QualityGate
from indexer.report import BuildReport
from indexer.tuning import (
    CaptionedRows,
    caption_queries,
    measure_quality,
    recall_note,
    tune_version,
    tuning_queries,
)
from model.model_dir import ModelConfig
from model.runtime import Encoder
from store.layout import INDEX_FILE, METADATA_FILE, SHARDED_FORMAT_VERSION
from store.products.channels import ProductChannels, has_product_channels
from store.shards.sharded import ShardedIndex
from store.shards.sharded_writer import ShardedVersionWriter, ShardStage
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.sharding import SHARD_KEY, Sharding, partition
from store.version.writer import Finished

# Per shard to tune and seal: its stage, its manifest (filled in by tuning) and its index plan.
ToTune = dict[int, tuple[ShardStage, IndexManifest, IndexPlan]]


def _ranks(owners: np.ndarray, shard_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(items per shard, each item's position among its shard's items), keeping the items' order."""
    sizes = np.bincount(owners, minlength=shard_count).astype(np.int64)
    rank = np.empty(owners.shape[0], dtype=np.int64)
    for i in range(shard_count):
        rank[owners == i] = np.arange(sizes[i])
    return sizes, rank


def _offsets(totals: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(totals)[:-1]]).astype(np.int64)


def factories(sharding: Sharding) -> str:
    """The version's ``index_factory``: its shards' (those with items), one when they agree."""
    used = sorted({s.index_factory for s in sharding.shards if s.total_rows}) or ["Flat"]
    return " | ".join(used)


def write_shard_index(
    stage: ShardStage, n: int, d: int, settings: Settings, factory: str | None, shard_count: int
) -> tuple[IndexPlan, dict]:
    """The ANN index of one shard of ``n`` items (chosen for its size; an empty shard's is Flat). Each shard
    gets an equal part of the memory budget: one process serving the whole version stays within it, as the
    unsharded index does (and as the build's disk estimate assumes)."""
    if n == 0:
        stage.write_index(faiss.index_factory(d, "Flat", faiss.METRIC_INNER_PRODUCT))
        return IndexPlan("Flat", "exact"), {}
    budget = max(1, settings.memory_budget_mb // shard_count)
    return write_ann_index(
        stage, n, d, settings, factory, memory_budget_mb=budget, where=f" of shard {stage.index}"
    )


def build_sharded(
    op: Operation,
    encoded: Encoded,
    encoder: Encoder,
    template: IndexManifest,
    gate: QualityGate | None,
    *,
    index_factory: str | None,
    need: disk.SpaceNeed,
    work_dir: Path,
    model_dir: Path,
    cfg: ModelConfig,
    first: FirstPhotos | None = None,
    products: ProductReuse | None = None,
) -> BuildReport:
    """A full build's version in ``settings.index_shards`` shards; ``template`` is the manifest an
    unsharded build would write (its version and index fields are filled in here). Products: their
    channels beside the shards, over the global rows (``first``, ``products``: the first photos' digests
    and the parent's reusable channels, ``indexer.products.write_products``)."""
    settings, items = op.settings, encoded.ok_items
    shard_count = settings.index_shards
    owners = partition([it.id for it in items], shard_count)
    sizes, rank = _ranks(owners, shard_count)
    global_rows = _offsets(sizes)[owners] + rank
    d, tokens, width = template.embed_dim, int(template.rerank["tokens"]), int(template.rerank["width"])
    with op.new_sharded_version(need, f"the new version of {op.name!r}", shard_count) as writer:
        stages = [writer.shard(i) for i in range(shard_count)]
        with contextlib.ExitStack() as files:
            arrays = {
                i: files.enter_context(
                    stage.arrays(
                        int(sizes[i]), d, tokens=tokens, width=width, rerank_dtype=settings.rerank_dtype
                    )
                )
                for i, stage in enumerate(stages)
            }
            append_shards_split(arrays, owners, encoded.store)
        to_tune: ToTune = {}
        for i, stage in enumerate(stages):
            mine = np.flatnonzero(owners == i)
            stage.write_metadata(
                (int(rank[j]), items[j].id, str(items[j].path), items[j].fields, False) for j in mine
            )
            plan, notes = write_shard_index(stage, int(sizes[i]), d, settings, index_factory, shard_count)
            shard_manifest = dataclasses.replace(
                copy.deepcopy(template),
                version=writer.version,
                created_at=utc_now(),
                count=int(sizes[i]),
                total_rows=int(sizes[i]),
                index_factory=plan.factory,
                skipped=[],
                build_params={
                    **plan.build_params,
                    **notes,
                    "estimated_index_bytes": plan.estimated_bytes,
                    SHARD_KEY: {"index": i, "of": shard_count},
                },
            )
            to_tune[i] = (stage, shard_manifest, plan)
        if wants_products(items, settings):
            write_products(
                writer.stage,
                items,
                encoded.store,
                encoder,
                work_dir=work_dir,
                model_dir=model_dir,
                settings=settings,
                cfg=cfg,
                report=op.report,
                rows=global_rows,
                first=first,
                reuse=products,
                linked=writer.linked_checksums,
            )
        manifest = dataclasses.replace(
            template, format_version=SHARDED_FORMAT_VERSION, version=writer.version, created_at=utc_now()
        )
        captioned = [(int(global_rows[j]), it) for j, it in enumerate(items) if it.captions]
        return publish_sharded(
            op,
            writer,
            manifest,
            to_tune,
            encoder,
            captioned,
            gate,
            items_indexed=len(items),
            work_dir=work_dir,
        )


def add_to_shards(
    op: Operation,
    parent: ParentVersion,
    encoded: Encoded,
    encoder: Encoder,
    gate: QualityGate | None,
    *,
    need: disk.SpaceNeed,
    work_dir: Path,
    model_dir: Path,
    cfg: ModelConfig,
) -> BuildReport:
    """An ``add`` to a sharded parent: each new item appended to its owning shard (copied and extended,
    the ANN index the parent's plus the new rows, re-tuned); shards without new items hard-linked. Product
    channels: the parent's extended (``indexer.products.extend_products``) over the new global rows (a
    shard's rows move by the items added to the shards before it)."""
    pm, items, settings = parent.manifest, encoded.ok_items, op.settings
    shard_count = len(parent.shard_manifests)
    owners = partition([it.id for it in items], shard_count)
    added, rank = _ranks(owners, shard_count)
    old_totals = np.array([m.total_rows for m in parent.shard_manifests], dtype=np.int64)
    totals = old_totals + added
    global_rows = _offsets(totals)[owners] + old_totals[owners] + rank
    d, tokens, width = pm.embed_dim, int(pm.rerank["tokens"]), int(pm.rerank["width"])
    dtype = str(pm.rerank["dtype"])
    with op.new_sharded_version(need, f"the new version of {op.name!r}", shard_count) as writer:
        stages: dict[int, ShardStage] = {}
        for i in range(shard_count):
            if added[i]:
                stages[i] = writer.shard(i)
            else:
                writer.link_shard(i, parent.shard_dirs[i])
        with contextlib.ExitStack() as files:
            arrays = {}
            for i, stage in stages.items():
                arrays[i] = files.enter_context(
                    stage.arrays(int(totals[i]), d, tokens=tokens, width=width, rerank_dtype=dtype)
                )
                arrays[i].copy_from(parent.shard_dirs[i])
            append_shards_split(arrays, owners, encoded.store)
        to_tune: ToTune = {}
        notes: list[str] = []
        for i, stage in stages.items():
            mine = [items[j] for j in np.flatnonzero(owners == i)]
            stage.write_metadata(appended_metadata(parent.rows[i], mine, int(old_totals[i])))
            index = faiss.read_index(str(parent.shard_dirs[i] / INDEX_FILE))
            embeds = stage.embeddings()
            index.add(np.ascontiguousarray(embeds[int(old_totals[i]) :], dtype=np.float32))
            stage.write_index(index)
            del index, embeds
            sm = parent.shard_manifests[i]
            shard_manifest = dataclasses.replace(
                copy.deepcopy(sm),
                version=writer.version,
                created_at=utc_now(),
                count=sm.count + int(added[i]),
                total_rows=int(totals[i]),
                skipped=[],
                parent_version=sm.version,
                checksums={},
                build_params=without_key(sm.build_params),
            )
            rescore = int(sm.search_params.get("rescore_factor", 0))
            to_tune[i] = (
                stage,
                shard_manifest,
                IndexPlan(sm.index_factory, "parent", rescore_factor=rescore),
            )
            if totals[i] > settings.exact_max_items and sm.index_factory == "Flat":
                notes.append(
                    f"shard {i}: {totals[i]} items now exceed exact_max_items {settings.exact_max_items}: "
                    "the next full build chooses an ANN index"
                )
        if has_product_channels(parent.path):
            # A parent row keeps its place in its shard; the shard's offset grows by what the ones before got.
            shard_of_row = np.repeat(np.arange(shard_count), old_totals)
            moved = RowMove(
                parent=np.arange(shard_of_row.size, dtype=np.int64)
                + (_offsets(totals) - _offsets(old_totals))[shard_of_row],
                added=global_rows,
                products=int(totals.sum()),
            )
            channels = ProductChannels(parent.path, int(old_totals.sum()))
            try:
                extend_products(
                    writer.stage,
                    channels,
                    items,
                    encoded.store,
                    encoder,
                    first_row=0,
                    work_dir=work_dir,
                    model_dir=model_dir,
                    settings=settings,
                    cfg=cfg,
                    report=op.report,
                    moved=moved,
                )
            finally:
                channels.close()
        manifest = dataclasses.replace(
            pm,
            version=writer.version,
            created_at=utc_now(),
            count=parent.count + len(items),
            total_rows=int(totals.sum()),
            skipped=encoded.skipped,
            parent_version=pm.version,
            checksums={},
            build_params=without_key(pm.build_params),
        )
        captioned = [(int(global_rows[j]), it) for j, it in enumerate(items) if it.captions]
        return publish_sharded(
            op,
            writer,
            manifest,
            to_tune,
            encoder,
            captioned,
            gate,
            items_indexed=len(items),
            work_dir=work_dir,
            notes=notes,
        )


def publish_sharded(
    op: Operation,
    writer: ShardedVersionWriter,
    manifest: IndexManifest,
    to_tune: ToTune,
    encoder: Encoder,
    captioned: CaptionedRows,
    gate: QualityGate | None,
    *,
    items_indexed: int,
    work_dir: Path,
    notes: Collection[str] = (),
    measured: IndexManifest | None = None,
) -> BuildReport:
    """Tune and seal the shards written (the others are linked), measure the merged index as the service
    searches it, let the gate judge it, and finish it (published unless refused). ``measured``: a version
    whose measurements are taken over instead (``indexer.segments``: little changed since)."""
    settings, report = op.settings, op.report
    target = settings.target_recall
    # Encoded once, for every shard and the merge.
    texts = None if measured is not None else caption_queries(encoder, captioned, seed=0)
    for i, (stage, shard_manifest, plan) in sorted(to_tune.items()):
        if shard_manifest.count > 0:
            with IndexVersion(stage.stage, shard_manifest) as shard:
                queries = (
                    (texts, None, "captions") if texts is not None else tuning_queries(shard, encoder, (), 0)
                )
                recall = tune_version(shard, shard_manifest, plan, queries, target)
            if recall < target:
                report.notes.append(
                    f"shard {i}: " + recall_note(recall, target, shard_manifest.search_params)
                )
        stage.seal(shard_manifest)
    sharding = writer.sharding()
    manifest.sharding = sharding.to_dict()
    manifest.index_factory, manifest.search_params = factories(sharding), {}
    if measured is not None:
        inherit_measurements(manifest, measured)
        manifest.search_params = {}
        sharding.merged_recall_at_10 = manifest.measured_recall_at_10
        sharding.merged_recall_measured_on = manifest.recall_measured_on
        manifest.sharding = sharding.to_dict()
        report.notes.extend(notes)
    else:
        measure_merged(manifest, sharding, writer, encoder, captioned, texts, settings, report, notes)
    publish = judge(writer.stage, manifest, encoder, captioned, settings, report, gate)
    manifest.build_seconds = round(time.perf_counter() - op.started, 3)
    done = writer.finish(manifest, publish=publish, keep=settings.keep_versions)
    return op.finished(done, manifest, items_indexed, work_dir)


def measure_merged(
    manifest: IndexManifest,
    sharding: Sharding,
    writer: ShardedVersionWriter,
    encoder: Encoder,
    captioned: CaptionedRows,
    texts: np.ndarray | None,
    settings: Settings,
    report: BuildReport,
    notes: Collection[str],
) -> None:
    """Recall@10 of the merged shards as the service searches them, and the quality measurements."""
    target = settings.target_recall
    with ShardedIndex(writer.stage, manifest) as merged:
        embeds, self_rows, origin = (
            (texts, None, "captions") if texts is not None else tuning_queries(merged, encoder, (), 0)
        )
        recall = measure_recall(merged, embeds, 10, self_rows) if len(merged) else 1.0
        sharding.merged_recall_at_10 = round(recall, 4)
        sharding.merged_recall_measured_on = int(embeds.shape[0])
        manifest.sharding = sharding.to_dict()
        manifest.measured_recall_at_10 = sharding.merged_recall_at_10
        manifest.recall_measured_on = sharding.merged_recall_measured_on
        manifest.build_params = {**manifest.build_params, "tuning_queries": origin}
        if recall < target:
            report.notes.append("merged results: " + recall_note(recall, target, "tuned per shard"))
        report.notes.extend(notes)
        measure_quality(merged, manifest, encoder, captioned, settings.rerank_policy_queries)


def rewrite_shards(
    op: Operation,
    parent: ParentVersion,
    doomed: dict[int, set[int]],
    started: float,
    *,
    patched: dict[int, dict[int, dict[str, Any]]] | None = None,
    live_sequence: int | None = None,
) -> tuple[Finished, IndexManifest]:
    """A ``delete`` (or a fold of the live catalogue's changes, ``indexer.live_fold``) from a sharded
    parent: the metadata of the shards owning a row of ``doomed`` (deleted) or ``patched`` (new fields, by
    local row) written again (their other files hard-linked), the other shards linked whole; search
    parameters and recall stay the parent's. ``live_sequence``: the log sequence the version holds (None:
    the parent's)."""
    pm = parent.manifest
    patched = patched or {}
    touched = set(doomed) | set(patched)
    shard_count = len(parent.shard_manifests)
    need = disk.SpaceNeed(
        {
            "metadata": sum((parent.shard_dirs[i] / METADATA_FILE).stat().st_size for i in touched),
            "manifest": disk.MANIFEST_BYTES * (1 + len(touched)),
        }
    )
    rule = Sharding.from_dict(pm.sharding).rule
    with op.new_sharded_version(need, f"the rewrite of {op.name!r}", shard_count, rule=rule) as writer:
        writer.link_own_files(parent.path, pm.checksums)  # product channels: unchanged, rows masked
        for i in range(shard_count):
            if i not in touched:
                writer.link_shard(i, parent.shard_dirs[i])
                continue
            sm, gone, fields_now = parent.shard_manifests[i], doomed.get(i, set()), patched.get(i, {})
            stage = writer.shard(i)
            stage.link_from(parent.shard_dirs[i], [f for f in sm.checksums if f != METADATA_FILE])
            stage.write_metadata(
                (row, item_id, path, fields_now.get(row, fields), deleted or row in gone)
                for row, item_id, path, fields, deleted in parent.rows[i]
            )
            stage.seal(
                dataclasses.replace(
                    copy.deepcopy(sm),
                    version=writer.version,
                    created_at=utc_now(),
                    count=sm.count - len(gone),
                    skipped=[],
                    parent_version=sm.version,
                    checksums={},
                    build_params=without_key(sm.build_params),
                )
            )
        old = Sharding.from_dict(pm.sharding)
        sharding = writer.sharding(old.merged_recall_at_10, old.merged_recall_measured_on)
        manifest = dataclasses.replace(
            pm,
            version=writer.version,
            created_at=utc_now(),
            count=parent.count - sum(len(g) for g in doomed.values()),
            skipped=[],
            parent_version=pm.version,
            checksums={},
            build_params=without_key(pm.build_params),
            sharding=sharding.to_dict(),
            live_sequence=pm.live_sequence if live_sequence is None else live_sequence,
        )
        manifest.build_seconds = round(time.perf_counter() - started, 3)
        done = writer.finish(manifest, keep=op.settings.keep_versions)
    return done, manifest
