"""What one app instance holds once started: the encoder, the index holder, caches, metrics, and the search
facade every search-like route goes through (``service.search``).

Created empty by ``create_app``; filled in the lifespan (model and index load there, never at import).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from time import time

import anyio
from fastapi import FastAPI
from threadpoolctl import threadpool_limits

from ccrk_settings import Settings
from model.runtime import Int8Limits, load_encoder
from service.cache import Cache
from service.errors import IndexUnavailableError, ReloadFailedError
from service.index_holder import IndexHolder, Served
from service.language import LanguageDetector
from service.metrics import Metrics
from service.monitor import Monitor
from service.search.facade import IMAGE_SLOT_WAIT_S, SearchFacade
from service.search.pipeline import SearchPipeline
from service.search.telemetry import SearchTelemetry
from service.upload_budget import UploadBudget
from store.manifest import model_fingerprint, model_name_of
from store.opening import OpenedIndex

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._pipeline: SearchPipeline | None = None
        self._holder: IndexHolder | None = None
        self._search: SearchFacade | None = None
        self.cache: Cache | None = None
        self.languages: tuple[str, ...] = ()
        # Bounds the worker threads doing CPU work at once: more than a few only adds contention.
        self.limiter = anyio.CapacityLimiter(settings.search_workers)
        # What image searches hold at once, their request bodies and decodes (service.upload_budget).
        self.upload_budget = UploadBudget(settings.upload_memory_mb * 2**20, wait_s=IMAGE_SLOT_WAIT_S)
        self.monitor = Monitor(settings)  # probes, traffic, ANN recall (started in the lifespan)
        # How the index holder opens a version (None: ``store.opening.open_version``); set before the
        # lifespan starts, e.g. by ``service.cluster`` to search a sharded version's shards on Ray Serve.
        self.index_opener: Callable[..., OpenedIndex] | None = None

    @property
    def pipeline(self) -> SearchPipeline:
        if self._pipeline is None:
            raise IndexUnavailableError("the service is still starting")
        return self._pipeline

    @property
    def holder(self) -> IndexHolder:
        if self._holder is None:
            raise IndexUnavailableError("the service is still starting")
        return self._holder

    @property
    def search(self) -> SearchFacade:
        """Text, image and consistency search and the catalogue's image files, each on the served version
        leased once per request."""
        if self._search is None:
            raise IndexUnavailableError("the service is still starting")
        return self._search

    def _on_swap(self, served: Served) -> None:
        self.metrics.index_items.set(len(served.index))
        self.metrics.index_served(served.index.manifest.name, served.version)
        self.metrics.index_loaded_timestamp.set(time())
        self.metrics.index_reloads.labels("ok").inc()
        self.monitor.index_swapped()

    def _on_load(self, served: Served) -> None:
        """A version built before match calibration existed is calibrated while it loads, not by the first
        searches of it (a few hundred encoded queries; seconds for a large model on CPU)."""
        if self._pipeline is not None:
            self._pipeline.judge.calibration(served)

    def _on_failure(self, message: str) -> None:
        self.metrics.index_reloads.labels("failed").inc()

    def _start(self) -> None:
        s = self.settings
        # numpy's OpenBLAS (pthreads: the limit is process-wide) runs py3langid's small product on every
        # query; its idle threads spin-wait. Measured on 2 cores, 2 processes: 3.8 -> 2.3 ms of server CPU
        # per query. (OpenMP limits, faiss's, hold per thread: faiss runs no OpenMP region per query.)
        threadpool_limits(limits=s.blas_threads)
        fingerprint = model_fingerprint(s.model_dir)
        encoder = load_encoder(
            s.model_dir,
            backend=s.backend,
            device=s.device,
            threads=s.threads,
            fusion_threads=s.rerank_threads,
            int8=s.int8,
            int8_limits=Int8Limits(s.int8_max_recall_drop, s.int8_max_mrv_increase),
        )
        refusal = getattr(encoder, "int8_refusal", None)
        if refusal:
            log.warning("int8 graphs requested but not used: %s; serving fp32", refusal)
        # Native languages, then those added without re-embedding (MLA acquirers, `ccrk model add-language`).
        acquired = tuple(encoder.acquired_languages)
        self.languages = tuple(encoder.config.languages) + tuple(
            lang for lang in acquired if lang not in encoder.config.languages
        )
        added = encoder.acquirers_digest
        # What encodes queries: the model, and its acquirers (the model's fingerprint stays the same).
        query_fingerprint = (
            fingerprint if added is None else hashlib.sha256(f"{fingerprint}:{added}".encode()).hexdigest()
        )
        if acquired:
            log.info("languages added to %s: %s", model_name_of(s.model_dir), ", ".join(acquired))
        self.cache = Cache(
            redis_url=s.redis_url,
            prefix=s.cache_prefix,
            size=s.cache_size,
            ttl_s=s.cache_ttl_s,
            timeout_s=s.redis_timeout_s,
            retry_s=s.redis_retry_s,
            on_event=self.metrics.cache_event,
        )
        self._holder = IndexHolder(
            s.index_root,
            s.index_name,
            expect_fingerprint=fingerprint,
            on_swap=self._on_swap,
            on_failure=self._on_failure,
            on_load=self._on_load,
            opener=self.index_opener,
        )
        self._pipeline = SearchPipeline(
            encoder=encoder,
            model_name=model_name_of(s.model_dir),
            model_fingerprint=query_fingerprint,
            detector=LanguageDetector(self.languages),
            cache=self.cache,
            default_rerank=s.rerank,
            default_rerank_k=s.rerank_k,
            rerank_score=s.rerank_score,
            rerank_policy=s.rerank_policy,
            max_query_pixels=s.max_query_pixels,
            max_upload_bytes=s.max_upload_mb * 1024 * 1024,
        )
        self.monitor.attach(self._holder, self._pipeline)
        try:
            self._holder.reload()
        except ReloadFailedError as exc:
            # Still start: /readyz and searches answer 503 with the reason until a version loads.
            log.error("starting without an index: %s", exc)
            self._holder.last_error = str(exc)

    async def _poll(self) -> None:
        while True:
            await anyio.sleep(self.settings.index_poll_s)
            try:
                await anyio.to_thread.run_sync(self.holder.check)
            except Exception:  # the poller must outlive any one bad version
                log.exception("index poll failed")

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(self._start)
        self._search = SearchFacade(
            holder=self.holder,
            pipeline=self.pipeline,
            telemetry=SearchTelemetry(self.metrics, self.monitor, self.languages),
            limiter=self.limiter,
            image_slots=self.settings.image_search_concurrency,
            upload_budget=self.upload_budget,
        )
        # What startup built (libraries, model, index) lives as long as the process: moved out of the
        # collector's way, collections under load scan only request garbage (longest pause at 1M items,
        # 32 clients: 6.5 -> 1.6 ms).
        gc.freeze()
        poller = asyncio.create_task(self._poll())
        await self.monitor.start()
        try:
            yield
        finally:
            await self.monitor.stop()
            poller.cancel()
            with suppress(asyncio.CancelledError):
                await poller
            if self._holder is not None:
                self._holder.close()
            if self.cache is not None:
                self.cache.close()
            self.metrics.process_exited()
