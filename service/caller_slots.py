"""Fair share in process: the search slots shared fairly among the callers asking for them (the others wait
in line) and a cap on each caller's concurrent expensive work (re-ranking, image search). Moved out of
``service.ratelimit`` (the token buckets and quotas), which these never touched."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator
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
    slot (a shop's front end sends all its shoppers' searches on one key). ``per_caller`` (CCRK_MAX_
    CONCURRENT_PER_CALLER; 0: none) caps one caller's slots even when the others are free. A search waiting
    ``wait_s`` gets ``QueueTimeout`` (a 429 at the edge). Only coroutines of one event loop touch it."""

    def __init__(self, slots: int, per_caller: int = 0, wait_s: float = 10.0) -> None:
        self.slots = slots
        self.per_caller = per_caller
        self.wait_s = wait_s
        self._free = slots
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._tickets = 0

    def _may_start(self, identity: str) -> bool:
        return self.per_caller == 0 or self._running.get(identity, 0) < self.per_caller

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
