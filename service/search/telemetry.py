"""What a search did, recorded in one place: per-stage timings (``ccrk_search_stage_seconds``), re-rank
counts (``ccrk_rerank_total``, ``ccrk_rerank_candidates``), text searches' match quality
(``ccrk_search_match_total``) and the monitor's live traffic. The facade calls it once a search is
answered, in the same worker thread (the metrics and the monitor's counters are thread-safe). A search
whose client went away meanwhile is still counted: the work was done and the answer computed.

The HTTP layer's per-request latency (``ccrk_request_seconds``) is not here: ``service.middleware`` times
every route, searches or not, labelled with the query language this module returns for text searches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from service.metrics import Metrics
from service.schemas import SearchRequest, SearchResponse
from service.search.pipeline import ConsistencyOutcome, ImageOutcome, TextOutcome
from service.search.ranking import Ranked


class TrafficObserver(Protocol):
    """The monitor's live-traffic hook (``service.monitor.Monitor``; named by its shape, so the search
    package does not import the monitor, which imports it)."""

    def observe_search(self, lang: str, request: SearchRequest, response: SearchResponse) -> None: ...


class SearchTelemetry:
    def __init__(self, metrics: Metrics, traffic: TrafficObserver, languages: Sequence[str]) -> None:
        self.metrics = metrics
        self.traffic = traffic
        self.languages = tuple(languages)
        # Each metric's child per label values, looked up once (``labels`` costs ~1 us a call: a lock and
        # the label checks, four times per search). A race only looks one up twice: the same child.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def lang_label(self, code: str) -> str:
        """Metric label of a query language: supported codes, else "other" (bounded cardinality)."""
        return code if code in self.languages else "other"

    def text(self, request: SearchRequest, outcome: TextOutcome) -> str:
        """A text search; returns its language label (the HTTP middleware's ``lang``)."""
        response = outcome.response
        if outcome.ranked is not None:  # an answer from the result cache timed no stage
            self._child(self.metrics.stage_seconds, "encode").observe(outcome.encode_s)
            self._ranked(outcome.ranked)
        elif not response.cached:  # products and hybrid search (``service.search.hybrid``)
            self._child(self.metrics.stage_seconds, "encode").observe(outcome.encode_s)
            self._child(self.metrics.stage_seconds, "search").observe(response.timings_ms.search / 1000.0)
            self._child(self.metrics.rerank, "no").inc()
        lang = self.lang_label(response.language.code)
        self.traffic.observe_search(lang, request, response)  # live traffic per language
        if request.offset == 0:  # one count per query, not per page
            self._child(self.metrics.search_match, lang, response.match or "unknown").inc()
        return lang

    def image(self, outcome: ImageOutcome) -> None:
        # The encode stage's histogram holds text encodings only; an image's is in its answer's timings.
        if outcome.ranked is None:
            self._child(self.metrics.stage_seconds, "search").observe(
                outcome.response.timings_ms.search / 1000.0
            )
            self._child(self.metrics.rerank, "no").inc()
        else:
            self._ranked(outcome.ranked)

    def consistency(self, outcome: ConsistencyOutcome) -> None:
        for ranked in outcome.ranked:
            self._ranked(ranked)

    def _ranked(self, ranked: Ranked) -> None:
        self._child(self.metrics.stage_seconds, "search").observe(ranked.search_s)
        if ranked.reranked:
            self._child(self.metrics.stage_seconds, "rerank").observe(ranked.rerank_s)
            self.metrics.rerank_candidates.observe(ranked.rerank_candidates)
        self._child(self.metrics.rerank, "yes" if ranked.reranked else "no").inc()
