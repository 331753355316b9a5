"""Tuning and measuring a staged version as the service will search it: search parameters for the target
recall@10 on held-out queries, text->image recall per language, the match calibration thresholds and the
re-rank policy's gaps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ccrk_settings import Settings
from indexer.ann import IndexPlan, tune_search_params
from indexer.match_calibration import RECALIBRATE_MIN_CAPTIONED, calibrate_version
from indexer.report import BuildReport
from indexer.rerank_policy import CALIBRATION_QUERIES
from indexer.rerank_policy import calibrate_version as calibrate_rerank_policy
from indexer.sources import SourceItem
from model.runtime import Encoder
from store.opening import OpenedIndex
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion, SearchableIndex
from store.version.writer import VersionWriter

TUNE_QUERIES = 500  # held-out queries for tuning efSearch / nprobe
LANG_SAMPLE = 200  # captions per language for the build-time text->image recall@10

# (row, item) of the operation's items that carry captions.
CaptionedRows = Sequence[tuple[int, SourceItem]]


def caption_queries(encoder: Encoder, captioned: CaptionedRows, seed: int) -> np.ndarray | None:
    """Held-out text queries (one caption each of up to ``TUNE_QUERIES`` captioned items, the real query
    distribution), encoded; None when the collection has no captions."""
    if not captioned:
        return None
    rng = np.random.default_rng(seed)
    texts = []
    for pos in rng.permutation(len(captioned))[:TUNE_QUERIES]:
        _, item = captioned[int(pos)]
        langs = sorted(item.captions)
        lang = langs[int(rng.integers(len(langs)))]
        texts.append(item.captions[lang][0])
    embeds = np.concatenate([encoder.encode_text(texts[i : i + 64]).embeds for i in range(0, len(texts), 64)])
    return embeds.astype(np.float32)


def tuning_queries(
    version: OpenedIndex, encoder: Encoder, captioned: CaptionedRows, seed: int
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Held-out queries: captions when the collection has them (``caption_queries``), else a sample of the
    indexed images, each leaving itself out of both result lists."""
    texts = caption_queries(encoder, captioned, seed)
    if texts is not None:
        return texts, None, "captions"
    rng = np.random.default_rng(seed)
    n = version.total_rows
    rows = np.sort(rng.choice(n, size=min(n, TUNE_QUERIES), replace=False))
    return version.embeddings(rows), rows, "images"


def language_recall(
    version: SearchableIndex, encoder: Encoder, captioned: CaptionedRows, seed: int = 0
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


def tune_version(
    version: IndexVersion,
    manifest: IndexManifest,
    plan: IndexPlan,
    queries: tuple[np.ndarray, np.ndarray | None, str],
    target: float,
) -> float:
    """Tune one staged version's (or shard's) search parameters on held-out ``queries`` (embeddings, rows
    left out, origin) for ``target`` recall@10; the results go into ``manifest``. Returns the recall."""
    embeds, self_rows, origin = queries
    params, recall = tune_search_params(
        version, embeds, target=target, rescore_factor=plan.rescore_factor, self_rows=self_rows
    )
    manifest.search_params = params
    manifest.measured_recall_at_10 = round(recall, 4)
    manifest.recall_measured_on = int(embeds.shape[0])
    manifest.build_params = {**manifest.build_params, "tuning_queries": origin}
    return recall


def recall_note(recall: float, target: float, params: object) -> str:
    return (
        f"recall@10 {recall:.3f} stays below the target {target} at the largest search parameters tried "
        f"({params}); consider --index-factory or a larger memory budget"
    )


def measure_quality(
    index: SearchableIndex,
    manifest: IndexManifest,
    encoder: Encoder,
    captioned: CaptionedRows,
    policy_queries: int = CALIBRATION_QUERIES,
) -> None:
    """Text->image recall per language and the match calibration of a staged index as the service will
    search it (one version or the merged shards), into ``manifest``."""
    if captioned:
        manifest.language_recall_at_10 = language_recall(index, encoder, captioned)
    captions: dict[str, list[str]] = {}
    for _, item in captioned:
        for lang, texts in item.captions.items():
            captions.setdefault(lang, []).extend(texts[:1])
    # An add with few captioned items keeps the parent's thresholds (a handful of captions, or none,
    # would replace caption-calibrated thresholds by a tiny sample or by noise-only ones).
    if not manifest.match_calibration or len(captioned) >= RECALIBRATE_MIN_CAPTIONED:
        manifest.match_calibration = calibrate_version(index, encoder, captions).to_dict()
        # The re-rank policy's gaps likewise (``indexer.rerank_policy``); none without captions.
        policy = (
            calibrate_rerank_policy(index, encoder, captions, queries=policy_queries)
            if manifest.rerank.get("tokens")
            else None
        )
        manifest.rerank = {k: v for k, v in manifest.rerank.items() if k != "policy"}
        if policy is not None:
            manifest.rerank["policy"] = policy.to_dict()


def tune_staged(
    writer: VersionWriter,
    manifest: IndexManifest,
    plan: IndexPlan,
    encoder: Encoder,
    captioned: CaptionedRows,
    settings: Settings,
    report: BuildReport,
) -> None:
    """Tune search parameters and measure recall on the staged version, as the service will search it;
    the results go into ``manifest`` (and a note into ``report`` when the target is out of reach)."""
    with IndexVersion(writer.stage, manifest) as staged:
        queries = tuning_queries(staged, encoder, captioned, seed=0)
        recall = tune_version(staged, manifest, plan, queries, settings.target_recall)
        if recall < settings.target_recall:
            report.notes.append(recall_note(recall, settings.target_recall, manifest.search_params))
        measure_quality(staged, manifest, encoder, captioned, settings.rerank_policy_queries)
