"""Probe runs: every probe's parallel queries searched one at a time, scored against its target ids.

Per language: Recall@1/5/10, overlap@k with the other languages' lists, latency; over languages: MRV and
mrv_std (``model.metrics``, numpy only) on the (probes, languages) table of 0-based target ranks. A target
not within the first ``depth`` results counts as rank ``depth`` (so MRV is a lower bound past that depth).

Two ways to search: in process against an opened version (a ``SearchableIndex``, sharded or not) and an
``Encoder`` (the quality gate, the service's background probes, ``ccrk probe run --index-root``), or over
HTTP against a running service.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.metrics import mrv, mrv_std, recall_at_k
from model.runtime import Encoder
from monitoring.consistency import consistency_report
from monitoring.probe_set import Probe
from store.products.hybrid import FusionModel, HybridQuery, gather
from store.text.lexical import analyze
from store.version.reader import SearchableIndex

RECALL_KS = (1, 5, 10)
OVERLAP_K = 10


class ProbeError(RuntimeError):
    """A probe run cannot be made (no common languages, a search failed); the message says why."""


@dataclass
class Answer:
    """One searched query: result ids, best first, and what answered it."""

    ids: list[str]
    index_version: str | None = None
    model: str | None = None


SearchFn = Callable[[str, str, int], Answer]  # (lang, text, depth) -> answer


def has_text_channels(index: SearchableIndex) -> bool:
    """Whether a version holds searched text fields (``store.products.channels``): hybrid search applies, as
    the
    service's default mode says (``store.products.channels.default_mode``), fused as calibrated or, with
    nothing
    usable calibrated, by reciprocal rank."""
    products = getattr(index, "products", None)
    return bool(products is not None and products.info.texts)


def index_searcher(
    index: SearchableIndex, encoder: Encoder, model: str | None = None, mode: str = "image"
) -> SearchFn:
    """Dual-encoder search of one opened version, as the service's first stage does it (no re-ranking);
    ``mode`` hybrid or text: the version's product channels fused as calibrated (``store.products.hybrid``),
    the
    probe's language taken as known."""
    version = index.manifest.version
    if mode != "image":
        return _hybrid_searcher(index, encoder, model, mode)

    def search(lang: str, text: str, depth: int) -> Answer:
        embeds = encoder.encode_text([text], languages=[lang]).embeds  # an acquired language: its acquirer
        _, rows = index.search(embeds, min(depth, max(1, len(index))))
        found = [int(r) for r in rows[0] if r >= 0]
        return Answer([item["id"] for item in index.items(found)], version, model)

    return search


def _hybrid_searcher(index: SearchableIndex, encoder: Encoder, model: str | None, mode: str) -> SearchFn:
    if not has_text_channels(index):
        raise ProbeError(f"mode {mode!r} needs a version built with text fields (--text-fields)")
    channels = index.products  # type: ignore[attr-defined]
    # As the service ranks it (``service.search.hybrid.HybridRanker.fusion``): reciprocal rank in place of a
    # missing or unparseable stored fusion.
    fusion = FusionModel.stored(channels.info.fusion).model
    live = index.live_mask() if hasattr(index, "live_mask") else None
    version = index.manifest.version

    def search(lang: str, text: str, depth: int) -> Answer:
        embed = encoder.encode_text([text], languages=[lang]).embeds[0]
        group = fusion.group_of([lang])
        cands = gather(
            channels,
            HybridQuery(embed, analyze(text, lang), group),
            depth,
            live,
            use_image=mode != "text",
        )
        scores = fusion.score(cands, mode, group)
        order = np.argsort(-scores, kind="stable")[:depth]
        rows = [int(cands.rows[i]) for i in order]
        return Answer([item["id"] for item in index.items(rows)], version, model)

    return search


class HttpSearcher:
    """Searches a running service through ``POST /v1/search`` (the path shoppers use)."""

    def __init__(
        self, base_url: str, *, rerank: bool | None = None, timeout_s: float = 30.0, mode: str | None = None
    ) -> None:
        import httpx  # only the HTTP mode needs it

        self._httpx = httpx
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)
        self.rerank = rerank
        self.mode = mode

    def __call__(self, lang: str, text: str, depth: int) -> Answer:
        body: dict[str, Any] = {"query": text, "lang": lang, "top_k": depth}
        if self.rerank is not None:
            body["rerank"] = self.rerank
        if self.mode is not None:
            body["mode"] = self.mode
        try:
            response = self.client.post("/v1/search", json=body)
        except self._httpx.HTTPError as exc:
            raise ProbeError(f"search request to {self.client.base_url} failed: {exc}") from None
        if response.status_code != 200:
            raise ProbeError(
                f"{self.client.base_url}/v1/search answered {response.status_code}: {response.text[:300]}"
            )
        data = response.json()
        return Answer([hit["id"] for hit in data["results"]], data.get("index_version"), data.get("model"))

    def close(self) -> None:
        self.client.close()


def common_languages(probes: Sequence[Probe], languages: Sequence[str] | None = None) -> list[str]:
    """Languages every probe has (first probe's order), optionally restricted to ``languages``."""
    if not probes:
        return []
    langs = [lang for lang in probes[0].queries if all(lang in p.queries for p in probes)]
    if languages is not None:
        langs = [lang for lang in langs if lang in set(languages)]
    return langs


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return round(float(p50), 3), round(float(p95), 3)


def score_run(
    lists: dict[str, list[list[str]]], probes: Sequence[Probe], depth: int, latencies: dict[str, list[float]]
) -> dict[str, Any]:
    """Metrics of a run from each language's result lists (aligned with ``probes``)."""
    langs = list(lists)
    table = np.full((len(probes), len(langs)), depth, dtype=np.int64)
    for j, lang in enumerate(langs):
        for i, (probe, ids) in enumerate(zip(probes, lists[lang], strict=True)):
            targets = set(probe.target_ids)
            table[i, j] = next((rank for rank, item in enumerate(ids[:depth]) if item in targets), depth)
    overlap_sum = {lang: 0.0 for lang in langs}
    mean_overlaps = []
    for i in range(len(probes)):
        report = consistency_report({lang: lists[lang][i][:OVERLAP_K] for lang in langs}, OVERLAP_K)
        mean_overlaps.append(report["mean_overlap"])
        for pair in report["pairs"]:  # type: ignore[union-attr]
            overlap_sum[pair["a"]] += pair["overlap"]
            overlap_sum[pair["b"]] += pair["overlap"]
    pairs_per_lang = max(1, len(langs) - 1) * len(probes)
    per_language: dict[str, dict[str, float]] = {}
    for j, lang in enumerate(langs):
        column = table[:, j : j + 1]
        p50, p95 = _percentiles(latencies[lang])
        per_language[lang] = {
            **{f"recall_at_{k}": round(float(recall_at_k(column, k)[0]), 4) for k in RECALL_KS},
            "mean_rank": round(float(column.mean()), 3),
            f"overlap_at_{OVERLAP_K}": round(overlap_sum[lang] / pairs_per_lang, 4),
            "latency_ms_p50": p50,
            "latency_ms_p95": p95,
        }
    p50, p95 = _percentiles([v for lang in langs for v in latencies[lang]])
    return {
        "n_probes": len(probes),
        "depth": depth,
        "languages": langs,
        "per_language": per_language,
        "mrv": round(mrv(table), 4),
        "mrv_std": round(mrv_std(table), 4),
        "mean_overlap": round(float(np.mean(mean_overlaps)), 4),
        "recall_at_10_mean": round(float(recall_at_k(table, 10).mean()), 4),
        "latency_ms_p50": p50,
        "latency_ms_p95": p95,
    }


def run_probes(
    probes: Sequence[Probe],
    search: SearchFn,
    *,
    depth: int = 100,
    languages: Sequence[str] | None = None,
    pause_s: float = 0.0,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Search every probe in every common language, one query at a time; the run's metrics plus the
    index version and model that answered (``None`` when the run was stopped early)."""
    langs = common_languages(probes, languages)
    if len(langs) < 2:
        raise ProbeError(f"the probes share fewer than two languages ({langs}); MRV needs at least two")
    lists: dict[str, list[list[str]]] = {lang: [] for lang in langs}
    latencies: dict[str, list[float]] = {lang: [] for lang in langs}
    versions: list[str] = []
    model: str | None = None
    for probe in probes:
        for lang in langs:
            if should_stop is not None and should_stop():
                raise ProbeError("the probe run was stopped")
            start = time.perf_counter()
            answer = search(lang, probe.queries[lang], depth)
            latencies[lang].append((time.perf_counter() - start) * 1000.0)
            lists[lang].append(answer.ids)
            if answer.index_version and (not versions or versions[-1] != answer.index_version):
                versions.append(answer.index_version)
            model = answer.model or model
            if pause_s:
                time.sleep(pause_s)  # yields the cores to live traffic between probe queries
    metrics = score_run(lists, probes, depth, latencies)
    # A swap during an HTTP run mixes versions: the record names the last one and says so.
    metrics["index_version"] = versions[-1] if versions else None
    if len(versions) > 1:
        metrics["mixed_versions"] = versions
    metrics["model"] = model
    return metrics


def run_record(metrics: dict[str, Any], *, source: str, **extra: Any) -> dict[str, Any]:
    """A history record: ``{time, index_version, model, source, per-language metrics, ...}``."""
    return {"time": round(time.time(), 3), "source": source, **metrics, **extra}
