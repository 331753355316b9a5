"""Fair share in process: a cap on each caller's searches in the worker threads at once (the others wait
in line) and on its concurrent expensive work (re-ranking, image search). Moved out of ``service.ratelimit``
(the token buckets and quotas), which these never touched."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio


class QueueTimeout(Exception):
    """A caller's request waited ``CallerQueues.wait_s`` for its turn."""


class CallerQueues:
    """At most ``per_caller`` searches of one caller in the worker threads at once in this process; the
    caller's others wait on the event loop (holding no thread) in arrival order, up to ``wait_s``. A burst
    of one caller then queues behind itself, not in front of everyone else: with search_workers 4 and
    2 per caller, a greedy client's 16 connections leave 2 threads to the others."""

    def __init__(self, per_caller: int, wait_s: float = 10.0) -> None:
        self.per_caller = per_caller
        self.wait_s = wait_s
        self._queues: dict[str, anyio.Semaphore] = {}

    @contextlib.asynccontextmanager
    async def hold(self, identity: str) -> AsyncIterator[None]:
        """The caller's slot, held to the end of the block; ``QueueTimeout`` after ``wait_s`` in line."""
        sem = self._queues.get(identity)
        if sem is None:
            sem = self._queues[identity] = anyio.Semaphore(self.per_caller)
        try:
            try:
                sem.acquire_nowait()
            except anyio.WouldBlock:
                try:
                    with anyio.fail_after(self.wait_s):
                        await sem.acquire()
                except TimeoutError:
                    raise QueueTimeout(identity) from None
            try:
                yield
            finally:
                sem.release()
        finally:
            if sem.value == self.per_caller and not sem.statistics().tasks_waiting:
                self._queues.pop(identity, None)


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
