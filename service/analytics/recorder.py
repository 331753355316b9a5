"""A process's recorder of one index's searches and events into its query log (``store.analytics``).

A search hands its row to ``text`` or ``photo`` and gets its query id back at once: the row goes into a
bounded buffer (``analytics_buffer``), never to disk on the request's path. A thread writes the buffer in
one transaction every ``analytics_flush_s`` and prunes the log to its retention every ``PRUNE_S``. When the
buffer is full the oldest row is dropped and counted (``ccrk_analytics_dropped_total{reason="buffer_full"}``);
a write that fails (a full disk) drops its rows, counted as ``write_failed``, and the searches go on. So a
``kill -9`` loses at most the rows buffered since the last write: ``analytics_flush_s`` of traffic, and never
more than ``analytics_buffer`` rows.

Events (``events``) are written at once, in one transaction per request, and acknowledged after it: a
click a front end was told was taken is on disk. Their query ids are checked by their signature
(``store.analytics.query_ids``), so an event for a search whose row is still buffered, or buffered by
another worker, is taken all the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from service.metrics import Metrics
from service.schemas import ImageSearchResponse, SearchRequest, SearchResponse
from store.analytics import LoggedEvent, LoggedQuery, QueryIds, QueryLog, normalise_query
from store.analytics.querylog import TOP_IDS, AnalyticsError
from store.live.photos import photo_digest

log = logging.getLogger(__name__)

PRUNE_S = 600.0  # how often the log is pruned to its retention
BATCH = 5_000  # rows per write transaction


class QueryRecorder:
    """Thread-safe. ``start`` runs the writing thread; ``close`` writes what is buffered and stops it."""

    def __init__(
        self,
        index: str,
        query_log: QueryLog,
        ids: QueryIds,
        *,
        capacity: int,
        flush_s: float,
        event_window_s: float,
        metrics: Metrics | None = None,
    ) -> None:
        self.index = index
        self.log = query_log
        self.ids = ids
        self.flush_s = flush_s
        self.event_window_s = event_window_s
        self.metrics = metrics
        self._buffer: deque[LoggedQuery] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0  # rows lost: the buffer full, or a failed write
        self.problem: str | None = None  # why the last write failed (None: it did not)
        self._pruned_at = 0.0

    # -- searches ---------------------------------------------------------------------------------
    def _add(self, row: LoggedQuery) -> None:
        with self._lock:
            full = len(self._buffer) == self._buffer.maxlen
            self._buffer.append(row)  # a full deque drops its oldest row
            if full:
                self.dropped += 1
        if full and self.metrics is not None:
            self.metrics.analytics_dropped.labels(self.index, "buffer_full").inc()

    def _log(
        self, kind: str, response: SearchResponse | ImageSearchResponse, offset: int, **what: Any
    ) -> str:
        """Buffer a search's row (``what``: its other fields, ``LoggedQuery``'s); its query id."""
        now = time.time()
        query_id = self.ids.new(now)
        row = LoggedQuery(
            query_id=query_id,
            at=now,
            kind=kind,
            offset=offset,
            results=len(response.results),
            top_ids=tuple(hit.id for hit in response.results[:TOP_IDS]),
            latency_ms=round(response.timings_ms.total, 3),
            **what,
        )
        self._add(row)
        return query_id

    def text(self, request: SearchRequest, response: SearchResponse, key_id: str | None) -> str:
        """Log a text search; its query id."""
        return self._log(
            "text",
            response,
            request.offset,
            query=normalise_query(request.query),
            photo=None,
            lang=response.language.code,
            lang_confidence=round(response.language.confidence, 4),
            mode=str(response.mode),
            label=response.match,
            key_id=key_id,
        )

    def photo(self, data: bytes, response: ImageSearchResponse, offset: int, key_id: str | None) -> str:
        """Log a photo search by its content digest (never the image); its query id. A photo query has no
        calibrated label: its ``none`` is an empty answer."""
        return self._log(
            "photo",
            response,
            offset,
            query=None,
            photo=photo_digest(data),
            lang="",
            lang_confidence=None,
            mode="image",
            label=None if response.results else "none",
            key_id=key_id,
        )

    # -- events -----------------------------------------------------------------------------------
    def events(self, events: Sequence[tuple[str, str, str]], key_id: str | None) -> int:
        """Write (kind, query id, product id) events, already checked (``check``), in one transaction;
        AnalyticsError when the log cannot take them (nothing written)."""
        now = time.time()
        self.log.add_events([LoggedEvent(now, qid, product, kind, key_id) for kind, qid, product in events])
        if self.metrics is not None:
            for kind, _, _ in events:
                self.metrics.analytics_events.labels(self.index, kind).inc()
        return len(events)

    def check(self, query_id: str) -> float:
        """The search time of ``query_id`` (UnknownQueryIdError, ExpiredQueryIdError)."""
        return self.ids.check(query_id, now=time.time(), window_s=self.event_window_s)

    # -- writing ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the recorder is already started")
        self._thread = threading.Thread(target=self._run, name=f"ccrk-analytics-{self.index}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
                if time.monotonic() - self._pruned_at >= PRUNE_S:
                    self._pruned_at = time.monotonic()
                    self.log.prune()
            except Exception as exc:  # the thread outlives anything: searches never depend on it
                log.warning("query log of %s: %s", self.index, exc)

    def buffered(self) -> int:
        return len(self._buffer)

    def flush(self) -> int:
        """Write what is buffered now; the rows written (a failed write drops them, counted)."""
        total = 0
        while True:
            with self._lock:
                rows: list[Any] = [self._buffer.popleft() for _ in range(min(BATCH, len(self._buffer)))]
            if not rows:
                return total
            try:
                self.log.add_queries(rows)
            except AnalyticsError as exc:
                with self._lock:
                    self.dropped += len(rows)
                if self.problem is None:
                    log.warning("query log of %s stops writing: %s (searches go on)", self.index, exc)
                self.problem = str(exc)
                if self.metrics is not None:
                    self.metrics.analytics_dropped.labels(self.index, "write_failed").inc(len(rows))
                return total
            if self.problem is not None:
                log.info("query log of %s writes again", self.index)
                self.problem = None
            total += len(rows)
            if self.metrics is not None:
                self.metrics.analytics_logged.labels(self.index).inc(len(rows))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            self.flush()
        finally:
            self.log.close()
