"""Build, add, delete and roll back index versions; each successful operation publishes one new version.

A version is written completely in ``NAME/.builds/`` (embeddings, re-rank store, metadata, faiss index,
tuned parameters, checksums), moved into ``NAME/<version>/`` with one rename, and only then published by
switching ``CURRENT``. Any failure before that leaves CURRENT, and the version it names, untouched, and
removes the staged version (``_index_lock``); shard work folders stay, so that a re-run resumes. Free disk
space is checked before encoding and before writing a version (``indexer.disk``), and a full build whose
result is CURRENT already publishes nothing (``indexer.build_key``).

This module is over 400 lines because the three writing operations share their staging, finishing and
tuning steps here; space estimates, array writing and the build key live in their own modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ccrk_settings import Settings
from indexer import disk, staging
from indexer import index_format as fmt
from indexer.ann import IndexPlan, build_faiss_index, choose_index, tune_search_params
from indexer.build_key import BUILD_KEY, PLAN_HASH, build_key, published_as, without_key
from indexer.decode import DecodePool, Decoder
from indexer.errors import BuildError, TooManyBadItemsError
from indexer.index_format import IndexManifest, IndexVersion
from indexer.match_calibration import RECALIBRATE_MIN_CAPTIONED, calibrate_version
from indexer.quality_gate import QualityGate, resolve_gate
from indexer.shards import ShardStore, encode_shards, plan_hash
from indexer.sources import SourceItem, read_sources
from model.model_dir import ModelConfig, load_model_config
from model.runtime import Encoder, load_encoder

ProgressFn = Callable[[int, int], None]
TUNE_QUERIES = 500  # held-out queries for tuning efSearch / nprobe
LANG_SAMPLE = 200  # captions per language for the build-time text->image recall@10


@dataclass
class BuildReport:
    """What an operation did; printed by the CLI as a summary, also returned to callers and tests."""

    operation: str
    name: str
    version: str | None
    published: bool
    items_total: int = 0
    items_indexed: int = 0
    count: int = 0
    resumed_shards: int = 0
    shards: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored_files: int = 0
    skipped_links: list[dict[str, str]] = field(default_factory=list)  # symlinks not followed (sources)
    already_indexed: int = 0
    already_current: bool = False  # a build whose result CURRENT holds already: nothing was done
    index_factory: str = ""
    search_params: dict[str, Any] = field(default_factory=dict)
    measured_recall_at_10: float | None = None
    language_recall_at_10: dict[str, float] = field(default_factory=dict)
    rerank_bytes_per_image: int = 0
    encode_seconds: float = 0.0
    build_seconds: float = 0.0
    pruned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gate: dict[str, Any] | None = None  # quality gate verdict (indexer.quality_gate), when on

    @property
    def items_per_second(self) -> float:
        fresh = self.items_total if self.operation != "add" else self.items_indexed
        return fresh / self.encode_seconds if self.encode_seconds > 0 else 0.0


# -- shared helpers ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _index_lock(root: Path, name: str) -> Iterator[staging.Guard]:
    """One writer per index at a time (a second build fails fast; the lock dies with its process). A
    failure inside leaves no staged version behind, and a full disk becomes a DiskSpaceError that says
    what was needed and kept (``indexer.staging``)."""
    builds = fmt.index_dir(root, name) / fmt.BUILDS_DIR
    builds.mkdir(parents=True, exist_ok=True)
    with open(builds / "lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"another build, add or delete is running on index {name!r}") from None
        # Staged versions and trash of writers that died mid-way (we hold the lock: none is running).
        for stale in builds.iterdir():
            if stale.is_dir() and (fmt.is_version_name(stale.name) or stale.name.startswith("trash-")):
                shutil.rmtree(stale, ignore_errors=True)
        with staging.cleaned_on_failure(root, name) as guard:
            yield guard


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # published files are immutable, so sharing them between versions is safe
    except OSError:
        shutil.copy2(src, dst)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rerank_info(dtype: str, tokens: int, width: int) -> dict[str, Any]:
    if tokens == 0:  # a model without a fusion encoder: no re-rank store
        return {"dtype": "none", "tokens": 0, "width": 0, "bytes_per_image": 0}
    per = disk.rerank_bytes_per_item(tokens, width, dtype)
    return {"dtype": dtype, "tokens": tokens, "width": width, "bytes_per_image": per}


def _skipped_entry(item: SourceItem, kind: str, detail: str) -> dict[str, str]:
    return {
        "id": item.id,
        "source": item.source or str(item.path),
        "path": str(item.path),
        "kind": kind,
        "reason": f"{kind}: {detail}",
    }


def describe_skipped(entry: dict[str, str]) -> str:
    """'manifest.jsonl:4 (img/x.jpg): truncated: ...', or 'folder/x.jpg: truncated: ...' for folders."""
    path = entry.get("path")
    where = entry["source"] if path in (None, entry["source"]) else f"{entry['source']} ({path})"
    return f"{where}: {entry['reason']}"


@dataclass
class _Encoded:
    ok_items: list[SourceItem]
    skipped: list[dict[str, str]]
    store: ShardStore
    resumed: int
    seconds: float


def _encode(
    items: Sequence[SourceItem],
    work_dir: Path,
    model_dir: Path,
    settings: Settings,
    cfg: ModelConfig,
    rerank_dtype: str,
    progress: ProgressFn | None,
    preflight: Callable[[Encoder, ShardStore], None] | None = None,
) -> tuple[_Encoded, Encoder]:
    """Encode ``items`` into shards under ``work_dir``; ``preflight`` runs once the encoder is loaded,
    before the first shard (the space check)."""
    store = ShardStore(work_dir, settings.shard_size, len(items))
    started = time.perf_counter()
    # The decode pool forks before the encoder's runtime starts its thread pools.
    with DecodePool(Decoder(cfg.vision, settings.max_image_pixels), settings.index_workers) as pool:
        encoder = load_encoder(model_dir, settings.backend, settings.device, settings.threads, settings.int8)
        if preflight is not None:
            preflight(encoder, store)
        resumed = encode_shards(
            items,
            store,
            encoder,
            pool,
            batch_size=settings.index_batch_size,
            rerank_dtype=rerank_dtype,
            progress=progress,
        )
    seconds = time.perf_counter() - started
    ok_items: list[SourceItem] = []
    skipped: list[dict[str, str]] = []
    for i in range(store.count):
        shard = store.read(i)
        lo, _ = store.bounds(i)
        for j, good in enumerate(shard.ok):
            item = items[lo + j]
            if good:
                ok_items.append(item)
            else:
                skipped.append(_skipped_entry(item, shard.kinds[j], shard.details[j]))
    return _Encoded(ok_items, skipped, store, resumed, seconds), encoder


def _check_bad_share(total: int, skipped: list[dict[str, str]], limit: float, what: str) -> None:
    if total and len(skipped) / total > limit:
        kinds: dict[str, int] = {}
        for s in skipped:
            kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
        listing = "\n".join(f"  {describe_skipped(s)}" for s in skipped[:20])
        more = f"\n  ... and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        raise TooManyBadItemsError(
            f"{what}: {len(skipped)} of {total} items are bad ({len(skipped) / total:.1%} > {limit:.1%}); "
            f"nothing was published. By kind: {kinds}\n{listing}{more}"
        )


def _token_shape(store: ShardStore) -> tuple[int, int]:
    for i in range(store.count):
        shard = store.read(i)
        if shard.ok.any():
            return int(shard.tokens.shape[1]), int(shard.tokens.shape[2])
    raise BuildError("internal: no encoded item in any shard")


def _write_arrays(
    stage: Path,
    stores: Sequence[tuple[ShardStore | None, Path | None]],
    n: int,
    d: int,
    tokens: int,
    width: int,
    rerank_dtype: str,
) -> None:
    """embeddings.npy and the re-rank store for ``n`` rows: from a parent version's files (Path) and/or
    shard stores, in order. Plain writes into preallocated files, never a writable memory map: on a full
    disk a memory map dies with SIGBUS, a write raises ENOSPC (``disk.NpyWriter``)."""
    # A model without a fusion encoder has no tokens (tokens == 0): the version keeps no re-rank store.
    has_store = tokens > 0
    tok_dtype = np.float16 if rerank_dtype == "fp16" else np.int8
    with contextlib.ExitStack() as files:
        emb = files.enter_context(disk.NpyWriter(stage / fmt.EMBEDDINGS_FILE, np.float32, (n, d)))
        tok = (
            files.enter_context(disk.NpyWriter(stage / fmt.RERANK_FILE, tok_dtype, (n, tokens, width)))
            if has_store
            else None
        )
        scales = (
            files.enter_context(disk.NpyWriter(stage / fmt.RERANK_SCALES_FILE, np.float32, (n, tokens)))
            if has_store and rerank_dtype == "int8"
            else None
        )
        for store, parent in stores:
            if parent is not None:
                emb.copy_from(np.load(parent / fmt.EMBEDDINGS_FILE, mmap_mode="r"))
                if tok is not None:
                    tok.copy_from(np.load(parent / fmt.RERANK_FILE, mmap_mode="r"))
                if scales is not None:
                    scales.copy_from(np.load(parent / fmt.RERANK_SCALES_FILE, mmap_mode="r"))
            if store is not None:
                for i in range(store.count):
                    shard = store.read(i)
                    if shard.embeds.shape[0] == 0:
                        continue
                    emb.append(shard.embeds)
                    if tok is not None:
                        tok.append(shard.tokens)
                    if scales is not None and shard.scales is not None:
                        scales.append(shard.scales)


def _write_index(index: Any, path: Path) -> None:
    with disk.names_full_disk(path):
        faiss.write_index(index, str(path))


def _tuning_queries(
    version: IndexVersion, encoder: Encoder, captioned: Sequence[tuple[int, SourceItem]], seed: int
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Held-out queries: captions when the collection has them (the real query distribution), else a
    sample of the indexed images, each leaving itself out of both result lists."""
    rng = np.random.default_rng(seed)
    if captioned:
        texts = []
        for pos in rng.permutation(len(captioned))[:TUNE_QUERIES]:
            _, item = captioned[int(pos)]
            langs = sorted(item.captions)
            lang = langs[int(rng.integers(len(langs)))]
            texts.append(item.captions[lang][0])
        embeds = np.concatenate(
            [encoder.encode_text(texts[i : i + 64]).embeds for i in range(0, len(texts), 64)]
        )
        return embeds.astype(np.float32), None, "captions"
    n = version.total_rows
    rows = np.sort(rng.choice(n, size=min(n, TUNE_QUERIES), replace=False))
    return np.load(version.path / fmt.EMBEDDINGS_FILE, mmap_mode="r")[rows].astype(np.float32), rows, "images"


def language_recall(
    version: IndexVersion, encoder: Encoder, captioned: Sequence[tuple[int, SourceItem]], seed: int = 0
) -> dict[str, float]:
    """Text->image recall@10 per language: a sample of each language's captions searched in the built
    index; a hit is the caption's own image in the top 10."""
    by_lang: dict[str, list[tuple[int, str]]] = {}
    for row, item in captioned:
        for lang, texts in item.captions.items():
            if texts:
                by_lang.setdefault(lang, []).append((row, texts[0]))
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    for lang in sorted(by_lang):
        pairs = by_lang[lang]
        pick = [pairs[int(i)] for i in rng.permutation(len(pairs))[:LANG_SAMPLE]]
        rows = np.array([r for r, _ in pick], dtype=np.int64)
        texts = [t for _, t in pick]
        q = np.concatenate([encoder.encode_text(texts[i : i + 64]).embeds for i in range(0, len(texts), 64)])
        _, found = version.search(q.astype(np.float32), 10)
        out[lang] = round(float(np.mean([r in f for r, f in zip(rows, found, strict=True)])), 4)
    return out


def _finish(
    root: Path, name: str, stage: Path, manifest: IndexManifest, keep: int, publish: bool = True
) -> tuple[str, list[str]]:
    manifest.checksums = fmt.file_checksums(stage)
    with disk.names_full_disk(stage / fmt.MANIFEST_FILE):
        manifest.save(stage / fmt.MANIFEST_FILE)
    fmt.install_version(root, name, stage, manifest.version)
    if publish:  # a version refused by the quality gate is kept, not published
        try:
            with disk.names_full_disk(fmt.index_dir(root, name) / fmt.CURRENT_FILE):
                fmt.publish_version(root, name, manifest.version)
        except BaseException:
            staging.discard_installed(root, name, manifest.version)
            raise
    return manifest.version, fmt.prune_versions(root, name, keep)


def _finalise_index(
    stage: Path,
    manifest: IndexManifest,
    plan: IndexPlan,
    encoder: Encoder,
    captioned: Sequence[tuple[int, SourceItem]],
    settings: Settings,
    report: BuildReport,
) -> None:
    """Tune search parameters and measure recall on the staged version, as the service will search it."""
    with IndexVersion(stage, manifest) as staged:
        queries, self_rows, origin = _tuning_queries(staged, encoder, captioned, seed=0)
        params, recall = tune_search_params(
            staged,
            queries,
            target=settings.target_recall,
            rescore_factor=plan.rescore_factor,
            self_rows=self_rows,
        )
        manifest.search_params = params
        manifest.measured_recall_at_10 = round(recall, 4)
        manifest.recall_measured_on = int(queries.shape[0])
        manifest.build_params = {**manifest.build_params, "tuning_queries": origin}
        if recall < settings.target_recall:
            report.notes.append(
                f"recall@10 {recall:.3f} stays below the target {settings.target_recall} at the largest "
                f"search parameters tried ({params}); consider --index-factory or a larger memory budget"
            )
        if captioned:
            manifest.language_recall_at_10 = language_recall(staged, encoder, captioned)
        captions: dict[str, list[str]] = {}
        for _, item in captioned:
            for lang, texts in item.captions.items():
                captions.setdefault(lang, []).extend(texts[:1])
        # An add with few captioned items keeps the parent's thresholds (a handful of captions, or none,
        # would replace caption-calibrated thresholds by a tiny sample or by noise-only ones).
        if not manifest.match_calibration or len(captioned) >= RECALIBRATE_MIN_CAPTIONED:
            manifest.match_calibration = calibrate_version(staged, encoder, captions).to_dict()


def _quality_gate(
    stage: Path,
    manifest: IndexManifest,
    encoder: Encoder,
    captioned: Sequence[tuple[int, SourceItem]],
    settings: Settings,
    report: BuildReport,
    gate: QualityGate | None,
) -> bool:
    """Whether the staged version may be published (the injected gate, see ``indexer.quality_gate``; on
    when a gate threshold is set). The verdict goes into the manifest and the report."""
    verdict = resolve_gate(gate)(
        stage, manifest, encoder, settings, [(it.id, it.captions) for _, it in captioned]
    )
    if verdict is None:
        return True
    report.gate = verdict.to_dict()
    manifest.build_params = {**manifest.build_params, "quality_gate": report.gate}
    if not verdict.passed:
        report.notes.append(
            f"quality gate refused version {manifest.version}: it is kept, CURRENT is unchanged. "
            + "; ".join(verdict.reasons)
        )
    report.notes.extend(verdict.notes)
    return verdict.passed


def _stage_dir(root: Path, name: str, version: str) -> Path:
    stage = fmt.index_dir(root, name) / fmt.BUILDS_DIR / version
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    return stage


def _already_current(report: BuildReport, base: Path, version: str) -> BuildReport:
    report.version, report.already_current = version, True
    _fill_report(report, IndexManifest.load(base / version / fmt.MANIFEST_FILE))
    report.notes.append(
        f"already published as {version}: the sources, their files, the model and the options are those "
        "of the build behind CURRENT; nothing was built or published (--force builds anyway)"
    )
    return report


def _fill_report(report: BuildReport, manifest: IndexManifest) -> None:
    report.count = manifest.count
    report.index_factory = manifest.index_factory
    report.search_params = manifest.search_params
    report.measured_recall_at_10 = manifest.measured_recall_at_10
    report.language_recall_at_10 = manifest.language_recall_at_10
    report.rerank_bytes_per_image = int(manifest.rerank["bytes_per_image"])


# -- operations ----------------------------------------------------------------------------------------------


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
) -> BuildReport:
    """A full build from the sources (deleted items of earlier versions are gone: compaction). When CURRENT
    holds this very build's result already (same sources, files, model and options), nothing is built or
    published unless ``force``. ``gate`` judges the staged version (none passed and a threshold set:
    refused, see ``indexer.quality_gate.unwired_gate``)."""
    started = time.perf_counter()
    root = settings.index_root
    model_dir = Path(model_dir or settings.model_dir)
    scan = read_sources(sources, follow_external_links=settings.follow_external_links)
    items = scan.items
    if not items:
        raise BuildError(f"the sources hold no images: {', '.join(map(str, sources))}")
    cfg = load_model_config(model_dir)
    fingerprint = fmt.model_fingerprint(model_dir)
    report = BuildReport(
        "build",
        name,
        None,
        False,
        items_total=len(items),
        ignored_files=scan.ignored,
        skipped_links=scan.skipped_links,
    )
    base = fmt.index_dir(root, name)
    dtype, d = settings.rerank_dtype, cfg.embed_dim
    with _index_lock(root, name) as guard:
        key = plan_hash(
            items,
            fingerprint=fingerprint,
            rerank_dtype=dtype,
            shard_size=settings.shard_size,
            max_pixels=settings.max_image_pixels,
        )
        work_dir = base / fmt.BUILDS_DIR / f"build-{key}"
        result_key = build_key(key, items, settings=settings, index_factory=index_factory)
        same = None if force else published_as(root, name, result_key)
        if same is not None:
            # E.g. a re-run after a kill just after publishing: that run's work folder is all that is left.
            shutil.rmtree(work_dir, ignore_errors=True)
            return _already_current(report, base, same)

        def preflight(encoder: Encoder, store: ShardStore) -> None:
            tokens, width = disk.token_shape(encoder, cfg.vision.image_size)
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

        encoded, encoder = _encode(items, work_dir, model_dir, settings, cfg, dtype, progress, preflight)
        report.resumed_shards, report.shards = encoded.resumed, encoded.store.count
        report.skipped, report.encode_seconds = encoded.skipped, encoded.seconds
        _check_bad_share(len(items), encoded.skipped, settings.max_bad_fraction, f"build of {name!r}")
        n = len(encoded.ok_items)
        if n == 0:
            raise BuildError(f"build of {name!r}: no item could be decoded; nothing was published")
        tokens, width = _token_shape(encoded.store)
        # Again with the items that decoded, now that the shards are written (and others wrote meanwhile).
        index = disk.index_bytes(n, d, settings, index_factory)
        guard.need = disk.version_need(
            encoded.ok_items, d=d, tokens=tokens, width=width, rerank_dtype=dtype, index=index
        )
        disk.check_free_space(base, guard.need, f"the new version of {name!r}")
        version = fmt.new_version_name(root, name)
        stage = _stage_dir(root, name, version)
        _write_arrays(stage, [(encoded.store, None)], n, d, tokens, width, dtype)
        with disk.names_full_disk(stage / fmt.METADATA_FILE):
            fmt.write_metadata(
                stage / fmt.METADATA_FILE,
                ((row, it.id, str(it.path), it.fields, False) for row, it in enumerate(encoded.ok_items)),
            )
        try:
            plan = choose_index(
                n,
                d,
                exact_max_items=settings.exact_max_items,
                memory_budget_mb=settings.memory_budget_mb,
                factory=index_factory,
            )
            embeds = np.load(stage / fmt.EMBEDDINGS_FILE, mmap_mode="r")
            index, notes = build_faiss_index(embeds, plan)
        except (ValueError, RuntimeError) as exc:
            raise BuildError(f"cannot build index {index_factory or ''}: {str(exc).splitlines()[0]}") from exc
        _write_index(index, stage / fmt.INDEX_FILE)
        del index, embeds
        manifest = IndexManifest(
            format_version=fmt.FORMAT_VERSION,
            name=name,
            version=version,
            created_at=_now(),
            model_name=fmt.model_name_of(model_dir),
            model_fingerprint=fingerprint,
            embed_dim=d,
            preprocessing={
                "image_size": cfg.vision.image_size,
                "mean": list(cfg.vision.mean),
                "std": list(cfg.vision.std),
            },
            count=n,
            index_factory=plan.factory,
            search_params={},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=0.0,
            skipped=encoded.skipped,
            checksums={},
            rerank=_rerank_info(dtype, tokens, width),
            parent_version=fmt.current_version(root, name),
            total_rows=n,
            build_params={
                **plan.build_params,
                **notes,
                "estimated_index_bytes": plan.estimated_bytes,
                PLAN_HASH: key,
                BUILD_KEY: result_key,
            },
        )
        captioned = [(row, it) for row, it in enumerate(encoded.ok_items) if it.captions]
        _finalise_index(stage, manifest, plan, encoder, captioned, settings, report)
        publish = _quality_gate(stage, manifest, encoder, captioned, settings, report, gate)
        manifest.build_seconds = round(time.perf_counter() - started, 3)
        report.version, report.pruned = _finish(root, name, stage, manifest, settings.keep_versions, publish)
        report.published = publish
        report.items_indexed = n
        _fill_report(report, manifest)
        report.build_seconds = manifest.build_seconds
        shutil.rmtree(work_dir, ignore_errors=True)
    return report


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
    fingerprint = fmt.model_fingerprint(model_dir)
    with _index_lock(root, name) as guard:
        parent = IndexVersion.open(root, name, expect_fingerprint=fingerprint)
        try:
            rows = fmt.read_metadata(parent.path / fmt.METADATA_FILE)
            live_ids = {item_id for _, item_id, _, _, deleted in rows if not deleted}
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
            pm = parent.manifest
            dtype = str(pm.rerank["dtype"])
            key = plan_hash(
                new_items,
                fingerprint=f"{fingerprint}:{pm.version}",
                rerank_dtype=dtype,
                shard_size=settings.shard_size,
                max_pixels=settings.max_image_pixels,
            )
            work_dir = fmt.index_dir(root, name) / fmt.BUILDS_DIR / f"add-{key}"
            n_old = parent.total_rows
            d, tokens, width = pm.embed_dim, int(pm.rerank["tokens"]), int(pm.rerank["width"])
            parent_index = (parent.path / fmt.INDEX_FILE).stat().st_size
            parent_meta = (parent.path / fmt.METADATA_FILE).stat().st_size

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
                disk.check_free_space(fmt.index_dir(root, name), guard.need, f"the addition to {name!r}")

            encoded, encoder = _encode(
                new_items, work_dir, model_dir, settings, cfg, dtype, progress, preflight
            )
            report.resumed_shards, report.shards = encoded.resumed, encoded.store.count
            report.skipped, report.encode_seconds = encoded.skipped, encoded.seconds
            _check_bad_share(len(new_items), encoded.skipped, settings.max_bad_fraction, f"add to {name!r}")
            n = n_old + len(encoded.ok_items)
            guard.need = need(encoded.ok_items)
            disk.check_free_space(fmt.index_dir(root, name), guard.need, f"the new version of {name!r}")
            version = fmt.new_version_name(root, name)
            stage = _stage_dir(root, name, version)
            _write_arrays(stage, [(encoded.store, parent.path)], n, d, tokens, width, dtype)
            readded = {it.id for it in encoded.ok_items}

            def meta() -> Iterator[tuple[int, str, str | None, dict[str, Any], bool]]:
                for row, item_id, path, fields, deleted in rows:
                    # A deleted id added again gets a new row; the old row keeps a distinct id.
                    yield (
                        row,
                        (f"{item_id}#deleted@{row}" if deleted and item_id in readded else item_id),
                        path,
                        fields,
                        deleted,
                    )
                for offset, it in enumerate(encoded.ok_items):
                    yield n_old + offset, it.id, str(it.path), it.fields, False

            with disk.names_full_disk(stage / fmt.METADATA_FILE):
                fmt.write_metadata(stage / fmt.METADATA_FILE, meta())
            index = faiss.read_index(str(parent.path / fmt.INDEX_FILE))
            embeds = np.load(stage / fmt.EMBEDDINGS_FILE, mmap_mode="r")
            index.add(np.ascontiguousarray(embeds[n_old:], dtype=np.float32))
            _write_index(index, stage / fmt.INDEX_FILE)
            del index, embeds
            manifest = dataclasses.replace(
                pm,
                version=version,
                created_at=_now(),
                count=len(parent) + len(encoded.ok_items),
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
            _finalise_index(stage, manifest, plan, encoder, captioned, settings, report)
            if not captioned:
                manifest.language_recall_at_10 = pm.language_recall_at_10
            if n > settings.exact_max_items and pm.index_factory == "Flat":
                report.notes.append(
                    f"{n} items now exceed exact_max_items {settings.exact_max_items}: the next full build "
                    "chooses an ANN index"
                )
        finally:
            parent.close()
        publish = _quality_gate(stage, manifest, encoder, captioned, settings, report, gate)
        manifest.build_seconds = round(time.perf_counter() - started, 3)
        report.version, report.pruned = _finish(root, name, stage, manifest, settings.keep_versions, publish)
        report.published = publish
        report.items_indexed = len(encoded.ok_items)
        _fill_report(report, manifest)
        report.build_seconds = manifest.build_seconds
        shutil.rmtree(work_dir, ignore_errors=True)
    return report


def delete(name: str, ids: Sequence[str], *, settings: Settings) -> BuildReport:
    """Mark items deleted in a new version (gone from results at once; compacted by the next full build).
    Unknown or already deleted ids are an error and nothing is published."""
    started = time.perf_counter()
    root = settings.index_root
    if not ids:
        raise BuildError("no id given to delete")
    with _index_lock(root, name) as guard:
        with IndexVersion.open(root, name) as parent:
            pm = parent.manifest
            rows = fmt.read_metadata(parent.path / fmt.METADATA_FILE)
            parent_count = len(parent)
        live = {item_id: row for row, item_id, _, _, deleted in rows if not deleted}
        unknown = [i for i in ids if i not in live]
        if unknown:
            raise BuildError(
                f"cannot delete from {name!r}: unknown or already deleted id(s) "
                f"{', '.join(map(repr, unknown[:20]))}; nothing was published"
            )
        doomed = {live[i] for i in ids}
        # The large files are hard links: only the metadata is written again.
        meta_bytes = (parent.path / fmt.METADATA_FILE).stat().st_size
        guard.need = disk.SpaceNeed({"metadata": meta_bytes, "manifest": disk.MANIFEST_BYTES})
        disk.check_free_space(fmt.index_dir(root, name), guard.need, f"the deletion from {name!r}")
        version = fmt.new_version_name(root, name)
        stage = _stage_dir(root, name, version)
        for fname in pm.checksums:
            if fname != fmt.METADATA_FILE:
                _link_or_copy(parent.path / fname, stage / fname)
        with disk.names_full_disk(stage / fmt.METADATA_FILE):
            fmt.write_metadata(
                stage / fmt.METADATA_FILE,
                (
                    (row, item_id, path, fields, deleted or row in doomed)
                    for row, item_id, path, fields, deleted in rows
                ),
            )
        manifest = dataclasses.replace(
            pm,
            version=version,
            created_at=_now(),
            count=parent_count - len(doomed),
            skipped=[],
            parent_version=pm.version,
            checksums={},
            build_params=without_key(pm.build_params),
        )
        manifest.build_seconds = round(time.perf_counter() - started, 3)
        report = BuildReport("delete", name, None, False)
        report.version, report.pruned = _finish(root, name, stage, manifest, settings.keep_versions)
        report.published = True
        report.items_indexed = len(doomed)
        _fill_report(report, manifest)
        report.build_seconds = manifest.build_seconds
    return report


def rollback(name: str, *, settings: Settings, to: str | None = None, force: bool = False) -> BuildReport:
    """Publish ``to``, or the newest version before CURRENT that the quality gate did not refuse. A refused
    ``to`` is published only with ``force`` (it was never approved)."""
    root = settings.index_root
    with _index_lock(root, name):
        versions = fmt.list_versions(root, name)
        current = fmt.current_version(root, name)
        if to is None:
            older = versions[: versions.index(current)] if current in versions else []
            # Unreadable manifests are skipped too: rollback must land on a version known to be good.
            candidates = [v for v in older if fmt.version_approved(root, name, v)]
            if not candidates:
                refused = [v for v in older if v not in candidates]
                raise BuildError(
                    f"index {name!r} has no version before {current} to roll back to (kept: {versions}"
                    + (f"; refused by the quality gate: {refused}" if refused else "")
                    + ")"
                )
            to = candidates[-1]
        elif to not in versions:
            raise BuildError(f"index {name!r} has no version {to!r} (kept: {', '.join(versions) or 'none'})")
        manifest = IndexManifest.load(fmt.index_dir(root, name) / to / fmt.MANIFEST_FILE)
        forced = fmt.refused_by_gate(manifest)
        if forced and not force:
            reasons = "; ".join(manifest.build_params["quality_gate"].get("reasons") or [])
            raise BuildError(
                f"version {to} of {name!r} was refused by the quality gate and never published"
                + (f" ({reasons})" if reasons else "")
                + "; CURRENT is unchanged. Use --force to publish it anyway"
            )
        fmt.publish_version(root, name, to)
    report = BuildReport("rollback", name, to, True)
    report.notes.append(f"CURRENT was {current}")
    if forced:
        report.notes.append(f"{to} was refused by the quality gate: published with --force")
    _fill_report(report, manifest)
    return report
