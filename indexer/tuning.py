"""Tuning and measuring a staged version as the service will search it: search parameters for the target
recall@10 on held-out queries, text->image recall per language, and the match calibration thresholds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ccrk_settings import Settings
from indexer.ann import IndexPlan, tune_search_params
from indexer.match_calibration import RECALIBRATE_MIN_CAPTIONED, calibrate_version
from indexer.report import BuildReport
from indexer.sources import SourceItem
from model.runtime import Encoder
from store.layout import EMBEDDINGS_FILE
from store.manifest import IndexManifest
from store.reader import IndexVersion
from store.writer import VersionWriter

TUNE_QUERIES = 500  # held-out queries for tuning efSearch / nprobe
LANG_SAMPLE = 200  # captions per language for the build-time text->image recall@10

# (row, item) of the operation's items that carry captions.
Captioned = Sequence[tuple[int, SourceItem]]


def tuning_queries(
    version: IndexVersion, encoder: Encoder, captioned: Captioned, seed: int
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
    return np.load(version.path / EMBEDDINGS_FILE, mmap_mode="r")[rows].astype(np.float32), rows, "images"


def language_recall(
    version: IndexVersion, encoder: Encoder, captioned: Captioned, seed: int = 0
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


def tune_staged(
    writer: VersionWriter,
    manifest: IndexManifest,
    plan: IndexPlan,
    encoder: Encoder,
    captioned: Captioned,
    settings: Settings,
    report: BuildReport,
) -> None:
    """Tune search parameters and measure recall on the staged version, as the service will search it;
    the results go into ``manifest`` (and a note into ``report`` when the target is out of reach)."""
    with IndexVersion(writer.stage, manifest) as staged:
        queries, self_rows, origin = tuning_queries(staged, encoder, captioned, seed=0)
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
