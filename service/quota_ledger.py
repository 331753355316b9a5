"""Daily quotas that outlive Redis: each process notes the counts its quota checks saw and merges them into
the index root's state (``store.quota_state``) at most every ``flush_s``, learning the others' counts as it
does. The rate limiter never counts a day's quota below what the ledger knows: after a Redis restart
without persistence the counter resumes from the state (the last ``flush_s`` of counting at most is
forgotten), and while Redis is down each process counts on from the last total it knows, re-read every
``flush_s`` (N processes may then each spend what was left, N times the remainder at most, but a spent
quota stays spent).

A flush is one small locked, fsynced file write (16 ms p50, 88 ms at worst on the dev machine's disk), so
it runs in a thread of its own, at most every ``flush_s`` and only while keys with quotas are in use; the
checks on the event loop only read and update a dict (and read the day's file once a day). A root that
cannot be written (a read-only mount) is logged once and the ledger keeps counting in memory: quotas are
then as durable as Redis.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from store.quota_state import QuotaStateError, merge_counts, quota_path, read_counts

log = logging.getLogger(__name__)


class QuotaLedger:
    def __init__(self, root: Path, flush_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.flush_s = flush_s
        self.clock = clock
        self._lock = threading.Lock()
        self._day = ""
        self._known: dict[str, int] = {}  # the day's counts: this process's and the merged file's
        self._dirty = False
        self._next_flush = 0.0
        self._warned = False
        self._flushing = False  # a flush thread is running

    def floor(self, identity: str, day: str) -> int:
        """The least ``identity`` has used on ``day`` as far as this process knows."""
        if day != self._day:
            self._roll(day)
        return self._known.get(identity, 0)

    def note(self, identity: str, day: str, used: int) -> None:
        """``identity`` has used ``used`` of ``day``'s quota; merged into the state when a flush is due."""
        with self._lock:
            if day != self._day:
                self._roll_locked(day)
            if used > self._known.get(identity, 0):
                self._known[identity] = used
                self._dirty = True
            due = self._dirty and not self._flushing and self.clock() >= self._next_flush
            if due:
                self._flushing = True
                self._next_flush = self.clock() + self.flush_s
        if due:
            threading.Thread(target=self._flush_in_thread, name="quota-ledger", daemon=True).start()

    def _flush_in_thread(self) -> None:
        try:
            self.flush()
        finally:
            self._flushing = False

    def flush(self) -> None:
        """Merge what this process knows into the state now (and learn the other processes' counts)."""
        with self._lock:
            if not self._day:
                return
            day, counts = self._day, dict(self._known)
            self._dirty = False
            self._next_flush = self.clock() + self.flush_s
        try:
            merged = merge_counts(self.root, day, counts)
        except (OSError, QuotaStateError) as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot keep daily quotas under %s (%s): they last as long as Redis", self.root, exc
                )
            return
        with self._lock:
            if day == self._day:
                for identity, used in merged.items():
                    if used > self._known.get(identity, 0):
                        self._known[identity] = used

    def _roll(self, day: str) -> None:
        with self._lock:
            if day != self._day:
                self._roll_locked(day)

    def _roll_locked(self, day: str) -> None:
        """A new day: what this process counted of the old one is flushed first, then the new day's state
        is read (another process, or this one before a restart, may have counted already)."""
        if self._dirty and self._day:
            old, counts = self._day, dict(self._known)
            with contextlib.suppress(OSError, QuotaStateError):
                merge_counts(self.root, old, counts)
        self._day, self._dirty = day, False
        try:
            self._known = read_counts(quota_path(self.root, day))
        except (OSError, QuotaStateError) as exc:
            self._known = {}
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot keep daily quotas under %s (%s): they last as long as Redis", self.root, exc
                )
