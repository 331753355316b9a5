"""Fair share in process: the search slots shared fairly among the callers asking for them (the others wait
in line) and a cap on each caller's concurrent expensive work (re-ranking, image search). Moved out of
``service.ratelimit`` (the token buckets and quotas), which these never touched."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio


class QueueTimeout(Exception):
    """A caller's request waited ``CallerQueues.wait_s`` for its turn."""


@dataclass(eq=False)
class _Waiter:
    ticket: int  # arrival order: among callers holding as many slots, the longest waiting goes first
    granted: anyio.Event = field(default_factory=anyio.Event)


class CallerQueues:
    """Fair share of the process's search slots (``slots``: CCRK_SEARCH_WORKERS), on by default.

    A search runs at once while a slot is free. Otherwise it waits on the event loop (holding no thread),
    and each slot freed goes to the waiting caller that holds the fewest slots, the longest waiting among
    those: a greedy client's 16 connections hold every slot only while no one else asks, and another
    caller's search waits for one search to end, not for the greedy line. A lone caller still gets every
    slot (a shop's front end sends all its shoppers' searches on one key), but while another caller has
    asked within ``recent_s`` one slot stays in reserve for the others (a caller holds at most ``slots - 1``):
    their next search then starts at once instead of waiting for one of the greedy client's to end (2
    slots, a client ignoring Retry-After on 16 connections: a polite caller's p99 x1.57 / x1.21 its p99 alone
    beside one key / anonymous, against x1.50 / x1.68 without the reserve, the greedy served 20 % less,
    ``bench/fair_share.py``, 6 rounds). ``per_caller`` (CCRK_MAX_CONCURRENT_PER_CALLER; 0:
    none) caps one caller's slots even when the others are free. A search waiting ``wait_s`` gets
    ``QueueTimeout`` (a 429 at the edge). Only coroutines of one event loop touch it."""

    def __init__(
        self,
        slots: int,
        per_caller: int = 0,
        wait_s: float = 10.0,
        recent_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = slots
        self.per_caller = per_caller
        self.wait_s = wait_s
        self.recent_s = recent_s
        self.clock = clock
        self._free = slots
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._tickets = 0
        # The two callers that asked last, newest first (identity, time): whether anyone other than a given
        # caller asked recently is read from them (no scan of every anonymous address).
        self._last: list[tuple[str, float]] = []

    def _asked(self, identity: str) -> None:
        now = self.clock()
        self._last = [(identity, now), *[(i, t) for i, t in self._last if i != identity]][:2]

    def _others_recent(self, identity: str) -> bool:
        since = self.clock() - self.recent_s
        return any(i != identity and t >= since for i, t in self._last)

    def _may_start(self, identity: str) -> bool:
        held = self._running.get(identity, 0)
        if self.per_caller and held >= self.per_caller:
            return False
        # One slot kept for the others while someone else asks (a lone caller still gets them all).
        return not (self.slots > 1 and held >= self.slots - 1 and self._others_recent(identity))

    def _start(self, identity: str) -> None:
        self._free -= 1
        self._running[identity] = self._running.get(identity, 0) + 1

    def _dispatch(self) -> None:
        """Hand the free slots to the waiting callers, the one holding the fewest first."""
        while self._free > 0:
            ready = [i for i, line in self._waiting.items() if line and self._may_start(i)]
            if not ready:
                return
            identity = min(ready, key=lambda i: (self._running.get(i, 0), self._waiting[i][0].ticket))
            line = self._waiting[identity]
            waiter = line.popleft()
            if not line:
                del self._waiting[identity]
            self._start(identity)
            waiter.granted.set()

    def _finish(self, identity: str) -> None:
        held = self._running[identity] - 1
        if held:
            self._running[identity] = held
        else:
            del self._running[identity]
        self._free += 1
        self._dispatch()

    def held(self, identity: str) -> int:
        """Slots the caller holds now."""
        return self._running.get(identity, 0)

    def waiting(self) -> int:
        """Searches waiting for a slot now."""
        return sum(len(line) for line in self._waiting.values())

    @contextlib.asynccontextmanager
    async def hold(self, identity: str) -> AsyncIterator[None]:
        """A slot for the caller, held to the end of the block; ``QueueTimeout`` after ``wait_s`` in line."""
        self._asked(identity)
        if self._free > 0 and self._may_start(identity):  # a free slot: no waiter may take it (_dispatch)
            self._start(identity)
        else:
            self._tickets += 1
            waiter = _Waiter(self._tickets)
            self._waiting.setdefault(identity, deque()).append(waiter)
            try:
                with anyio.fail_after(self.wait_s):
                    await waiter.granted.wait()
            except BaseException as exc:  # the wait timed out, or the request was cancelled
                if waiter.granted.is_set():  # granted as it ended: the slot is this request's
                    if not isinstance(exc, TimeoutError):
                        self._finish(identity)
                        raise
                else:
                    line = self._waiting.get(identity)
                    if line is not None:
                        line.remove(waiter)
                        if not line:
                            del self._waiting[identity]
                    if isinstance(exc, TimeoutError):
                        raise QueueTimeout(identity) from None
                    raise
        try:
            yield
        finally:
            self._finish(identity)


class ExpensiveSlots:
    """At most ``per_caller`` expensive requests (re-ranking, image search) of one caller at once in this
    process; the event loop's own counter (no lock: only coroutines on one loop touch it)."""

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._held: dict[str, int] = {}

    def try_acquire(self, identity: str) -> bool:
        held = self._held.get(identity, 0)
        if held >= self.per_caller:
            return False
        self._held[identity] = held + 1
        return True

    def release(self, identity: str) -> None:
        held = self._held.get(identity, 0) - 1
        if held > 0:
            self._held[identity] = held
        else:
            self._held.pop(identity, None)
