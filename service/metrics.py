"""Prometheus metrics, one registry per app (tests run several apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

# Fine buckets at the low end: a plain search answers in a few milliseconds.
LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_seconds = Histogram(
            "ccrk_request_seconds",
            "HTTP request latency by route, status class and query language.",
            ["route", "method", "status", "lang"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "ccrk_search_stage_seconds",
            "Time per search stage (encode, search, rerank).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_events = Counter(
            "ccrk_cache_total",
            "Cache lookups by cache and outcome (hit, miss).",
            ["cache", "outcome"],
            registry=r,
        )
        self.redis_errors = Counter(
            "ccrk_redis_errors_total",
            "Redis calls that failed or timed out (served without cache).",
            ["error"],
            registry=r,
        )
        self.rerank = Counter(
            "ccrk_rerank_total",
            "Searches by whether the fusion encoder re-ranked them.",
            ["used"],
            registry=r,
        )
        self.rerank_candidates = Histogram(
            "ccrk_rerank_candidates",
            "Candidates scored by the fusion encoder per re-ranked search.",
            buckets=(8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.index_items = Gauge("ccrk_index_items", "Live items in the loaded index.", registry=r)
        self.index_info = Info("ccrk_index", "The loaded index version.", registry=r)
        self.index_loaded_timestamp = Gauge(
            "ccrk_index_loaded_timestamp_seconds",
            "When the loaded index version was swapped in.",
            registry=r,
        )
        self.index_reloads = Counter(
            "ccrk_index_reloads_total",
            "Index loads by outcome (ok, failed).",
            ["outcome"],
            registry=r,
        )

    def cache_event(self, outcome: str, detail: str) -> None:
        """Callback of ``Cache``: hit/miss per namespace, or an error with its exception name."""
        if outcome == "error":
            self.redis_errors.labels(detail).inc()
        else:
            self.cache_events.labels(detail, outcome).inc()
