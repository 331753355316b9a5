"""Build, add, delete and roll back index versions; each successful operation publishes one new version.

A version is written completely in ``NAME/.builds/`` (embeddings, re-rank store, metadata, faiss index,
tuned parameters, checksums) by ``store.version.writer.VersionWriter``, moved into ``NAME/<version>/`` with
one
rename, and only then published by switching ``CURRENT``. Any failure before that leaves CURRENT, and the
version it names, untouched, and removes the staged version (``indexer.staging``); shard work folders stay,
so that a re-run resumes. Free disk space is checked before encoding and before writing a version
(``indexer.disk``), and a full build whose result is CURRENT already publishes nothing
(``indexer.build_key``). ``build`` and ``add`` share the steps around their own (``indexer.pipeline``);
``delete`` and ``rollback`` live in ``indexer.maintenance`` and are re-exported here, where callers find
the four operations. With ``settings.index_shards`` > 1 a build writes a sharded version (products: their
channels beside the shards), and ``add`` and ``delete`` on a sharded version touch only the owning shards
(``indexer.sharded``; products: the channels beside them extended over the new global rows).

A full build encodes only what CURRENT does not hold already: rows whose image bytes are unchanged keep
their stored vectors (``indexer.incremental``, ``store.version.reuse``); ``force`` encodes everything. A small
change writes a segmented version (``indexer.segments``: CURRENT's files shared, one new segment) unless
the build compacts. A little over 500 lines: ``build`` and ``add`` read best side by side, with the choice
between their ways of writing a version; their shared steps are in ``pipeline``, the ways in
``incremental``, ``segments`` and ``sharded``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from ccrk_settings import Settings
from indexer import disk
from indexer.ann import IndexPlan
from indexer.build_key import (
    BUILD_KEY,
    CONTENT_KEY,
    MODEL_FILES_KEY,
    PLAN_HASH,
    RACY_KEY,
    build_key,
    content_key,
    current_build_param,
    further_photo_digests,
    model_files_key,
    published_as,
    without_key,
)
from indexer.encoding import append_shards, stored_token_shape
from indexer.errors import BuildError
from indexer.incremental import (
    ANN_LINKED,
    QUALITY_KEY,
    WORK_KEY,
    ann_index,
    append_digests,
    can_link,
    link_arrays,
    measured_parent,
    plan_reuse,
    quality_key,
    report_reuse,
    reuse_off,
    version_rows,
    work_key_of,
    write_rows,
)
from indexer.live_fold import fold_published, start_sequence
from indexer.maintenance import delete, rollback
from indexer.parent import appended_metadata, read_parent
from indexer.pipeline import Operation, rerank_info, utc_now
from indexer.product_reuse import FirstPhotos, open_parent
from indexer.products import extend_products, unheld_text_fields, wants_products, write_products
from indexer.quality_gate import QualityGate
from indexer.report import BuildReport
from indexer.segments import add_segment, build_segments, plan_segments, segmented_parent
from indexer.sharded import add_to_shards, build_sharded
from indexer.shards import ProgressFn, ShardStore, plan_hash
from indexer.sources import SourceItem, SourceScan, read_sources
from indexer.staging import index_lock
from model.model_check import check_model_dir
from model.model_dir import load_model_config
from model.runtime import Encoder
from store.layout import BUILDS_DIR, FORMAT_VERSION, INDEX_FILE, MANIFEST_FILE, METADATA_FILE, index_dir
from store.live import changelog_path
from store.products.channels import ProductChannels, has_product_channels
from store.synonyms import current_synonyms, read_document
from store.version import versions
from store.version.manifest import IndexManifest, model_fingerprint, model_name_of
from store.version.reuse import REUSE_KEY, FileStats, reuse_key, write_reuse_digests
from store.version.sharding import Sharding

__all__ = ["BuildReport", "add", "build", "delete", "rollback"]


def _already_current(report: BuildReport, base: Path, version: str, key: str) -> BuildReport:
    # E.g. a re-run after a kill just after publishing: that run's work folder is all that is left.
    for done_key in {key, work_key_of(base, version)} - {None}:
        shutil.rmtree(base / BUILDS_DIR / f"build-{done_key}", ignore_errors=True)
    report.version, report.already_current = version, True
    report.fill_from(IndexManifest.load(base / version / MANIFEST_FILE))
    report.notes.append(
        f"already published as {version}: the sources, their files, the model and the options are those "
        "of the build behind CURRENT; nothing was built or published (--force builds anyway)"
    )
    return report


def build(
    name: str,
    sources: Sequence[Path],
    *,
    settings: Settings,
    model_dir: Path | None = None,
    index_factory: str | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
    gate: QualityGate | None = None,
    synonyms: Path | None = None,
) -> BuildReport:
    """``_build``, then, once a version is published, the change log's entries it supersedes dropped
    (``indexer.live_fold.fold_published``)."""
    report = _build(
        name,
        sources,
        settings=settings,
        model_dir=model_dir,
        index_factory=index_factory,
        progress=progress,
        force=force,
        gate=gate,
        synonyms=synonyms,
    )
    if report.published:
        fold_published(settings.index_root, name, settings, report)
    return report


def build_catalogue(
    name: str,
    catalogue: SourceScan,
    *,
    settings: Settings,
    live_sequence: int,
    expect_current: str,
    model_dir: Path | None = None,
    progress: ProgressFn | None = None,
) -> BuildReport:
    """A full build of ``catalogue`` (``indexer.live_compact``: CURRENT's products with the change log's up to
    ``live_sequence`` over them), recording that sequence, with CURRENT's synonyms; refused (BuildError,
    nothing published) when CURRENT is no longer ``expect_current``, the version the catalogue was read
    from. The caller folds the log."""
    return _build(
        name,
        [changelog_path(settings.index_root, name)],
        settings=settings,
        model_dir=model_dir,
        progress=progress,
        catalogue=catalogue,
        live_sequence=live_sequence,
        expect_current=expect_current,
    )


def _build(
    name: str,
    sources: Sequence[Path],
    *,
    settings: Settings,
    model_dir: Path | None = None,
    index_factory: str | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
    gate: QualityGate | None = None,
    synonyms: Path | None = None,
    catalogue: SourceScan | None = None,
    live_sequence: int | None = None,
    expect_current: str | None = None,
) -> BuildReport:
    """A full build from the sources (deleted items of earlier versions are gone: compaction). When CURRENT
    holds this very build's result already (same sources, files, model and options), nothing is built or
    published unless ``force``. ``gate`` judges the staged version (none passed and a threshold set:
    refused, see ``indexer.quality_gate.unwired_gate``). ``synonyms``: a synonyms file the version holds
    (``store.synonyms``), checked before anything else (SynonymsError naming the file). ``catalogue``,
    ``live_sequence``, ``expect_current``: ``build_catalogue``'s."""
    started = time.perf_counter()
    root = settings.index_root
    # The product writes made before the sources are read are superseded by this build; those made after
    # apply over it (``indexer.live_fold``): their sequence is taken before anything is read.
    live_notes = BuildReport("build", name, None, False)
    if live_sequence is None:
        live_sequence = start_sequence(root, name, settings, live_notes)
    if synonyms is not None:
        synonym_set = read_document(synonyms)
    else:  # a compaction's build keeps CURRENT's synonyms; a build from sources holds only its own
        synonym_set = current_synonyms(root, name) if catalogue is not None else None
    model_dir = Path(model_dir or settings.model_dir)
    scan = catalogue or read_sources(sources, follow_external_links=settings.follow_external_links)
    items = scan.items
    if not items:
        raise BuildError(f"the sources hold no images: {', '.join(map(str, sources))}")
    unheld = unheld_text_fields(items, settings.text_fields)
    if unheld:
        held = sorted({k.partition("@")[0] for it in items for k in it.fields})
        raise BuildError(
            f"--text-fields (CCRK_TEXT_FIELDS) names {', '.join(map(repr, unheld))}, which no row of "
            f"{', '.join(map(str, sources))} holds (their fields: {', '.join(held[:20]) or 'none'}"
            f"{', ...' if len(held) > 20 else ''}); nothing was built"
        )
    # The whole model directory, before anything is created under the index root (model.model_check);
    # not again when CURRENT's build checked these very files (``build_key.model_files_key``).
    model_key = model_files_key(model_dir, settings.backend, settings.int8)
    if model_key is None or model_key != current_build_param(root, name, MODEL_FILES_KEY):
        check_model_dir(model_dir, backend=settings.backend, int8=settings.int8)
    cfg = load_model_config(model_dir)
    fingerprint = model_fingerprint(model_dir)
    report = BuildReport(
        "build",
        name,
        None,
        False,
        items_total=len(items),
        ignored_files=scan.ignored,
        skipped_links=scan.skipped_links,
    )
    base = index_dir(root, name)
    dtype, d = settings.rerank_dtype, cfg.embed_dim
    with index_lock(root, name) as guard:
        now_current = versions.current_version(root, name)
        if expect_current is not None and now_current != expect_current:
            raise BuildError(
                f"CURRENT of {name!r} is now {now_current}, not {expect_current} the compaction read: "
                "nothing was published and the change log keeps every change (run it again)"
            )
        report.notes.extend(live_notes.notes)
        key = plan_hash(
            items,
            fingerprint=fingerprint,
            rerank_dtype=dtype,
            shard_size=settings.shard_size,
            max_pixels=settings.max_image_pixels,
        )
        # The images' stats, once: for the build's key and for their digests (``plan_reuse``).
        file_stats = FileStats.take([it.path for it in items])
        result_key, racy = build_key(
            key,
            items,
            settings=settings,
            index_factory=index_factory,
            stats=file_stats.stats,
            now_ns=file_stats.now_ns,
        )

        def with_synonyms(k: str) -> str:  # only then: the keys of builds without synonyms stay as they were
            if synonym_set is None:
                return k
            return hashlib.sha256(f"{k}:synonyms:{synonym_set.digest}".encode()).hexdigest()

        result_key = with_synonyms(result_key)
        if catalogue is not None:  # a compaction's version differs from CURRENT by the sequence it holds
            result_key = hashlib.sha256(f"{result_key}:live:{live_sequence}".encode()).hexdigest()
        same = None if force else published_as(root, name, result_key)
        # CURRENT's build saw files changed within a timestamp tick (``build_key.RACY_NS``): their stats do
        # not vouch for their bytes, which its content key does.
        verify = same is not None and bool(current_build_param(root, name, RACY_KEY))
        if same is not None and not verify:
            return _already_current(report, base, same, key)
        # Reuse of CURRENT's stored vectors (``indexer.incremental``): only the items left are encoded.
        rkey = reuse_key(
            fingerprint=fingerprint,
            rerank_dtype=dtype,
            options=[settings.backend, settings.int8, settings.max_image_pixels],
        )
        reuse = plan_reuse(
            root, name, items, rkey, why_not=reuse_off(items, settings, force), stats=file_stats
        )
        # The parent's product channels likewise: photos and text values whose stored vectors are reused.
        products = (
            open_parent(root, name, rkey, force=force, live=reuse.live)
            if wants_products(items, settings)
            else None
        )
        if products is not None:
            products.keep_calibration = catalogue is not None
        bytes_key = None
        if racy or verify:  # the files' digests (taken by ``plan_reuse``; a racy file is always read)
            extra_paths, extra_digests = further_photo_digests(
                items, products.stored if products is not None else None
            )
            bytes_key = with_synonyms(
                content_key(
                    key,
                    reuse.digests,
                    settings=settings,
                    index_factory=index_factory,
                    extra_digests=extra_digests,
                    extra_paths=extra_paths,
                )
            )
        if verify and published_as(root, name, bytes_key or "", CONTENT_KEY) == same:
            assert same is not None
            reuse.close()
            if products is not None:
                products.close()
            return _already_current(report, base, same, key)
        to_encode = [items[i] for i in reuse.to_encode]
        work_key = (
            key
            if len(to_encode) == len(items)
            else plan_hash(
                to_encode,
                fingerprint=fingerprint,
                rerank_dtype=dtype,
                shard_size=settings.shard_size,
                max_pixels=settings.max_image_pixels,
            )
        )
        work_dir = base / BUILDS_DIR / f"build-{work_key}"

        def preflight(encoder: Encoder, store: ShardStore) -> None:
            if reuse.stored is None:
                tokens, width = disk.token_shape(encoder, cfg.vision.image_size)
            else:  # the stored rows' shape (same reuse key: same model): no encoder run, none loaded
                parent_rerank = reuse.stored.manifest.rerank
                tokens, width = int(parent_rerank["tokens"]), int(parent_rerank["width"])
            index = disk.index_bytes(len(items), d, settings, index_factory)
            guard.need = disk.version_need(
                items,
                d=d,
                tokens=tokens,
                width=width,
                rerank_dtype=dtype,
                index=index,
                pending=store.pending(),
            )
            disk.check_free_space(base, guard.need, f"the build of {name!r}")

        op = Operation(root, name, settings, guard, report, started, synonym_set)
        encoded, encoder = op.encode(
            to_encode,
            work_dir,
            model_dir,
            cfg,
            dtype,
            progress,
            preflight,
            f"build of {name!r}",
            total=len(items),
        )
        if catalogue is not None and encoded.skipped:
            # A compaction must hold every product the catalogue names: one dropped here would be lost
            # with the log entries the fold drops. Nothing is published; the log keeps every change.
            first = encoded.skipped[0]
            raise BuildError(
                f"the compaction of {name!r} could not decode {len(encoded.skipped)} photo(s) (first: "
                f"{first.get('path', '?')}: {first.get('reason', '?')}); nothing was published and the "
                "change log keeps every change: fix the photo, or build from a manifest"
            )
        ok_mask = np.concatenate(encoded.store.read_ok_masks()) if encoded.store.count else np.zeros(0, bool)
        rows = version_rows(items, reuse, ok_mask)
        report_reuse(report, reuse, len(to_encode))
        n = len(rows.items)
        if n == 0:
            raise BuildError(f"build of {name!r}: no item could be decoded; nothing was published")
        if encoded.ok_items:
            tokens, width = stored_token_shape(encoded.store)
        else:  # every row reused: the parent's store shape
            assert reuse.stored is not None
            parent_rerank = reuse.stored.manifest.rerank
            tokens, width = int(parent_rerank["tokens"]), int(parent_rerank["width"])
        template = IndexManifest(
            format_version=FORMAT_VERSION,
            name=name,
            version="",
            created_at="",
            model_name=model_name_of(model_dir),
            model_fingerprint=fingerprint,
            embed_dim=d,
            preprocessing={
                "image_size": cfg.vision.image_size,
                "mean": list(cfg.vision.mean),
                "std": list(cfg.vision.std),
            },
            count=n,
            index_factory="",
            search_params={},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=0.0,
            skipped=encoded.skipped,
            checksums={},
            rerank=rerank_info(dtype, tokens, width),
            parent_version=versions.current_version(root, name),
            total_rows=n,
            live_sequence=live_sequence,
            build_params={
                PLAN_HASH: key,
                BUILD_KEY: result_key,
                **({RACY_KEY: True, CONTENT_KEY: bytes_key} if racy else {}),
                REUSE_KEY: rkey,
                WORK_KEY: work_key,
                MODEL_FILES_KEY: model_key,
            },
        )
        segments = plan_segments(rows, reuse, settings, index_factory)
        if segments is not None and segments.compact:
            report.notes.append(
                f"compacted into one version (ANN index rebuilt from stored vectors, nothing encoded again): "
                f"{segments.compact}"
            )
        elif segments is not None:
            try:
                return build_segments(
                    op,
                    rows,
                    reuse,
                    segments,
                    encoded,
                    encoder,
                    template,
                    gate,
                    index_factory=index_factory,
                    work_dir=work_dir,
                )
            finally:
                reuse.close()
        # Again with the items that decoded, now that the shards are written (and others wrote meanwhile);
        # segments above write far less than a version and keep the preflight's figure.
        need = disk.version_need(
            rows.items,
            d=d,
            tokens=tokens,
            width=width,
            rerank_dtype=dtype,
            index=disk.index_bytes(n, d, settings, index_factory),
        )
        first = FirstPhotos(rows.parent_row < 0, rows.digests, rows.stats)
        if settings.index_shards > 1:
            reuse.close()
            return build_sharded(
                op,
                encoded,
                encoder,
                template,
                gate,
                index_factory=index_factory,
                need=need,
                work_dir=work_dir,
                model_dir=model_dir,
                cfg=cfg,
                first=first,
                products=products,
            )
        with op.new_version(need, f"the new version of {name!r}") as writer:
            linked = can_link(rows, reuse)
            if linked:
                link_arrays(writer, reuse, rows)
            else:
                with writer.arrays(n, d, tokens=tokens, width=width, rerank_dtype=dtype) as arrays:
                    checksums = write_rows(arrays, rows, reuse, encoded.store)
                write_reuse_digests(writer.stage, rows.digests, checksums, rows.stats)
            writer.write_metadata(
                (row, it.id, str(it.path), it.fields, False) for row, it in enumerate(rows.items)
            )
            plan, notes, report.ann_index = ann_index(writer, rows, reuse, linked, settings, index_factory)
            reuse.close()
            if wants_products(rows.items, settings):
                write_products(
                    writer.stage,
                    rows.items,
                    encoded.store,
                    encoder,
                    work_dir=work_dir,
                    model_dir=model_dir,
                    settings=settings,
                    cfg=cfg,
                    report=report,
                    first=first,
                    reuse=products,
                    linked=writer.linked_checksums,
                )
            manifest = dataclasses.replace(
                template,
                version=writer.version,
                created_at=utc_now(),
                index_factory=plan.factory,
                build_params={
                    **plan.build_params,
                    **notes,
                    "estimated_index_bytes": plan.estimated_bytes,
                    **template.build_params,
                },
            )
            captioned = [(row, it) for row, it in enumerate(rows.items) if it.captions]
            qkey = quality_key(captioned, settings.target_recall)
            manifest.build_params[QUALITY_KEY] = qkey
            measured = measured_parent(reuse, linked, bool(notes.get(ANN_LINKED)), qkey)
            if measured is not None:
                report.notes.append(
                    f"search parameters, recall and match calibration taken over from {measured.version} "
                    "(the same vectors, index and captions: measuring again would find the same)"
                )
            return op.publish(
                writer,
                manifest,
                plan,
                encoder,
                captioned,
                gate,
                items_indexed=n,
                work_dir=work_dir,
                measured=measured,
            )


def add(
    name: str,
    sources: Sequence[Path],
    *,
    settings: Settings,
    model_dir: Path | None = None,
    progress: ProgressFn | None = None,
    gate: QualityGate | None = None,
) -> BuildReport:
    """Append the sources' new items (ids not live in CURRENT) to a new version; nothing is re-encoded.
    ``gate`` judges the staged version (none passed and a threshold set: refused, see
    ``indexer.quality_gate.unwired_gate``)."""
    started = time.perf_counter()
    root = settings.index_root
    model_dir = Path(model_dir or settings.model_dir)
    scan = read_sources(sources, follow_external_links=settings.follow_external_links)
    # The whole model directory, before anything is created under the index root (model.model_check).
    check_model_dir(model_dir, backend=settings.backend, int8=settings.int8)
    fingerprint = model_fingerprint(model_dir)
    base = index_dir(root, name)
    with index_lock(root, name) as guard:
        parent = read_parent(root, name, expect_fingerprint=fingerprint)
        pm, parent_dir, n_old, parent_count = parent.manifest, parent.path, parent.total_rows, parent.count
        if pm.is_sharded:
            sharding = Sharding.from_dict(pm.sharding)
            if sharding.segmented and len(sharding.shards) >= settings.index_max_segments:
                # An add writes one more segment and never compacts: past the limit, a build does.
                raise BuildError(
                    f"index {name!r} has {len(sharding.shards)} segments (index_max_segments "
                    f"{settings.index_max_segments}): run `ccrk index build` with the whole manifest, which "
                    "compacts them (nothing is encoded again)"
                )
        live_ids = parent.live()
        new_items = [it for it in scan.items if it.id not in live_ids]
        report = BuildReport(
            "add",
            name,
            None,
            False,
            items_total=len(new_items),
            ignored_files=scan.ignored,
            skipped_links=scan.skipped_links,
            already_indexed=len(scan.items) - len(new_items),
        )
        if not new_items:
            report.notes.append("no new items: nothing published")
            return report
        cfg = load_model_config(model_dir)
        dtype = str(pm.rerank["dtype"])
        key = plan_hash(
            new_items,
            fingerprint=f"{fingerprint}:{pm.version}",
            rerank_dtype=dtype,
            shard_size=settings.shard_size,
            max_pixels=settings.max_image_pixels,
        )
        work_dir = base / BUILDS_DIR / f"add-{key}"
        d, tokens, width = pm.embed_dim, int(pm.rerank["tokens"]), int(pm.rerank["width"])
        parent_index = parent.file_bytes(INDEX_FILE)
        parent_meta = parent.file_bytes(METADATA_FILE)

        def need(added: Sequence[SourceItem], pending: tuple[int, int] | None = None) -> disk.SpaceNeed:
            # A new version copies every parent row; the index grows by the parent's bytes per row.
            index = parent_index * (n_old + len(added)) // max(1, n_old)
            return disk.version_need(
                added,
                d=d,
                tokens=tokens,
                width=width,
                rerank_dtype=dtype,
                index=index,
                pending=pending,
                parent_rows=n_old,
                parent_metadata=parent_meta,
            )

        def preflight(_: Encoder, store: ShardStore) -> None:
            guard.need = need(new_items, store.pending())
            disk.check_free_space(base, guard.need, f"the addition to {name!r}")

        # The parent's synonyms go on (``store.synonyms``) into the version the addition writes.
        op = Operation(root, name, settings, guard, report, started, current_synonyms(root, name))
        encoded, encoder = op.encode(
            new_items, work_dir, model_dir, cfg, dtype, progress, preflight, f"add to {name!r}"
        )
        segmented = segmented_parent(parent.path, pm) if parent.sharded else None
        if segmented is not None:
            try:
                return add_segment(op, segmented, encoded, encoder, gate, work_dir=work_dir)
            finally:
                segmented.close()
        if parent.sharded:
            return add_to_shards(
                op,
                parent,
                encoded,
                encoder,
                gate,
                need=need(encoded.ok_items),
                work_dir=work_dir,
                model_dir=model_dir,
                cfg=cfg,
            )
        n = n_old + len(encoded.ok_items)
        with op.new_version(need(encoded.ok_items), f"the new version of {name!r}") as writer:
            with writer.arrays(n, d, tokens=tokens, width=width, rerank_dtype=dtype) as arrays:
                arrays.copy_from(parent_dir)
                append_shards(arrays, encoded.store)
            append_digests(writer.stage, parent_dir, encoded.ok_items, encoded.store)
            writer.write_metadata(appended_metadata(parent.rows[0], encoded.ok_items, n_old))
            index = faiss.read_index(str(parent_dir / INDEX_FILE))
            embeds = writer.embeddings()
            index.add(np.ascontiguousarray(embeds[n_old:], dtype=np.float32))
            writer.write_index(index)
            del index, embeds
            if has_product_channels(parent_dir):  # extended: the parent's photos and texts, then the added
                channels = ProductChannels(parent_dir, n_old)
                try:
                    extend_products(
                        writer.stage,
                        channels,
                        encoded.ok_items,
                        encoded.store,
                        encoder,
                        first_row=n_old,
                        work_dir=work_dir,
                        model_dir=model_dir,
                        settings=settings,
                        cfg=cfg,
                        report=report,
                    )
                finally:
                    channels.close()
            # Derived from the parent's: an add without captions keeps its language recall, for one.
            manifest = dataclasses.replace(
                pm,
                version=writer.version,
                created_at=utc_now(),
                count=parent_count + len(encoded.ok_items),
                total_rows=n,
                skipped=encoded.skipped,
                parent_version=pm.version,
                checksums={},
                build_params=without_key(pm.build_params),
            )
            plan = IndexPlan(
                pm.index_factory, "parent", rescore_factor=int(pm.search_params.get("rescore_factor", 0))
            )
            captioned = [(n_old + i, it) for i, it in enumerate(encoded.ok_items) if it.captions]
            notes: list[str] = []
            if n > settings.exact_max_items and pm.index_factory == "Flat":
                notes.append(
                    f"{n} items now exceed exact_max_items {settings.exact_max_items}: the next full build "
                    "chooses an ANN index"
                )
            return op.publish(
                writer,
                manifest,
                plan,
                encoder,
                captioned,
                gate,
                items_indexed=len(encoded.ok_items),
                work_dir=work_dir,
                notes=notes,
            )
