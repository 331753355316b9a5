"""The index version being served, and zero-downtime swaps to a newly published one.

A request takes a *lease* on the current version and keeps it to the end, whatever happens meanwhile. A
new ``CURRENT`` (seen by the poller, or asked for by ``/v1/admin/reload``) is opened in a worker thread
while the old version keeps answering; the swap is one reference assignment under a lock. The old version
is closed when its last lease is returned (on a thread of its own), so no request ever sees a closed index.

About 500 lines, kept in one module: the lease counts, the swap and the poller's state (failed, overridden,
unreachable and unread versions, the give-up waits) are one state machine under two locks, and splitting it
would put its transitions out of sight of each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import Any
from urllib.parse import quote

from model.runtime import is_out_of_memory
from service.errors import IndexUnavailableError, ReloadFailedError, ReloadOutOfMemoryError
from store.errors import IndexFormatError, IndexUnreachableError
from store.opening import OpenedIndex, open_version
from store.version.versions import current_version, version_refused

log = logging.getLogger(__name__)

DEFAULT_IMAGE_BASE = "/v1/images"

# What ``on_load`` raises on a version's own data (a malformed match calibration): the version is broken,
# tried again at its next publish. Anything else (MemoryError, an ONNX/CUDA runtime error) may pass: not
# refused, so the poller tries it again at its next poll while CURRENT names it, as shards out of reach are
# (``IndexUnreachableError``, a data error by its class); so is a MemoryError out of the open (the admin
# route's 503, ``ReloadOutOfMemoryError``). Out of ``on_load``, "a MemoryError" here and below is any error
# saying memory ran out, a GPU's too (``model.runtime.is_out_of_memory``: torch's OutOfMemoryError, ONNX
# Runtime's CUDA allocation failures): they were a version's failure, a 409 counted with nothing served.
# The open raises only MemoryError itself (the store turns faiss's other errors into IndexFormatError).
_DATA_ERRORS = (ValueError, KeyError, TypeError, IndexFormatError)
# Tries of one version whose load failed on an error that may pass before it is refused as a broken one
# until its next publish: an error of its own data outside ``_DATA_ERRORS`` (IndexError, a faiss
# RuntimeError) would otherwise reopen and recalibrate it (seconds of CPU) at every poll, for good. A
# MemoryError never counts: it is the server's state as much as the version's. With nothing served, a
# version refused for a passing shortage left the index unready (/readyz 503) for good while /healthz stayed
# ok, so nothing restarted the replica: tried at every poll. With one served, a version too large to hold
# beside it would take CPU and memory from its searches if reopened at every poll, and refusing it after
# three (as before) kept the old version served until the next publish over a brief spike: it is tried
# again after a wait that doubles, from ``MEMORY_RETRY_S`` up to ``MEMORY_RETRY_MAX_S``.
LOAD_TRIES = 3
MEMORY_RETRY_S = 30.0
MEMORY_RETRY_MAX_S = 900.0


def memory_retry_delay(times: int) -> float:
    """Seconds until a version that ran out of memory ``times`` times in a row beside the served one is tried
    again: ``MEMORY_RETRY_S`` doubling, at most ``MEMORY_RETRY_MAX_S`` (the exponent capped: 2 ** 1024 is
    past a float, which ten days of 15-minute tries reach)."""
    return min(MEMORY_RETRY_MAX_S, MEMORY_RETRY_S * 2.0 ** min(max(times, 1) - 1, 32))


def image_base_of(name: str, default: str) -> str:
    """Where the images of served index ``name`` are served, ``default`` being the service's default index."""
    return DEFAULT_IMAGE_BASE if name == default else f"/v1/indexes/{quote(name, safe='')}/images"


def _damage_of(index: OpenedIndex) -> str | None:
    """``index.damage()``: what changed in its files since the open (``store.guard``), None when nothing; an
    injected opener's index without the check has none."""
    damage = getattr(index, "damage", None)
    return damage() if damage is not None else None


def _close_logged(index: OpenedIndex) -> None:
    try:
        index.close()
    except Exception:  # on a thread it would only reach stderr; after a failed load, hide the load's error
        log.exception("closing index version %s failed", index.manifest.version)


def _close_apart(index: OpenedIndex) -> None:
    """Close a retired version on a thread of its own: the last lease may be returned on the event loop (an
    inline search, ``service.api.fast_search``), and closing frees the graph and the mapped files, which can
    take long enough at a large catalogue to hold up every other request."""
    threading.Thread(target=_close_logged, args=(index,), name="ccrk-close-retired", daemon=True).start()


@dataclass
class Served:
    """One opened version and the count of requests using it."""

    index: OpenedIndex  # an IndexVersion, or a ShardedIndex over the shards of a sharded version
    # Where its hits' images are served (``IndexHolder.image_base``): the links name the index they are of.
    image_base: str = DEFAULT_IMAGE_BASE
    loaded_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    leases: int = 0
    retired: bool = False
    # Metadata rows already read: a hit costs a dict copy, not SQLite. A published version is immutable;
    # the rows its live overlay changes are forgotten (``forget``).
    item_cache_rows: int = 100_000
    _items: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _items_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _generation: int = field(default=0, repr=False)  # bumped by ``forget``
    # Faceted fields as columns of codes, read once per row (``service.search.facet_columns``).
    facet_columns: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def version(self) -> str:
        return self.index.manifest.version

    def items(self, rows: list[int]) -> list[dict[str, Any]]:
        """``index.items(rows)`` through the row cache. Each row comes as a copy of its top level (callers
        pop keys; nested values are shared and must not be changed)."""
        got = self._cached(rows)
        return [dict(got[r]) for r in rows]

    def values_of(self, rows: list[int], names: Sequence[str]) -> dict[str, list[Any]]:
        """Each row's value of each field (None where it has none), through the row cache, uncopied (facets
        read them; nothing may change them)."""
        items = list(map(self._items.get, rows))  # map: C loops, ~2x a comprehension at 1,000 rows
        if None in items:  # rows not read yet: through the cache's fill
            got = self._cached(rows)
            items = list(map(got.__getitem__, rows))
        return {name: list(map(dict.get, items, repeat(name))) for name in names}

    def forget(self, rows: Sequence[int]) -> None:
        """Drop what the caches hold of ``rows``, whose fields changed (``service.live``): the row cache's
        copies, and every facet column (rebuilt from the rows a search reads)."""
        if not len(rows):
            return
        with self._items_lock:
            self._generation += 1
            for row in rows:
                self._items.pop(int(row), None)
        self.facet_columns.clear()

    def _cached(self, rows: list[int]) -> dict[int, dict[str, Any]]:
        cache = self._items
        got = dict(zip(rows, map(cache.get, rows), strict=True))
        missing = [r for r, item in got.items() if item is None]
        if missing:
            generation = self._generation
            fetched = self.index.items(missing)  # raises IndexFormatError on an unknown row, as before
            got.update(zip(missing, fetched, strict=True))
            with self._items_lock:
                if generation != self._generation:  # rows changed while read: not kept
                    return got  # type: ignore[return-value]
                while cache and len(cache) + len(missing) > self.item_cache_rows:
                    del cache[next(iter(cache))]  # oldest first (dicts keep insertion order)
                cache.update(zip(missing, fetched, strict=True))
        return got  # type: ignore[return-value]


class IndexHolder:
    def __init__(
        self,
        root: Path,
        name: str,
        *,
        expect_fingerprint: str | None,
        on_swap: Callable[[Served], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        on_load: Callable[[Served], None] | None = None,
        opener: Callable[..., OpenedIndex] | None = None,
        image_base: str = DEFAULT_IMAGE_BASE,
        give_up_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.name = name
        # The route its versions' images are served at: ``/v1/images`` for the default index, ``/v1/indexes/
        # {name}/images`` for another served one (a link to the default's route answered 404, or another
        # shop's photo of the same id).
        self.image_base = image_base
        self.expect_fingerprint = expect_fingerprint
        self._on_swap = on_swap or (lambda served: None)
        self._on_failure = on_failure or (lambda message: None)
        # Work a version needs before it serves (it runs in the loading thread, not in a request).
        self._on_load = on_load or (lambda served: None)
        # How a version is opened: ``open_version`` unless injected (``service.cluster`` opens a sharded
        # version over the shard deployments of a Ray Serve app); called as open_version is.
        self._open = opener or open_version
        self._lock = threading.Lock()  # guards _served and lease counts
        self._load_lock = threading.Lock()  # one load at a time
        self._served: Served | None = None
        self.last_error: str | None = None
        self._failed_version: str | None = None
        # The last try to load found no version to serve that waiting could bring (none published, or
        # CURRENT's cannot be opened): tried again only when CURRENT changes (``loading``).
        self._gave_up = False
        # When the first try that found the shards out of reach, or failed to load on an error that may pass
        # (``_DATA_ERRORS``), began (nothing served): a failing try ending ``give_up_after_s`` (None: never)
        # after it gives up too (``loading`` False), so shard deployments that never come up do not hold a
        # process out of traffic for good; the poller still tries, and serves the version once they do.
        # Time, not tries: one try on Ray may wait its open timeout.
        self.give_up_after_s = give_up_after_s
        self._clock = clock
        self._unreachable_since: float | None = None
        # The version that wait is for: another one (a new publish) waits afresh.
        self._unreachable_version: str | None = None
        # When the first failed read of CURRENT (nothing served) happened: a CURRENT that stays unreadable
        # (EACCES, EISDIR, ESTALE ...) gives up after ``give_up_after_s`` too, instead of holding the
        # process out of traffic for good. Cleared by a read that succeeds.
        self._unread_since: float | None = None
        # The message a failed read put into ``last_error`` and the reason it replaced: a read that
        # succeeds again puts that reason back (the read failure is over, the reason may not be).
        self._unread: tuple[str, str | None] | None = None
        # The CURRENT an explicit version was loaded over (admin rollback): the poller leaves the override in
        # place until CURRENT names another version (a new publish), instead of undoing it at its next poll.
        self._overridden: str | None = None
        # The version CURRENT named at its last successful read: the one a rollback is taken to be made over
        # when CURRENT cannot be read just then (else the next poll that reads it undoes the rollback).
        self._last_published: str | None = None
        # The version whose load last failed on an error that may pass, and how many times in a row (never a
        # MemoryError, ``LOAD_TRIES``).
        self._passing: tuple[str, int] | None = None
        # With a version served, the version whose load last ran out of memory, how many times in a row, and
        # when the poller may try it again (``MEMORY_RETRY_S``).
        self._memory_wait: tuple[str, int, float] | None = None

    @property
    def served(self) -> Served | None:
        return self._served

    @property
    def loading(self) -> bool:
        """No version served yet, and one may still load without a new publish: not tried yet, or the last
        try failed on shards out of reach or on a load error that may pass (the poller tries again) for less
        than ``give_up_after_s``. False once a version is served, or when none is published or the one
        CURRENT names failed to open (broken files, another model)."""
        return self._served is None and not self._gave_up

    @contextmanager
    def lease(self) -> Iterator[Served]:
        """The current version, kept open until the block ends; 503 when none is loaded, or when its files
        were changed in place since its open (``retire_damaged``: checked before the request reads them)."""
        while True:
            with self._lock:
                served = self._served
                if served is None:
                    reason = (
                        self.last_error or f"no version of index {self.name!r} published under {self.root}"
                    )
                    raise IndexUnavailableError(f"no index loaded: {reason}")
                served.leases += 1
            problem = _damage_of(served.index)
            if problem is None:
                break
            self.retire_damaged(served, problem)
            self._release(served)  # then the version swapped in meanwhile, or the 503 naming the damage
        try:
            yield served
        finally:
            self._release(served)

    def _release(self, served: Served) -> None:
        with self._lock:
            served.leases -= 1
            close = served.retired and served.leases == 0
        if close:
            _close_apart(served.index)

    def retire_damaged(self, served: Served, problem: str) -> None:
        """Stop serving ``served``, whose files ``problem`` says were changed in place (``store.guard``): its
        searches in flight end, then it is closed (which lets a truncation the kernel holds back go on); the
        index answers 503 naming the problem until a new publish (or an admin reload) opens a sound
        version. Requests of other indexes never touch it."""
        # The problem first (names the file): a client sees the first ``ECHO_CHARS`` of it.
        message = (
            f"{problem}; version {served.version!r} of index {self.name!r} is retired: publish another (or "
            "reload it once its files are restored)"
        )
        with self._lock:
            if self._served is not served:
                return  # retired already (another request or the poller saw it), or swapped out
            self._served = None
            served.retired = True
            close = served.leases == 0
            # As a version whose files are broken: not opened again until CURRENT changes.
            self._failed_version = served.version
            self._gave_up = True
            self.last_error = message
        log.error("%s", message)
        self._on_failure(message)
        if close:
            _close_apart(served.index)

    def published_version(self) -> str | None:
        """The version CURRENT names; None when none is published (no CURRENT, an empty one). A CURRENT that
        cannot be read raises ``OSError``: a failed read says nothing about what is published, so it must
        not count as "none published" (which gives up, ``loading`` False). One that is not UTF-8 text raises
        it too (EILSEQ, ``store.version.versions.current_version``), handled as any unreadable CURRENT."""
        try:
            return current_version(self.root, self.name)
        except IndexFormatError as exc:  # an invalid index name: nothing can be published under it
            log.warning("cannot read CURRENT of %s/%s: %s", self.root, self.name, exc)
            return None

    def _waited(self, since: float | None) -> bool:
        """Whether a wait that began at ``since`` (None: none) has lasted ``give_up_after_s``."""
        return (
            self.give_up_after_s is not None
            and since is not None
            and self._clock() - since >= self.give_up_after_s
        )

    def _read_current(self) -> str | None:
        """``published_version`` for a load: a failed read sets ``last_error`` and, while nothing is served,
        gives up once the reads have failed for ``give_up_after_s`` (``loading`` False); the ``OSError``
        propagates. A read that succeeds ends that wait."""
        try:
            published = self.published_version()
        except OSError as exc:
            message = f"cannot read CURRENT of index {self.name!r} under {self.root}: {exc}"
            again = self._unread is not None and self.last_error == self._unread[0]
            self._unread = (message, self._unread[1] if again and self._unread else self.last_error)
            self.last_error = message
            if self._served is None:
                if self._unread_since is None:
                    self._unread_since = self._clock()
                if self._waited(self._unread_since):
                    self._gave_up = True
            raise
        if self._unread is not None and self.last_error == self._unread[0]:
            self.last_error = self._unread[1]
        self._unread = None
        self._unread_since = None
        self._last_published = published
        return published

    def check(self) -> bool:
        """Poller step: load CURRENT when it names a version other than the served one (and not one that
        already failed to load). Blocking; run it in a worker thread. True when it swapped.

        Reads and decides under the load lock, as ``reload`` does: a poll that decided while an admin
        rollback was loading loaded the CURRENT the rollback was made over right after it; and the read
        failure state (``_unread``, ``last_error``, ``_gave_up``) is reload's too: a poll's successful read
        could put back an old reason over the one a concurrent reload had just recorded, or fail on the
        ``_unread`` that reload cleared. The lock is held over one small read, as in ``reload``."""
        with self._load_lock:
            served = self._served
            problem = _damage_of(served.index) if served is not None else None
            if served is not None and problem is not None:  # found with no request asking meanwhile
                self.retire_damaged(served, problem)
            try:
                published = self._read_current()
            except OSError:  # read again at the next poll; neither a new version nor none published
                log.warning("%s", self.last_error)
                return False
            served = self._served
            if published is None and served is None:
                self._gave_up = True  # as reload finds: none published (CURRENT gone after a failed try)
                # The same version published again later waits afresh for its shards.
                self._unreachable_since = self._unreachable_version = None
                return False
            if published is None:
                return False
            if self._memory_wait is not None and self._memory_wait[0] != published:
                self._memory_wait = None  # CURRENT moved on: the version published again later waits afresh
            if published != self._overridden:
                # CURRENT names another version (a publish, the served one republished): the override ends
                # whether or not that version loads, so the CURRENT it was made over, published again
                # later (`ccrk index rollback`), is followed.
                self._overridden = None
            if served is not None and served.version == published:
                return False
            if published == self._failed_version or published == self._overridden:
                return False
            wait = self._memory_wait
            if served is not None and wait is not None and self._clock() < wait[2]:
                return False  # it ran out of memory beside the served version: tried again after the wait
            try:
                return self._load(published, explicit=False) is not None
            except ReloadFailedError:
                return False

    def reload(self, version: str | None = None, force: bool = False) -> Served | None:
        """Open ``version`` (default: CURRENT) and swap it in; None when it is already served. A version the
        quality gate refused is served only with ``force`` (as ``ccrk index rollback --to``). A version other
        than CURRENT stays served until CURRENT changes (the poller does not undo it). Blocking."""
        with self._load_lock:
            try:
                target = version or self._read_current()
            except OSError as exc:  # the poller reads it again, until the reads gave up
                message = self.last_error or f"cannot read CURRENT of index {self.name!r}: {exc}"
                log.error("%s", message)
                self._on_failure(message)
                raise ReloadFailedError(message) from exc
            if target is None:
                self._gave_up = True
                # As check: the same version published again waits afresh for its shards.
                self._unreachable_since = self._unreachable_version = None
                raise ReloadFailedError(f"index {self.name!r} has no published version under {self.root}")
            return self._load(target, explicit=version is not None, force=force)

    def _load(self, target: str, *, explicit: bool, force: bool = False) -> Served | None:
        """``reload``'s work under the load lock, for ``target`` named by the caller (``explicit``: checked
        against the quality gate, an override of CURRENT) or read from CURRENT (a publish: served as
        published, as at the start, also a refused version published with ``--force``)."""
        served = self._served
        began = self._clock()
        published, read = None, False
        if explicit:
            # Read before the open and load (seconds): a version published meanwhile is a new publish that
            # the poller follows, not the CURRENT this override is made over.
            try:
                published = self._last_published = self.published_version()
                read = True
            except OSError:  # unread: the CURRENT last read, the one the rollback was asked over
                published = self._last_published
        if served is not None and served.version == target:
            if explicit and published is not None and published != target:
                self._overridden = published  # kept over a CURRENT the poller has not swapped in yet
            return None
        # The version CURRENT names is served as published (as a poll serves it), even one the gate refused;
        # only as read now: a CURRENT last read earlier may have moved on.
        gated = explicit and not force and not (read and target == published)
        # An admin's try of a version CURRENT does not name changes nothing of how CURRENT's is waited for.
        follows = not explicit or target == published
        try:
            if gated and version_refused(self.root, self.name, target):
                raise ReloadFailedError(
                    f"version {target!r} of index {self.name!r} was refused by the quality gate; "
                    "add force=true to serve it anyway"
                )
            index = self._open(self.root, self.name, target, expect_fingerprint=self.expect_fingerprint)
        except (OSError, IndexFormatError, ValueError) as exc:
            raise self._failed(target, "open", began, exc, follows=follows) from exc
        except MemoryError as exc:  # reading a large array or graph: maybe the files, maybe the server
            raise self._failed(target, "open", began, exc, passing=True, follows=follows) from exc
        fresh = Served(index, image_base=self.image_base)
        try:
            self._on_load(fresh)
        except Exception as exc:
            # Work on the version's own data (the runtime calibrating its match labels): a data error refuses
            # the version as a broken one, another error is tried again (``_DATA_ERRORS``); a 409 at the
            # admin route (a MemoryError: a 503, ``ReloadOutOfMemoryError``), not a 500, the traceback
            # logged (it may be a bug), and the index opened for it closed.
            _close_logged(index)
            passing = not isinstance(exc, _DATA_ERRORS)
            failure = self._failed(target, "load", began, exc, passing=passing, follows=follows, trace=True)
            raise failure from exc
        with self._lock:
            old, self._served = self._served, fresh
            close_old = False
            if old is not None:
                old.retired = True
                close_old = old.leases == 0
        self.last_error = None
        self._failed_version = None
        self._passing = None
        self._memory_wait = None
        self._gave_up = False
        self._unreachable_since = self._unreachable_version = None
        self._unread_since = self._unread = None  # served: a failed read no longer holds anything back
        self._overridden = published if published != target else None
        if close_old and old is not None:
            _close_logged(old.index)  # swapped already: a failed close must not skip on_swap
        log.info("serving index %s version %s (%d items)", self.name, fresh.version, len(index))
        try:
            self._on_swap(fresh)
        except Exception:  # the swap happened: not a failed reload (the admin route's 500)
            log.exception("after swapping in version %s of index %s", fresh.version, self.name)
        return fresh

    def _failed(
        self,
        target: str,
        verb: str,
        began: float,
        exc: Exception,
        *,
        passing: bool = False,
        follows: bool = True,
        trace: bool = False,
    ) -> ReloadFailedError:
        """Record that ``target`` could not be opened or loaded (the old version keeps serving) and return
        the error to raise. Shards out of reach, a MemoryError (however often: at the next poll with
        nothing served, after ``MEMORY_RETRY_S`` doubling with a version served), or another error that may
        pass (``passing``, fewer than ``LOAD_TRIES`` times in a row) may come back (tried again at the next
        poll); broken files or data do not (tried again at the next publish).
        ``follows`` False (an admin's try of a version CURRENT does not name): only the error is recorded,
        not how CURRENT's version is waited for (the poller does not try that version)."""
        served = self._served
        memory = is_out_of_memory(exc)  # the server's state as much as the version's: a 503, not 409
        reason = (f"out of memory ({exc})" if str(exc) else "out of memory") if memory else exc
        message = f"cannot {verb} version {target!r} of index {self.name!r}: {reason}"
        if follows:
            if memory and served is not None:
                wait = self._memory_wait
                times = wait[1] + 1 if wait is not None and wait[0] == target else 1
                self._memory_wait = (target, times, self._clock() + memory_retry_delay(times))
            elif passing and not memory:  # ``LOAD_TRIES``
                tries = self._passing[1] + 1 if self._passing and self._passing[0] == target else 1
                self._passing = (target, tries)
                passing = tries < LOAD_TRIES
            again = passing or isinstance(exc, IndexUnreachableError)
            self._failed_version = None if again else target
            if (
                again
                and served is None
                and (self._unreachable_since is None or self._unreachable_version != target)
            ):
                # A new publish (its shards may just be starting) gets its own wait, even after the last
                # version's gave up.
                self._unreachable_since, self._unreachable_version = began, target
            self._gave_up = self._failed_version is not None or self._waited(self._unreachable_since)
        self.last_error = message
        log.error("%s; still serving %s", message, served.version if served else "nothing", exc_info=trace)
        self._on_failure(message)
        return ReloadOutOfMemoryError(message) if memory else ReloadFailedError(message)

    def close(self) -> None:
        with self._lock:
            served, self._served = self._served, None
            if served is not None:
                served.retired = True
                close = served.leases == 0
            else:
                close = False
        if close and served is not None:
            served.index.close()
