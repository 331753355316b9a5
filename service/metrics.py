"""Prometheus metrics, one registry per app (tests run several apps in one process).

Under ``ccrk serve --workers N`` every process writes its samples to files in the shared worker folder
(prometheus_client's multiprocess mode, switched on for the workers by ``PROMETHEUS_MULTIPROC_DIR``) and
``/metrics`` answers the sum over all processes, whichever process serves the scrape.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

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
    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self._index_labels: tuple[str, str] | None = None
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
        self.search_match = Counter(
            "ccrk_search_match_total",
            "Text searches by query language and the match quality of their best result (none: no good "
            "match; a rising share after a catalogue or model change is worth a look).",
            ["lang", "match"],
            registry=r,
        )
        self.rerank_candidates = Histogram(
            "ccrk_rerank_candidates",
            "Candidates scored by the fusion encoder per re-ranked search.",
            buckets=(8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        # Gauges of several processes: the largest value among the live ones (they serve the same index).
        self.index_items = Gauge(
            "ccrk_index_items", "Live items in the loaded index.", registry=r, multiprocess_mode="livemax"
        )
        # A gauge, not an Info (unsupported with several processes): 1 for the served name and version.
        self.index_info = Gauge(
            "ccrk_index_info",
            "The loaded index version (1; 0 for versions served before).",
            ["name", "version"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.catalogue_items = Gauge(
            "ccrk_catalogue_items",
            "Items of each served index (several with `ccrk serve --index-name a,b,c`).",
            ["index"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.index_loaded_timestamp = Gauge(
            "ccrk_index_loaded_timestamp_seconds",
            "When the loaded index version was swapped in.",
            registry=r,
            multiprocess_mode="livemax",
        )
        # The live catalogue (``service.live``): each write's way from the change log into every process.
        self.live_writes = Counter(
            "ccrk_live_writes_total",
            "Product writes through the API by index, kind (patch, delete) and outcome (ok: durable in the "
            "change log; unavailable: the log did not answer, nothing written).",
            ["index", "kind", "outcome"],
            registry=r,
        )
        self.live_apply_lag = Histogram(
            "ccrk_live_apply_lag_seconds",
            "Seconds from a change's commit in the log to its application in this process's searches.",
            ["index"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0),
            registry=r,
        )
        self.live_applied = Gauge(
            "ccrk_live_applied_sequence",
            "The last change-log sequence number applied to the served version (the laggard process's).",
            ["index"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.live_pending = Gauge(
            "ccrk_live_pending_changes",
            "Changes in the index's log that no published version holds yet (folded by the next build).",
            ["index"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.live_log_up = Gauge(
            "ccrk_live_log_readable",
            "1 while the index's change log can be read, 0 while it cannot (searches answer from the changes"
            " already applied; writes get 503).",
            ["index"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.live_notices_up = Gauge(
            "ccrk_live_notices_listening",
            "With the change log in PostgreSQL: 1 while this process LISTENs for its NOTIFY, 0 while it "
            "cannot (it still shows every write, at its CCRK_LIVE_POLL_S poll).",
            registry=r,
            multiprocess_mode="livemin",
        )
        # Search analytics (``service.analytics``): the query log's rows and the shoppers' events.
        self.analytics_logged = Counter(
            "ccrk_analytics_logged_total", "Searches written to the index's query log.", ["index"], registry=r
        )
        self.analytics_dropped = Counter(
            "ccrk_analytics_dropped_total",
            "Searches left out of the query log: buffer_full (the oldest buffered dropped) or write_failed "
            "(the log could not be written, e.g. a full disk; searches go on).",
            ["index", "reason"],
            registry=r,
        )
        self.analytics_events = Counter(
            "ccrk_analytics_events_total",
            "Events (click, add_to_cart, purchase) written through POST /v1/events.",
            ["index", "kind"],
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

    def index_served(self, name: str, version: str) -> None:
        """The info gauge after a swap: the old version's series drops to 0 (with several processes, a
        series cannot be removed from the others' files), the new one is 1."""
        if self._index_labels is not None and self._index_labels != (name, version):
            self.index_info.labels(*self._index_labels).set(0)
            if self.multiprocess_dir is None:
                self.index_info.remove(*self._index_labels)
        self.index_info.labels(name, version).set(1)
        self._index_labels = (name, version)

    def exposition(self) -> bytes:
        """The text format of every metric: this process's, or the sum over all worker processes."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(self.multiprocess_dir))
        return generate_latest(registry)

    def process_exited(self) -> None:
        """Drop this process's live gauges from the shared files (the lifespan's end)."""
        if self.multiprocess_dir is not None:
            process_exited(self.multiprocess_dir, os.getpid())


def process_exited(multiprocess_dir: Path, pid: int) -> None:
    """Drop a worker process's live gauges from the shared files (it exited, or was killed)."""
    multiprocess.mark_process_dead(pid, str(multiprocess_dir))
