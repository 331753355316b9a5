"""Waking the live poller when another machine's process writes: PostgreSQL's ``LISTEN/NOTIFY``.

With the change log in PostgreSQL (``CCRK_LIVE_DSN``), every append notifies its index's name on the log's
channel. Each serving process runs one thread that listens there (``store.live.listen.ChangeListener``:
one connection of its own, opened again when lost) and, when an index it serves is named, wakes the
runtime's live poller at once, as a writer of the same machine does through ``store.live.wake``. So a
write through any pod shows in the others within a round trip, not at their next ``CCRK_LIVE_POLL_S``
poll; with ``wait=true`` the writer's wait ends sooner too. While PostgreSQL or the connection is away, the
poll stands in; after each reconnection the poller is woken once (notifications may have been missed).

A thread, not a task on the event loop: the listener's connection is a blocking one, and a slow
reconnection (``connect_timeout_s``) must never hold the loop. It waits in slices of ``SLICE_S``, so that
``stop`` ends it within one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from store.live.listen import MAX_BACKOFF_S, ChangeListener

log = logging.getLogger(__name__)

SLICE_S = 0.5  # the longest one wait for notifications lasts: how soon ``stop`` is heard


class ChangeNotices:
    """Calls ``wake`` (from its own thread) whenever ``listener`` hears of a change to an index for which
    ``serves`` is true, or may have missed one. Started by ``start``, ended by ``stop``; the listener is
    closed by the thread as it ends."""

    def __init__(
        self,
        listener: ChangeListener,
        serves: Callable[[str], bool],
        wake: Callable[[], None],
        slice_s: float = SLICE_S,
        listening: Callable[[bool], None] | None = None,
    ) -> None:
        self.listener = listener
        self.serves = serves
        self.wake = wake
        self.slice_s = slice_s
        # Called (from the thread) with whether the listener holds a connection, after each wait.
        self.listening = listening
        self.wakeups = 0  # how often it woke the poller
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_logs(
        cls,
        dsn: str,
        serves: Callable[[str], bool],
        wake: Callable[[], None],
        listening: Callable[[bool], None] | None = None,
    ) -> ChangeNotices:
        """Notices of the live catalogue's logs at ``dsn`` (``CCRK_LIVE_DSN``), in their default schema."""
        return cls(ChangeListener.for_logs(dsn), serves, wake, listening=listening)

    @property
    def problem(self) -> str | None:
        """Why the listener holds no connection now (None: it listens, or has not tried yet)."""
        return self.listener.problem

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the change notices are already started")
        self._thread = threading.Thread(target=self._run, name="ccrk-live-notices", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 6.0) -> bool:
        """Ask the thread to end and wait for it at most ``timeout_s`` (it ends within ``slice_s``, or a
        connection attempt's timeout); whether it ended."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        ended = not self._thread.is_alive()
        if not ended:
            log.warning("the change notices' thread did not end within %.1f s", timeout_s)
        return ended

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    heard = self.listener.wait(self.slice_s)
                    if heard.everything or any(self.serves(index) for index in heard.indexes):
                        self.wakeups += 1
                        self.wake()
                    if self.listening is not None:
                        self.listening(self.listener.backend_pid is not None)
                except Exception:  # the thread outlives anything unforeseen: the poll stands in meanwhile
                    log.exception("listening for changes of the live catalogue failed")
                    self._stop.wait(MAX_BACKOFF_S)
        finally:
            self.listener.close()
