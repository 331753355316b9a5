"""Live traffic per language and minute: query count, zero-result share, no-good-match share (the top
result labelled ``none`` by the version's match calibration), mean top score, latency percentiles (from a
fixed-bucket histogram, so minutes of several processes add up), live ANN recall.

Searches are folded into in-process buckets (a dict update under a lock: nothing on the request path
touches Redis or disk); the monitor drains them to the history store every ``traffic_flush_s``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Upper bounds of the latency histogram, milliseconds (the last bucket is open).
LATENCY_BOUNDS_MS = (1, 2, 3, 5, 7.5, 10, 15, 25, 50, 75, 100, 250, 500, 1000, 2500, 5000)


def _empty_hist() -> list[int]:
    return [0] * (len(LATENCY_BOUNDS_MS) + 1)


@dataclass
class Bucket:
    """One language's traffic in one minute (``minute``: unix time of its start, a multiple of 60)."""

    minute: int
    lang: str
    count: int = 0
    zero: int = 0
    top_sum: float = 0.0
    top_n: int = 0
    ann_n: int = 0
    ann_sum: float = 0.0
    latency_hist: list[int] = field(default_factory=_empty_hist)
    no_match: int = 0  # queries whose top result was labelled "none" (added last: stores read by position)

    def merge(self, other: Bucket) -> None:
        self.count += other.count
        self.zero += other.zero
        self.top_sum += other.top_sum
        self.top_n += other.top_n
        self.ann_n += other.ann_n
        self.ann_sum += other.ann_sum
        self.no_match += other.no_match
        self.latency_hist = [a + b for a, b in zip(self.latency_hist, other.latency_hist, strict=True)]

    def summary(self) -> dict[str, Any]:
        """The figures the dashboard plots."""
        return {
            "minute": self.minute,
            "lang": self.lang,
            "count": self.count,
            "zero_result_rate": round(self.zero / self.count, 4) if self.count else None,
            "no_match_rate": round(self.no_match / self.count, 4) if self.count else None,
            "mean_top_score": round(self.top_sum / self.top_n, 4) if self.top_n else None,
            "latency_ms_p50": latency_quantile(self.latency_hist, 0.50),
            "latency_ms_p95": latency_quantile(self.latency_hist, 0.95),
            "latency_ms_p99": latency_quantile(self.latency_hist, 0.99),
            "ann_samples": self.ann_n,
            "ann_recall_at_10": round(self.ann_sum / self.ann_n, 4) if self.ann_n else None,
        }


def latency_bucket(ms: float) -> int:
    for i, bound in enumerate(LATENCY_BOUNDS_MS):
        if ms <= bound:
            return i
    return len(LATENCY_BOUNDS_MS)


def latency_quantile(hist: list[int], q: float) -> float | None:
    """The q-quantile of a latency histogram, linearly interpolated inside its bucket (as Prometheus'
    histogram_quantile does); the open last bucket reports its lower bound."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            if i == len(LATENCY_BOUNDS_MS):
                return float(LATENCY_BOUNDS_MS[-1])
            lower = 0.0 if i == 0 else float(LATENCY_BOUNDS_MS[i - 1])
            upper = float(LATENCY_BOUNDS_MS[i])
            return round(lower + (upper - lower) * (rank - seen) / n, 3)
        seen += n
    return float(LATENCY_BOUNDS_MS[-1])


def minute_of(t: float) -> int:
    return int(t // 60) * 60


class TrafficAggregator:
    """Thread-safe in-process buckets, drained by the monitor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[tuple[int, str], Bucket] = {}

    def _bucket(self, lang: str, now: float | None) -> Bucket:
        minute = minute_of(time.time() if now is None else now)
        key = (minute, lang)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(minute, lang)
        return bucket

    def record(
        self,
        lang: str,
        n_results: int,
        top_score: float | None,
        latency_ms: float,
        now: float | None = None,
        no_match: bool = False,
    ) -> None:
        with self._lock:
            bucket = self._bucket(lang, now)
            bucket.count += 1
            bucket.zero += n_results == 0
            bucket.no_match += no_match
            if top_score is not None:
                bucket.top_sum += top_score
                bucket.top_n += 1
            bucket.latency_hist[latency_bucket(latency_ms)] += 1

    def record_ann(self, lang: str, recall: float, now: float | None = None) -> None:
        with self._lock:
            bucket = self._bucket(lang, now)
            bucket.ann_n += 1
            bucket.ann_sum += recall

    def drain(self) -> list[Bucket]:
        with self._lock:
            buckets, self._buckets = list(self._buckets.values()), {}
        return buckets

    def restore(self, buckets: list[Bucket]) -> None:
        """Put back buckets a failed flush could not store (merged with anything recorded since)."""
        with self._lock:
            for b in buckets:
                mine = self._buckets.get((b.minute, b.lang))
                if mine is None:
                    self._buckets[(b.minute, b.lang)] = b
                else:
                    mine.merge(b)
