"""What one app instance holds once started: the encoder, the index holder, caches, metrics, and the search
facade every search-like route goes through (``service.search``).

Created empty by ``create_app``; filled in the lifespan (model and index load there, never at import).
Over 400 lines: the start, the index holders (and those that join later) and fair share all work on the one
state the routes hold, each in a few short methods.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from time import monotonic, perf_counter, time

import anyio
from fastapi import FastAPI, Request
from threadpoolctl import threadpool_limits

from ccrk_settings import Settings
from model.runtime import Int8Limits, load_encoder
from service.analytics import QueryRecorder, open_recorder
from service.auth_throttle import AuthThrottle
from service.cache import Cache
from service.caller_slots import CallerQueues, ExpensiveSlots, QueueTimeout
from service.errors import IndexUnavailableError, NotFoundError, RateLimitedError, ReloadFailedError
from service.hugepages import advise_huge_pages
from service.index_holder import IndexHolder, Served, image_base_of
from service.keys import KeyRecord, KeyRing
from service.language import LanguageDetector
from service.live.embedder import CatalogueEmbedder
from service.live.feed import LiveFeed
from service.live.notices import ChangeNotices
from service.metrics import Metrics
from service.monitor import Monitor
from service.quota_ledger import QuotaLedger
from service.ratelimit import Limit, RateLimiter
from service.search.facade import SearchFacade
from service.search.pipeline import SearchPipeline
from service.search.telemetry import SearchTelemetry
from service.upload_budget import UploadBudget
from store.analytics import AnalyticsError
from store.errors import ChangeLogError, IndexUnreachableError
from store.layout import CURRENT_FILE
from store.live.embed_cache import PhotoEmbeddingCache
from store.live.wake import WakeSocket
from store.live.wake import supported as wake_supported
from store.opening import OpenedIndex
from store.version.manifest import model_fingerprint, model_name_of

log = logging.getLogger(__name__)

# How long an index whose shards stay out of reach (shard deployments still starting or placed) holds a
# process out of traffic (``loading``) before it counts as given up, its routes answering 503 and the poller
# still trying. Time, not tries (a try on Ray may wait ``open_timeout_s``): it gives up at the first failing
# try ending this long after the first failing try began. Ray Serve starts and loads shard replicas within a
# minute or two, a new node a few more; an extra index whose deployments never come up must not keep every
# ingress replica unready for good.
UNREACHABLE_WAIT_S = 300.0
# How often the live poller counts each log's changes no version holds (``ccrk_live_pending_changes``): a
# count is a scan of those entries, not to be made at every poll.
PENDING_COUNT_S = 1.0
RECORDER_RETRY_S = 60.0  # a query log that could not be opened is tried again after this


@dataclass(frozen=True)
class Caller:
    """Who sends a request: an API key's record, the admin key, or an anonymous client address."""

    identity: str  # the fair-share bucket's name: key:<id>, ip:<address>, admin
    record: KeyRecord | None
    admin: bool = False

    @property
    def anonymous(self) -> bool:
        return self.record is None and not self.admin


def served_index_names(settings: Settings) -> tuple[str, ...]:
    """The indexes one process serves: ``index_name`` (the default one, of the unprefixed routes), then
    ``extra_indexes``; ``*`` there: every index under the root with a CURRENT, by name."""
    names = [settings.index_name]
    for name in settings.extra_indexes:
        if name == "*":
            root = settings.index_root
            if root.is_dir():
                names += sorted(p.name for p in root.iterdir() if (p / CURRENT_FILE).is_file())
        else:
            names.append(name)
    return tuple(dict.fromkeys(names))


class Runtime:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._pipeline: SearchPipeline | None = None
        self._pages_advised = False
        # Every served index by name (the default one first), each with its holder and facade.
        self.index_names = served_index_names(settings)
        self.holders: dict[str, IndexHolder] = {}
        self._facades: dict[str, SearchFacade] = {}
        # Indexes found under the root after the start (``*``), each served once it has a version.
        self._joining: dict[str, IndexHolder] = {}
        self._fingerprint: str | None = None  # the model's, which every version must have been built with
        self._telemetry: SearchTelemetry | None = None
        # API keys (``service.keys``), fair share (``service.ratelimit``).
        self.keys = KeyRing(settings.keys_file or settings.index_root)
        self.rate_limiter = RateLimiter(
            redis_url=settings.redis_url,
            prefix=settings.cache_prefix,
            timeout_s=settings.redis_timeout_s,
            retry_s=settings.redis_retry_s,
            on_event=metrics.cache_event,
            ledger=QuotaLedger(settings.index_root),  # daily quotas outlive a Redis restart
        )
        self.auth_throttle = AuthThrottle(
            limit=settings.auth_failures_per_minute,
            redis_url=settings.redis_url,
            prefix=settings.cache_prefix,
            timeout_s=settings.redis_timeout_s,
            retry_s=settings.redis_retry_s,
        )
        self.expensive_slots = ExpensiveSlots(settings.max_expensive_per_caller)
        slots = settings.search_slots()
        self.caller_queues = CallerQueues(slots, settings.max_concurrent_per_caller)
        self.cache: Cache | None = None
        self.languages: tuple[str, ...] = ()
        # Bounds the worker threads doing CPU work at once: more than a few only adds contention.
        self.limiter = anyio.CapacityLimiter(slots)
        # What image searches hold at once, their request bodies and decodes (service.upload_budget).
        self.upload_budget = UploadBudget(settings.upload_memory_mb * 2**20, wait_s=settings.image_wait_s)
        self.monitor = Monitor(settings)  # probes, traffic, ANN recall (started in the lifespan)
        # How the index holder opens a version (None: ``store.opening.open_version``); set before the
        # lifespan starts, e.g. by ``service.cluster`` to search a sharded version's shards on Ray Serve.
        self.index_opener: Callable[..., OpenedIndex] | None = None
        # The holders' clock for ``UNREACHABLE_WAIT_S`` (injected by tests).
        self.clock: Callable[[], float] = monotonic
        # Each served index's change log (``service.live``), made with its holder.
        self.feeds: dict[str, LiveFeed] = {}
        # The NOTIFY listener of a change log in PostgreSQL (``CCRK_LIVE_DSN``), once the lifespan runs.
        self.notices: ChangeNotices | None = None
        # Each served index's query log (``service.analytics``), opened in the lifespan (an index that joins
        # later: at its first search); a log that cannot be opened is tried again after
        # ``RECORDER_RETRY_S`` (searches go on meanwhile).
        self._recorders: dict[str, QueryRecorder] = {}
        self._recorder_failed_at: dict[str, float] = {}
        self._recorders_lock = threading.Lock()
        self._wake_name: str | None = None  # this process's wake-up socket, once the live poller runs
        self._pending_counted: dict[str, float] = {}  # when each log's pending changes were last counted

    @property
    def pipeline(self) -> SearchPipeline:
        if self._pipeline is None:
            raise IndexUnavailableError("the service is still starting")
        return self._pipeline

    @property
    def holder(self) -> IndexHolder:
        """The default index's holder (of the unprefixed routes)."""
        holder = self.holders.get(self.settings.index_name)
        if holder is None:
            raise IndexUnavailableError("the service is still starting")
        return holder

    @property
    def search(self) -> SearchFacade:
        """Text, image and consistency search and the catalogue's image files, each on the served version
        leased once per request."""
        facade = self._facades.get(self.settings.index_name)
        if facade is None:
            raise IndexUnavailableError("the service is still starting")
        return facade

    def loading(self) -> list[str]:
        """What a process waits for before it takes traffic (Ray Serve's health check), as "name: reason":
        the default index until it serves a version, another until it serves one or its holder gave up
        (``IndexHolder.loading``: none published, a version that cannot be opened, shards out of reach for
        ``UNREACHABLE_WAIT_S``), whose routes then answer 503 with the reason rather than keep the process
        out of service for good."""
        waiting = []
        for name in self.index_names:
            holder = self.holders.get(name)
            if holder is None:
                waiting.append(f"{name}: starting")
            elif self.holds_back(name):
                waiting.append(f"{name}: {holder.last_error or 'loading'}")
        return waiting

    def holds_back(self, name: str) -> bool:
        """Whether served index ``name`` keeps the process out of traffic (``loading``, ``/readyz``): no
        holder yet, or no version served while one may still load (the default index's: always)."""
        holder = self.holders.get(name)
        if holder is None:
            return True
        return holder.served is None and (holder.loading or name == self.settings.index_name)

    def catalogue(self, name: str) -> SearchFacade:
        """The search facade of a served index; 404 for one this process does not serve."""
        facade = self._facades.get(name)
        if facade is None:
            if not self._facades:
                raise IndexUnavailableError("the service is still starting")
            raise NotFoundError(f"index {name!r} is not served here", loc=("path", "name"))
        return facade

    def catalogue_holder(self, name: str, loc: tuple[str, ...] = ("path", "name")) -> IndexHolder:
        """The index holder of a served index; 404 (naming ``loc``) for one this process does not serve."""
        holder = self.holders.get(name)
        if holder is None:
            if not self.holders:
                raise IndexUnavailableError("the service is still starting")
            raise NotFoundError(f"index {name!r} is not served here", loc=loc)
        return holder

    # -- fair share --------------------------------------------------------------------------------------

    def limit_of(self, caller: Caller) -> Limit | None:
        """The caller's bucket: its key's own rate, else the settings' default for keys or for anonymous
        addresses; None: not limited."""
        s = self.settings
        if caller.admin:
            return None
        if caller.record is not None:
            record = caller.record
            rate, burst, quota = record.rate or s.key_rate, record.burst or s.key_burst, record.quota_per_day
        else:
            rate, burst, quota = s.anonymous_rate, s.anonymous_burst, None
        if rate is None:
            if quota is None:
                return None
            rate = 1e9  # a quota alone
        return Limit(rate=rate, burst=burst or max(1, math.ceil(rate)), quota_per_day=quota)

    def admit(self, caller: Caller, request: Request) -> None:
        """One token of the caller's bucket; its ``RateLimit-*`` headers go on the answer (the metrics
        middleware adds them); 429 when the bucket is empty or the day's quota spent."""
        limit = self.limit_of(caller)
        if limit is None:
            return
        decision = self.rate_limiter.check(caller.identity, limit)
        headers = decision.headers()
        request.state.ratelimit_headers = headers
        if not decision.allowed:
            what = "daily quota spent" if decision.quota_spent else "rate limit reached"
            raise RateLimitedError(f"{what}; retry after {decision.retry_after_s} s", headers=headers)

    @asynccontextmanager
    async def expensive(self, caller: Caller) -> AsyncIterator[None]:
        """One of the caller's slots for expensive work (re-ranking, image search) in this process; 429 when
        it holds max_expensive_per_caller already (0: no cap)."""
        slots = self.expensive_slots
        if slots.per_caller == 0 or caller.admin:
            yield
            return
        if not slots.try_acquire(caller.identity):
            raise RateLimitedError(
                f"{slots.per_caller} expensive searches (re-ranking, image search) of this caller are"
                " running; retry in a moment",
                headers={"Retry-After": "1"},
            )
        try:
            yield
        finally:
            slots.release(caller.identity)

    @asynccontextmanager
    async def in_line(self, caller: Caller) -> AsyncIterator[None]:
        """The caller's turn for one of the search slots (``service.caller_slots.CallerQueues``): shared
        fairly among the callers waiting, at most max_concurrent_per_caller of them for one caller (0: no
        cap); 429 after waiting CallerQueues.wait_s. The admin key does not wait."""
        queues = self.caller_queues
        if caller.admin:
            yield
            return
        try:
            async with queues.hold(caller.identity):
                yield
        except QueueTimeout:
            raise RateLimitedError(
                f"waited {queues.wait_s:g} s for a search slot (this caller holds"
                f" {queues.held(caller.identity)} of {queues.slots}); retry in a moment",
                headers={"Retry-After": "1"},
            ) from None

    # -- index swaps -------------------------------------------------------------------------------------

    def _on_swap(self, served: Served) -> None:
        name = served.index.manifest.name
        self.metrics.catalogue_items.labels(name).set(len(served.index))
        self.metrics.index_reloads.labels("ok").inc()
        if name != self.settings.index_name:
            return
        self.metrics.index_items.set(len(served.index))
        self.metrics.index_served(name, served.version)
        self.metrics.index_loaded_timestamp.set(time())
        self.monitor.index_swapped()
        if self._pages_advised:  # a new version's index and arrays (at startup: once, in the lifespan)
            self._huge_pages()

    def _huge_pages(self) -> None:
        """What the process now holds for good (model, detector tables, index) on huge pages
        (``service.hugepages``): less of a search's CPU goes to TLB misses (100k items, 2 shared cores:
        ~1.7 -> ~1.4 ms of server CPU per query at 32 clients, RSS +9 MB)."""
        if not self.settings.huge_pages:
            return
        t0 = perf_counter()
        advised = advise_huge_pages()
        self._pages_advised = True
        log.info("huge pages advised for %d MB in %.0f ms", advised >> 20, (perf_counter() - t0) * 1000)

    def feed(self, name: str) -> LiveFeed:
        """Index ``name``'s change log (``service.live``), opened when first read or written."""
        feed = self.feeds.get(name)
        if feed is None:
            lag = self.metrics.live_apply_lag.labels(name)
            applied = self.metrics.live_applied.labels(name)

            def observe(lags: list[float], sequence: int) -> None:
                for seconds in lags:
                    lag.observe(seconds)
                applied.set(sequence)

            made = LiveFeed(self.settings.index_root, name, self.settings.live_dsn, on_apply=observe)
            made.wake_name = self._wake_name
            feed = self.feeds.setdefault(name, made)
        if feed.embedder is None and self._pipeline is not None:
            s = self.settings
            feed.embedder = CatalogueEmbedder(
                self._pipeline.encoder,
                feed.photos,
                max_pixels=s.max_query_pixels,
                cache=PhotoEmbeddingCache.for_index(s.index_root, name),
                model_key=f"{self._fingerprint}/{s.backend}/{'int8' if s.int8 else 'float'}",
            )
        return feed

    def _on_load(self, served: Served) -> None:
        """The live catalogue's changes are applied to a version before it serves (``LiveFeed.attach``). A
        version built before match calibration existed is calibrated while it loads, not by the first
        searches of it (a few hundred encoded queries; seconds for a large model on CPU)."""
        self.feed(served.index.manifest.name).attach(served)
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
        fingerprint = self._fingerprint = model_fingerprint(s.model_dir)
        encoder = load_encoder(
            s.model_dir,
            backend=s.backend,
            device=s.device,
            threads=s.threads,
            fusion_threads=s.rerank_threads,
            int8=s.int8,
            int8_limits=Int8Limits(s.int8_max_recall_drop, s.int8_max_mrv_increase),
        )
        # Every graph loaded before the service reports ready: an encoder may load its text graph on first
        # use (the indexer's saving), which would otherwise fall on the first query, maybe on the event loop.
        encoder.encode_text(["ready"])
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
        for name in self.index_names:
            self.holders[name] = self._new_holder(name)
        self._pipeline = SearchPipeline(
            encoder=encoder,
            model_name=model_name_of(s.model_dir),
            model_fingerprint=query_fingerprint,
            detector=LanguageDetector(self.languages, cache_size=s.cache_size),
            cache=self.cache,
            default_rerank=s.rerank,
            default_rerank_k=s.rerank_k,
            rerank_score=s.rerank_score,
            rerank_policy=s.rerank_policy,
            max_query_pixels=s.max_query_pixels,
            max_upload_bytes=s.max_upload_mb * 1024 * 1024,
        )
        self.monitor.attach(self.holders[s.index_name], self._pipeline)
        for holder in self.holders.values():
            try:
                holder.reload()
            except ReloadFailedError as exc:
                # Still start: /readyz and searches answer 503 with the reason until a version loads.
                log.error("starting without index %s: %s", holder.name, exc)
                holder.last_error = str(exc)

    def _new_holder(self, name: str) -> IndexHolder:
        return IndexHolder(
            self.settings.index_root,
            name,
            expect_fingerprint=self._fingerprint,
            on_swap=self._on_swap,
            on_failure=self._on_failure,
            on_load=self._on_load,
            opener=self.index_opener,
            image_base=image_base_of(name, self.settings.index_name),
            give_up_after_s=UNREACHABLE_WAIT_S,
            clock=self.clock,
        )

    def _discover(self) -> list[str]:
        """Poller step with ``*``: an index published under the root since the start is served (returned)
        once it has a version, by every process within a poll, not only by those started after it; until
        then its routes answer 404 and readiness ignores it (one that cannot load stops no process).
        Blocking."""
        for name in served_index_names(self.settings):
            if name not in self.holders and name not in self._joining:
                log.info("index %s appeared under %s", name, self.settings.index_root)
                self._joining[name] = self._new_holder(name)
        for holder in self._joining.values():
            holder.check()  # a version that fails to open is tried again only at its next publish
        return [name for name, holder in self._joining.items() if holder.served is not None]

    async def _poll(self) -> None:
        while True:
            await anyio.sleep(self.settings.index_poll_s)
            for holder in self.holders.values():
                try:
                    await anyio.to_thread.run_sync(holder.check)
                except Exception:  # the poller must outlive any one bad version
                    log.exception("index poll of %s failed", holder.name)
            if "*" not in self.settings.extra_indexes:
                continue
            try:
                joined = await anyio.to_thread.run_sync(self._discover)
            except Exception:
                log.exception("looking for new indexes under %s failed", self.settings.index_root)
                continue
            for name in joined:  # on the event loop, as the routes read these
                try:
                    self._add_facade(name, self._joining[name])
                except Exception:  # kept joining (closed at the end), tried again at the next poll
                    log.exception("serving the new index %s failed", name)
                    continue
                del self._joining[name]
                self.index_names = (*self.index_names, name)

    def _catch_up(self, holder: IndexHolder) -> None:
        """Live poller step for one index: apply the log's new entries to the served version (leased, so a
        swap cannot close it meanwhile). Blocking."""
        if holder.served is None:
            return
        feed = self.feed(holder.name)
        try:
            with holder.lease() as served:
                feed.catch_up(served)
        except IndexUnavailableError:  # retired or swapped out meanwhile: the next version attaches itself
            return
        self.metrics.live_log_up.labels(holder.name).set(0 if feed.problem else 1)
        now = monotonic()
        if now - self._pending_counted.get(holder.name, -math.inf) >= PENDING_COUNT_S:
            self._pending_counted[holder.name] = now
            try:
                self.metrics.live_pending.labels(holder.name).set(feed.pending())
            except (ChangeLogError, IndexUnreachableError):  # ``problem`` says why at the next catch-up
                return

    async def _live_poll(self, woken: asyncio.Event) -> None:
        """Every ``live_poll_s``, or at once when ``woken`` is set (on the event loop): by a writer of this
        machine waiting for this process (``store.live.wake``), or by PostgreSQL's NOTIFY of a write on any
        machine (``_notices``): the products other processes wrote, applied here (``service.live``)."""
        loop = asyncio.get_running_loop()
        wake = WakeSocket() if wake_supported() else None
        if wake is not None:
            loop.add_reader(wake.sock.fileno(), woken.set)
            for feed in list(self.feeds.values()):
                feed.wake_name = wake.name
            self._wake_name = wake.name
        try:
            while True:
                with anyio.move_on_after(self.settings.live_poll_s):
                    await woken.wait()
                if wake is not None:
                    wake.drain()
                woken.clear()  # before the catch-up: a wake-up during it is heard at the next turn
                await self._poll_feeds()
        finally:
            if wake is not None:
                loop.remove_reader(wake.sock.fileno())
                wake.close()

    def recorder(self, name: str) -> QueryRecorder | None:
        """Index ``name``'s query-log recorder (None: analytics off, or its log cannot be opened now)."""
        found = self._recorders.get(name)
        if found is not None or not self.settings.analytics:
            return found
        with self._recorders_lock:
            if name in self._recorders:
                return self._recorders[name]
            if monotonic() - self._recorder_failed_at.get(name, -math.inf) < RECORDER_RETRY_S:
                return None
            try:
                made = open_recorder(self.settings, name, self.metrics)
            except (OSError, AnalyticsError) as exc:  # a damaged file, a full or read-only disk
                log.warning("the query log of %s cannot be opened (searches go on, unlogged): %s", name, exc)
                self._recorder_failed_at[name] = monotonic()
                return None
            self._recorders[name] = made
            return made

    def _notices(self, woken: asyncio.Event) -> ChangeNotices | None:
        """With the change log in PostgreSQL: its NOTIFY of an index served here sets ``woken``."""
        if not self.settings.live_dsn:
            return None
        loop = asyncio.get_running_loop()

        def wake() -> None:
            with suppress(RuntimeError):  # the loop closed meanwhile (the process is ending)
                loop.call_soon_threadsafe(woken.set)

        notices = ChangeNotices.for_logs(
            self.settings.live_dsn,
            lambda name: name in self.holders,
            wake,
            listening=lambda up: self.metrics.live_notices_up.set(1 if up else 0),
        )
        self.metrics.live_notices_up.set(0)  # until the first connection
        notices.start()
        self.notices = notices
        return notices

    async def _poll_feeds(self) -> None:
        for holder in list(self.holders.values()):
            try:
                await anyio.to_thread.run_sync(self._catch_up, holder)
            except Exception:  # the poller must outlive any one bad entry or version
                log.exception("applying the change log of %s failed", holder.name)

    def _add_facade(self, name: str, holder: IndexHolder) -> None:
        first = next(iter(self._facades.values()), None)
        if self._telemetry is None:
            raise IndexUnavailableError("the service is still starting")
        facade = SearchFacade(
            holder=holder,
            pipeline=self.pipeline,
            telemetry=self._telemetry,
            limiter=self.limiter,
            image_slots=self.settings.image_search_concurrency,
            image_slot_wait_s=self.settings.image_wait_s,
            upload_budget=self.upload_budget,
            inline=self.settings.inline_text_search,
        )
        if first is not None:  # one bound on decodes per process, whichever catalogue they search
            facade.image_slots = first.image_slots
            facade.header_readers = first.header_readers
        self.holders[name] = holder
        self._facades[name] = facade

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(self._start)
        self._telemetry = SearchTelemetry(self.metrics, self.monitor, self.languages)
        for name, holder in list(self.holders.items()):
            self._add_facade(name, holder)
        for name in self.index_names:  # each served index's query log, off the event loop
            await anyio.to_thread.run_sync(self.recorder, name)
        # What startup built (libraries, model, index) lives as long as the process: moved out of the
        # collector's way, collections under load scan only request garbage (longest pause at 1M items,
        # 32 clients: 6.5 -> 1.6 ms).
        gc.freeze()
        self._huge_pages()
        poller = asyncio.create_task(self._poll())
        live_woken = asyncio.Event()  # the live poller's wake-up, shared with the NOTIFY listener
        live_poller = asyncio.create_task(self._live_poll(live_woken))
        notices = self._notices(live_woken)
        await self.monitor.start()
        try:
            yield
        finally:
            await self.monitor.stop()
            for task in (poller, live_poller):
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
            if notices is not None:  # within its wait slice (its thread closes its connection)
                await anyio.to_thread.run_sync(notices.stop)
            for holder in (*self.holders.values(), *self._joining.values()):
                holder.close()
            for feed in self.feeds.values():
                feed.close()
            for recorder in list(self._recorders.values()):  # what is buffered written before the end
                await anyio.to_thread.run_sync(recorder.close)
            self.rate_limiter.close()
            self.auth_throttle.close()
            if self.cache is not None:
                self.cache.close()
            self.metrics.process_exited()
