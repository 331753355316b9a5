"""Running a query's independent blocking steps side by side (the graph walks and the BM25 search of a
hybrid query, ``store.hybrid.gather``): each releases the GIL (faiss, tantivy, SQLite, numpy), so on an
idle core they overlap and the query waits for the slowest, not for their sum.

A pool of its own, never the caller's: a step queued behind the callers waiting on it would deadlock a
shared pool. When every thread is busy (a loaded server, where overlapping buys nothing), a step runs on
the caller's thread at once instead of queueing: no query waits for another's step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class FanOut:
    """A small pool for the steps of one query (thread-safe)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, int(threads))
        self._free = threading.Semaphore(self.threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ccrk-fan-out")

    def start(self, step: Callable[..., T], *args: Any) -> Callable[[], T]:
        """Start ``step(*args)`` and return what waits for its result (and raises what it raised)."""
        if not self._free.acquire(blocking=False):  # every thread busy: run it here, now
            result = step(*args)
            return lambda: result
        try:
            future: Future[T] = self._pool.submit(step, *args)
        except RuntimeError:  # shut down: run it here
            self._free.release()
            result = step(*args)
            return lambda: result
        future.add_done_callback(lambda _: self._free.release())
        return future.result

    def close(self) -> None:
        # Steps already queued still run: a query waiting on one must get its answer, not a cancellation.
        self._pool.shutdown(wait=False)
