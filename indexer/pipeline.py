"""The publish pipeline that ``build`` and ``add`` share, under the index lock:

    encode the new items into shards (space checked first)  ->  write a version (``store.version.writer``)
    ->  tune and measure it  ->  quality gate  ->  finish: install, publish unless refused, prune

Each operation differs only in what it encodes, which rows it copies from a parent, and how it makes its
ANN index and manifest (``indexer.build``); the steps before and after are these. ``delete`` writes no
new rows and skips tuning and the gate, but stages its version here too (``Operation.new_version``).
Sharded versions take the same steps shard by shard (``indexer.sharded``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ccrk_settings import Settings
from indexer import disk, encoding, gpu, staging
from indexer.ann import IndexPlan, build_faiss_index, choose_index
from indexer.encoding import Encoded, Preflight
from indexer.errors import BuildError
from indexer.quality_gate import QualityGate, resolve_gate
from indexer.report import BuildReport
from indexer.shards import ProgressFn
from indexer.sources import SourceItem
from indexer.tuning import CaptionedRows, tune_staged
from model.model_dir import ModelConfig
from model.runtime import Encoder
from store.layout import index_dir
from store.shards.sharded_writer import ShardedVersionWriter
from store.synonyms import SynonymSet, write_version_synonyms
from store.version.manifest import IndexManifest
from store.version.sharding import SHARD_RULE
from store.version.versions import record_gate
from store.version.writer import Finished, StagedFiles, StagedVersion, VersionWriter


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_ann_index(
    files: StagedFiles,
    n: int,
    d: int,
    settings: Settings,
    factory: str | None,
    *,
    memory_budget_mb: int,
    where: str = "",
) -> tuple[IndexPlan, dict[str, Any]]:
    """Choose, build and write the ANN index of the ``n`` staged embeddings (a version's, or one shard's
    with its part of the budget; ``where`` names the shard in an error). Returns the plan and its notes."""
    try:
        plan = choose_index(
            n, d, exact_max_items=settings.exact_max_items, memory_budget_mb=memory_budget_mb, factory=factory
        )
        # HNSW graphs are built on the CPU either way: no GPU probe (a child process) for them.
        use_gpu = False if plan.kind == "hnsw" else gpu.index_device(settings.index_gpu).use_gpu
        index, notes = build_faiss_index(files.embeddings(), plan, use_gpu=use_gpu)
    except (ValueError, RuntimeError) as exc:
        raise BuildError(f"cannot build index {factory or ''}{where}: {str(exc).splitlines()[0]}") from exc
    files.write_index(index)
    return plan, notes


def rerank_info(dtype: str, tokens: int, width: int) -> dict[str, Any]:
    """The manifest's ``rerank`` entry for a store of (T, W) tokens."""
    if tokens == 0:  # a model without a fusion encoder: no re-rank store
        return {"dtype": "none", "tokens": 0, "width": 0, "bytes_per_image": 0}
    per = disk.rerank_bytes_per_item(tokens, width, dtype)
    return {"dtype": dtype, "tokens": tokens, "width": width, "bytes_per_image": per}


StagedT = TypeVar("StagedT", bound=StagedVersion)


@dataclass
class Operation:
    """One operation on index ``name`` while it holds the index lock (``guard`` is the lock's)."""

    root: Path
    name: str
    settings: Settings
    guard: staging.Guard
    report: BuildReport
    started: float  # time.perf_counter() when the operation began
    # The synonyms the new version holds (``store.synonyms``): a build's --synonyms, else carried over.
    synonyms: SynonymSet | None = None

    @property
    def base(self) -> Path:
        return index_dir(self.root, self.name)

    def encode(
        self,
        items: Sequence[SourceItem],
        work_dir: Path,
        model_dir: Path,
        cfg: ModelConfig,
        rerank_dtype: str,
        progress: ProgressFn | None,
        preflight: Preflight,
        what: str,
        *,
        total: int | None = None,
    ) -> tuple[Encoded, Encoder]:
        """Encode ``items`` into shards (``preflight``: the space check, once the encoder is loaded); the
        share of bad items among ``total`` (default: ``items``; a build that reuses stored vectors encodes
        only some of its items) must stay within the settings' limit (``what`` names the operation)."""
        encoded, encoder = encoding.encode(
            items, work_dir, model_dir, self.settings, cfg, rerank_dtype, progress, preflight
        )
        self.report.resumed_shards, self.report.shards = encoded.resumed, encoded.store.count
        self.report.engine, self.report.encode_nodes = self.settings.engine, encoded.nodes
        self.report.skipped, self.report.encode_seconds = encoded.skipped, encoded.seconds
        encoding.check_bad_share(
            len(items) if total is None else total, encoded.skipped, self.settings.max_bad_fraction, what
        )
        return encoded, encoder

    def new_version(self, need: disk.SpaceNeed, what: str) -> VersionWriter:
        """A writer of the next version, once ``need`` is known to fit (``what``: for the refusal)."""
        self.guard.need = need
        disk.check_free_space(self.base, need, what)
        return self._with_synonyms(VersionWriter(self.root, self.name))

    def publish(
        self,
        writer: VersionWriter,
        manifest: IndexManifest,
        plan: IndexPlan,
        encoder: Encoder,
        captioned: CaptionedRows,
        gate: QualityGate | None,
        *,
        items_indexed: int,
        work_dir: Path,
        notes: Sequence[str] = (),
        measured: IndexManifest | None = None,
    ) -> BuildReport:
        """Tune the staged version, let the gate judge it, finish it (published unless refused), and fill
        in the report; the shard work folder goes once the version is in place. ``notes`` follow the
        tuning's in the report. ``measured``: a version with the very same vectors, index, captions and
        target, whose tuning and measurements (deterministic) are taken over instead of repeated."""
        report, settings = self.report, self.settings
        if measured is None:
            tune_staged(writer, manifest, plan, encoder, captioned, settings, report)
        else:
            inherit_measurements(manifest, measured)
        report.notes.extend(notes)
        if "gpu_fallback" in manifest.build_params:
            report.notes.append(
                "ANN index built on the CPU: the GPU build failed "
                f"({gpu.explain(str(manifest.build_params['gpu_fallback']))})"
            )
        publish = judge(writer.stage, manifest, encoder, captioned, settings, report, gate)
        manifest.build_seconds = round(time.perf_counter() - self.started, 3)
        done = writer.finish(manifest, publish=publish, keep=settings.keep_versions)
        return self.finished(done, manifest, items_indexed, work_dir)

    def new_sharded_version(
        self, need: disk.SpaceNeed, what: str, shard_count: int, *, rule: str = SHARD_RULE
    ) -> ShardedVersionWriter:
        """A writer of the next version, sharded (``store.shards.sharded_writer``; ``rule``: hash shards or
        build
        segments, ``store.version.sharding``), once ``need`` is known to fit."""
        self.guard.need = need
        disk.check_free_space(self.base, need, what)
        return self._with_synonyms(ShardedVersionWriter(self.root, self.name, shard_count, rule=rule))

    def _with_synonyms(self, writer: StagedT) -> StagedT:
        """The writer, its stage holding the operation's synonyms (a failed write removes the stage)."""
        if self.synonyms:
            try:
                write_version_synonyms(writer.stage, self.synonyms)
            except BaseException:
                writer.abort()
                raise
        return writer

    def finished(
        self, done: Finished, manifest: IndexManifest, items_indexed: int, work_dir: Path | None
    ) -> BuildReport:
        """Fill in the report once the version is in place; the shard work folder goes."""
        report = self.report
        report.version, report.pruned = done.version, done.pruned
        report.published = done.published
        report.items_indexed = items_indexed
        report.fill_from(manifest)
        report.build_seconds = manifest.build_seconds
        if work_dir is not None:
            shutil.rmtree(work_dir, ignore_errors=True)
        return report


def inherit_measurements(manifest: IndexManifest, measured: IndexManifest) -> None:
    """What tuning and measuring would find again: search parameters, recall, match calibration."""
    manifest.search_params = dict(measured.search_params)
    manifest.measured_recall_at_10 = measured.measured_recall_at_10
    manifest.recall_measured_on = measured.recall_measured_on
    manifest.language_recall_at_10 = dict(measured.language_recall_at_10)
    manifest.match_calibration = dict(measured.match_calibration)
    # The re-rank policy's gaps are measured on the same vectors and captions (``indexer.rerank_policy``).
    manifest.rerank = {k: v for k, v in manifest.rerank.items() if k != "policy"}
    if "policy" in measured.rerank:
        manifest.rerank["policy"] = measured.rerank["policy"]
    if "tuning_queries" in measured.build_params:
        manifest.build_params = {
            **manifest.build_params,
            "tuning_queries": measured.build_params["tuning_queries"],
        }


def judge(
    stage: Path,
    manifest: IndexManifest,
    encoder: Encoder,
    captioned: CaptionedRows,
    settings: Settings,
    report: BuildReport,
    gate: QualityGate | None,
) -> bool:
    """Whether the version staged in ``stage`` may be published (the injected gate, see
    ``indexer.quality_gate``; on when a gate threshold is set). The verdict goes into the manifest and the
    report."""
    verdict = resolve_gate(gate)(
        stage, manifest, encoder, settings, [(it.id, it.captions) for _, it in captioned]
    )
    if verdict is None:
        return True
    report.gate = verdict.to_dict()
    record_gate(manifest, report.gate)
    if not verdict.passed:
        report.notes.append(
            f"quality gate refused version {manifest.version}: it is kept, CURRENT is unchanged. "
            + "; ".join(verdict.reasons)
        )
    report.notes.extend(verdict.notes)
    return verdict.passed
