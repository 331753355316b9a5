"""The service's monitor: background probe runs (after every index swap and every
``probe_interval_min``), live traffic aggregation with periodic flushes, live ANN recall sampling. It is
the service-side glue of the ``monitoring`` package: it knows the index holder and the search pipeline, which
monitoring (no service imports there) must not.

Probe queries and ANN samples run one at a time on a single worker thread of their own, at the lowest CPU
priority (Linux nice 19 for that thread) and with a pause between probe queries, so they take the cores
only when live searches leave them idle; the live path only updates in-process counters.

Under ``ccrk serve --workers N`` each process counts and stores its own traffic (the store adds buckets up)
and samples its own share of the ANN CPU budget; probes and pruning are done by one process only, the one
holding the leader lock in the shared worker folder (when it exits, another takes over at its next step).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from ccrk_settings import Settings
from monitoring.history import HistoryError, HistoryStore, open_history
from monitoring.probe import ProbeError, has_text_channels, index_searcher, run_probes, run_record
from monitoring.probe_set import Probe, ProbeSetError, load_probe_set
from monitoring.traffic import TrafficAggregator
from service.errors import IndexUnavailableError
from service.search.query import normalise_query

if TYPE_CHECKING:
    from service.index_holder import IndexHolder
    from service.schemas import SearchRequest, SearchResponse
    from service.search.pipeline import SearchPipeline

log = logging.getLogger(__name__)

MAX_PENDING_SAMPLES = 8  # ANN samples waiting for the worker; more are dropped, never queued up
# CPU-seconds of ANN samples that may be spent at once, in seconds of the allowed rate (a short burst).
SAMPLE_BURST_S = 10.0
PRUNE_EVERY_S = 3600.0


def _lower_priority() -> None:
    """Worker thread initialiser: nice 19 for this thread only (Linux applies it per thread id)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class Monitor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.traffic = TrafficAggregator()
        self.store: HistoryStore | None = None
        self.probes: list[Probe] | None = None
        self.probe_error: str | None = None
        self.last_run: dict[str, Any] | None = None
        self._holder: IndexHolder | None = None
        self._pipeline: SearchPipeline | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._swapped: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._pending = 0
        self._pending_lock = threading.Lock()
        # Token bucket of CPU-seconds for ANN samples: an exact search costs O(items) (~20 ms at 100k, 10x
        # that at 1M), so a fixed share of traffic would take the cores from live searches as load grows.
        self._sample_cpu_share = settings.ann_sample_cpu_share / settings.workers  # the budget is for all
        self._sample_credit_s = self._sample_cpu_share * SAMPLE_BURST_S
        self._credit_at = time.monotonic()
        self._leader_fd: int | None = None

    def attach(self, holder: IndexHolder, pipeline: SearchPipeline) -> None:
        """Called once the model and the index holder exist (``Runtime._start``)."""
        self._holder, self._pipeline = holder, pipeline

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._swapped = asyncio.Event()
        self.store = open_history(self.settings)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ccrk-monitor", initializer=_lower_priority)
        if self.settings.probe_set is not None:
            try:
                self.probes = await anyio.to_thread.run_sync(load_probe_set, self.settings.probe_set)
            except ProbeSetError as exc:
                self.probe_error = str(exc)
                log.error("background probes are off: %s", exc)
        else:
            self.probe_error = "no probe set configured (CCRK_PROBE_SET)"
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.flush()
        if self._executor is not None:
            # Queued samples are dropped; a running one (an exact search, a probe that checks _stop) ends
            # first, so no thread is inside faiss or ONNX Runtime when the interpreter finalizes.
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self.store is not None:
            self.store.close()
        if self._leader_fd is not None:
            os.close(self._leader_fd)  # releases the lock for another process
            self._leader_fd = None

    def is_leader(self) -> bool:
        """Whether this process runs the probes: always when alone; with several server processes, the one
        holding an exclusive lock on a file of the shared worker folder (taken at the first chance)."""
        folder = self.settings.worker_dir
        if folder is None or self._leader_fd is not None:
            return True
        fd = os.open(folder / "monitor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._leader_fd = fd
        return True

    def index_swapped(self) -> None:
        """From any thread: a new version is served, probe it."""
        loop, event = self._loop, self._swapped
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    # -- the background loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        s = self.settings
        interval_s = s.probe_interval_min * 60.0
        next_probe = time.monotonic() + interval_s if interval_s else float("inf")
        next_prune = 0.0
        reason: str | None = "startup"
        assert self._swapped is not None
        while True:
            try:
                if reason is None:
                    timeout = min(s.traffic_flush_s, max(0.0, next_probe - time.monotonic()))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._swapped.wait(), timeout)
                    if self._swapped.is_set():
                        self._swapped.clear()
                        reason = "swap"
                await self.flush()
                leader = self.is_leader()
                if reason is None and time.monotonic() >= next_probe:
                    reason = "schedule"
                if reason is not None:
                    if leader:
                        await self.probe(reason)
                    reason = None
                    if interval_s:
                        next_probe = time.monotonic() + interval_s
                if leader and time.monotonic() >= next_prune and self.store is not None:
                    await anyio.to_thread.run_sync(self.store.prune, time.time())
                    next_prune = time.monotonic() + PRUNE_EVERY_S
            except asyncio.CancelledError:
                raise
            except Exception:  # the monitor must outlive any one failure (store down, bad version)
                log.exception("monitor step failed")
                reason = None
                await asyncio.sleep(1.0)

    async def flush(self) -> None:
        """Store the traffic buckets gathered since the last flush (kept for the next try on an error)."""
        buckets = self.traffic.drain()
        if not buckets or self.store is None:
            return
        try:
            await anyio.to_thread.run_sync(self.store.add_traffic, buckets)
        except HistoryError as exc:
            cutoff = time.time() - self.settings.history_retention_days * 86400.0
            self.traffic.restore([b for b in buckets if b.minute >= cutoff])
            log.warning("traffic not stored yet: %s", exc)

    async def probe(self, source: str) -> dict[str, Any] | None:
        """One probe run of the served version on the low-priority worker; the stored record."""
        if not self.probes or self._executor is None:
            return None
        loop = asyncio.get_running_loop()
        record = await loop.run_in_executor(self._executor, self._probe_blocking, source)
        if record is not None and self.store is not None:
            await anyio.to_thread.run_sync(self.store.add_run, record)
            self.last_run = record
        return record

    def _probe_blocking(self, source: str) -> dict[str, Any] | None:
        holder, pipeline = self._holder, self._pipeline
        if holder is None or pipeline is None or self.probes is None:
            return None
        try:
            with holder.lease() as served:
                metrics = run_probes(
                    self.probes,
                    index_searcher(served.index, pipeline.encoder, pipeline.model_name),
                    depth=self.settings.probe_depth,
                    pause_s=self.settings.probe_pause_s,
                    should_stop=self._stop.is_set,
                )
                if has_text_channels(served.index):
                    # Hybrid beside image-only: what the language-bound lexical channel gains in recall
                    # and costs in consistency (the dashboard shows both).
                    hybrid = run_probes(
                        self.probes,
                        index_searcher(served.index, pipeline.encoder, pipeline.model_name, mode="hybrid"),
                        depth=self.settings.probe_depth,
                        pause_s=self.settings.probe_pause_s,
                        should_stop=self._stop.is_set,
                    )
                    metrics["hybrid"] = {
                        key: hybrid[key] for key in ("mrv", "mrv_std", "recall_at_10_mean", "per_language")
                    }
        except IndexUnavailableError:
            return None  # nothing served yet: the first swap will probe
        except ProbeError as exc:
            log.warning("probe run (%s) not made: %s", source, exc)
            return None
        return run_record(metrics, source=source)

    # -- live traffic ----------------------------------------------------------------------------------------

    def observe_search(self, lang: str, request: SearchRequest, response: SearchResponse) -> None:
        """The search telemetry's hook (``service.search.telemetry``): counters only; now and then an ANN
        recall sample for the worker."""
        hits = response.results
        top = hits[0].score if hits and request.offset == 0 else None
        no_match = response.match == "none" and request.offset == 0
        self.traffic.record(lang, len(hits), top, response.timings_ms.total, no_match=no_match)
        rate = self.settings.ann_sample_rate
        if rate and not request.filters and random.random() < rate and self._has_sample_credit():
            self.sample_ann(lang, normalise_query(request.query))

    def _has_sample_credit(self) -> bool:
        """Refill the CPU budget of ANN samples; True when some is left (the sample pays afterwards)."""
        share = self._sample_cpu_share
        with self._pending_lock:
            now = time.monotonic()
            self._sample_credit_s = min(
                share * SAMPLE_BURST_S, self._sample_credit_s + (now - self._credit_at) * share
            )
            self._credit_at = now
            return self._sample_credit_s > 0.0

    def sample_ann(self, lang: str, text: str) -> bool:
        """Queue one live query for the ANN-vs-exact comparison; False when the worker is saturated."""
        executor = self._executor
        if executor is None or self._stop.is_set():
            return False
        with self._pending_lock:
            if self._pending >= MAX_PENDING_SAMPLES:
                return False
            self._pending += 1
        try:
            executor.submit(self._ann_blocking, lang, text)
        except RuntimeError:  # shut down meanwhile
            with self._pending_lock:
                self._pending -= 1
            return False
        return True

    def _ann_blocking(self, lang: str, text: str) -> None:
        cpu_start = time.thread_time()
        try:
            holder, pipeline = self._holder, self._pipeline
            if holder is None or pipeline is None:
                return
            with holder.lease() as served:
                embeds = pipeline.ranker.encode_text(text, lang).embeds  # usually an embedding-cache hit
                _, ann = served.index.search(embeds, 10)
                _, exact = served.index.search_exact(embeds, 10)
            truth = exact[0][exact[0] >= 0]
            if truth.size:
                recall = float(np.isin(truth, ann[0]).sum()) / truth.size
                self.traffic.record_ann(lang, recall)
        except Exception:  # a sample must never take the worker down
            log.exception("ANN recall sample failed")
        finally:
            with self._pending_lock:
                self._pending -= 1
                self._sample_credit_s -= time.thread_time() - cpu_start
