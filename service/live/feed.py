"""One served index's change log, read into the version it serves.

Every process serving an index holds a ``LiveFeed`` for it. When a version is loaded (``attach``), its
index becomes a ``store.live.overlay.LiveIndex`` and catches up with the whole log after the version's
own changes before it serves; then the runtime's live poller calls ``catch_up`` every
``CCRK_LIVE_POLL_S``, so a change written by any process (another worker of ``ccrk serve --workers N``,
another machine's through PostgreSQL) shows in this one within a poll, and sooner when the poller is woken
(a waiting writer's ``store.live.wake``; PostgreSQL's NOTIFY, ``service.live.notices``). A write through
this process (``write``) is appended, then applied here at once, before it is acknowledged (``wait``); with
wait, the acknowledgement also waits until every other process serving the index shows it: each feed
reports what it shows on the index's reader board (``store.live.readers``) at each catch-up that moves it
and at least every ``HEARTBEAT_S``, and a writer waits for the fresh readers behind its sequence.

Each catch-up forgets what the served version's caches hold of the rows it changed (``Served.forget``),
so hits, sort and facets read the new values. While the log cannot be read, searches keep answering from
the overlay already applied, and ``problem`` says why (``/readyz``, ``/metrics``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from service.index_holder import Served
from store.errors import ChangeLogError, ChangeLogGapError, IndexUnreachableError
from store.live import MAX_PAGE, Change, ChangeLog, changelog_path, open_changelog
from store.live.delta import ProductEmbedder
from store.live.overlay import Applied, LiveOverlay
from store.live.photos import PhotoStore
from store.live.readers import HEARTBEAT_S, ReaderBoard, open_reader_board
from store.live.view import LiveIndex
from store.live.wake import nudge

log = logging.getLogger(__name__)

NUDGE_S = 0.05  # a waiting writer wakes the processes behind it again this often (a datagram may be lost)

# (seconds from each applied entry's commit to its application, the sequence now shown) -> None
ApplyObserver = Callable[[list[float], int], None]


class LiveFeed:
    """Index ``name``'s log (SQLite in its folder under ``root``, or PostgreSQL at ``dsn``) and what this
    process applied of it. Thread-safe: catch-ups run one at a time."""

    def __init__(
        self,
        root: Path,
        name: str,
        dsn: str | None = None,
        on_apply: ApplyObserver | None = None,
        embedder: ProductEmbedder | None = None,
    ) -> None:
        self.root = Path(root)
        self.name = name
        self.dsn = dsn
        self.photos = PhotoStore(self.root, name)  # where upserted products' photos are kept
        # Embeds upserted products as they are applied (None: they are counted as not applied).
        self.embedder = embedder
        # Told of every page applied: the seconds from each entry's commit to now, and the sequence shown.
        self._on_apply = on_apply or (lambda lags, applied: None)
        self._log: ChangeLog | None = None
        self._open_lock = threading.Lock()
        self._apply_lock = threading.Lock()
        self.problem: str | None = None  # why the last read of the log failed (None: it did not)
        self._board: ReaderBoard | None = None
        self._token = uuid.uuid4().hex[:8]  # two servers of one index in one process are two readers
        # This process's wake-up socket (store.live.wake), set by the runtime.
        self.wake_name: str | None = None
        # (pid, sequence, monotonic time) last reported to the board.
        self._reported: tuple[int, int, float] = (-1, -1, 0.0)
        self.board_problem: str | None = None  # why the last report to the reader board failed
        self.applied_entries = 0  # entries applied by this process since its start (every version's)

    # -- the log ---------------------------------------------------------------------------------------------

    def _opened(self, create: bool) -> ChangeLog | None:
        """The log, opened once; without ``create``, None while an embedded log has no file yet (nothing
        was ever written to the index: a reader creates nothing in a folder it may only read)."""
        with self._open_lock:
            if self._log is None:
                if not self.dsn and not create and not changelog_path(self.root, self.name).is_file():
                    return None
                self._log = open_changelog(self.root, self.name, self.dsn)
            return self._log

    def write(self, changes: Sequence[Change]) -> list[int]:
        """Append ``changes`` in one transaction; their sequence numbers once durable (``ChangeLog.append``:
        ``InvalidChangeError``, ``ChangeLogUnavailableError`` with nothing written)."""
        opened = self._opened(create=True)
        assert opened is not None
        return opened.append(list(changes))

    def pending(self) -> int:
        """Entries no version holds yet (0 while there is no log)."""
        opened = self._opened(create=False)
        return 0 if opened is None else opened.pending()

    def close(self) -> None:
        with self._open_lock:
            if self._board is not None:
                if self._reported[0] == os.getpid():
                    with contextlib.suppress(ChangeLogError):
                        self._board.leave(self.reader)
                self._board.close()
                self._board = None
            if self._log is not None:
                self._log.close()
                self._log = None

    # -- applying --------------------------------------------------------------------------------------------

    def attach(self, served: Served) -> None:
        """Make ``served``'s index a live view over it and apply the log to it (before it serves: run in
        the loading thread): the changes after the last one the version holds (``live_sequence``)."""
        if not isinstance(served.index, LiveIndex):
            held = int(getattr(served.index.manifest, "live_sequence", 0))
            overlay = LiveOverlay(served.index, applied=held, embedder=self.embedder)
            served.index = LiveIndex(served.index, overlay)  # type: ignore[assignment]
        self.catch_up(served)

    def catch_up(self, served: Served, upto: int | None = None) -> Applied | None:
        """Apply every entry after what ``served`` shows (up to ``upto``, None: all); None when there was
        nothing to apply or the log could not be read (``problem`` says why)."""
        index = served.index
        if not isinstance(index, LiveIndex):
            return None
        with self._apply_lock:
            try:
                opened = self._opened(create=False)
                if opened is None:
                    self.problem = None
                    self._report(index.live_sequence)  # on the board before the first write is waited on
                    return None
                total: Applied | None = None
                while upto is None or index.live_sequence < upto:
                    page = opened.changes_since(index.live_sequence, limit=MAX_PAGE, upto=upto)
                    if not page:
                        break
                    if page[0].seq != index.live_sequence + 1:  # sequences have no gaps: these were dropped
                        raise ChangeLogGapError(
                            f"the change log of {self.name!r} no longer holds changes "
                            f"{index.live_sequence + 1} to {page[0].seq - 1}, which version "
                            f"{served.version} lacks (it is older than every version kept): nothing "
                            "after them is applied; a newer version holds them"
                        )
                    applied = index.overlay.apply(page)
                    served.forget(applied.rows)
                    self.applied_entries += applied.entries
                    now = time.time()
                    self._on_apply([now - e.committed_at for e in page], index.live_sequence)
                    total = applied
                self.problem = None
                self._report(index.live_sequence)
                return total
            except (ChangeLogError, IndexUnreachableError) as exc:
                if self.problem != str(exc):
                    log.error("reading the change log of index %s failed: %s", self.name, exc)
                self.problem = str(exc)
                return None

    # -- the reader board ------------------------------------------------------------------------------------

    @property
    def reader(self) -> str:
        """This feed on the board: host, pid (a forked worker is a reader of its own) and a token."""
        return f"{socket.gethostname()}:{os.getpid()}:{self._token}"

    def _opened_board(self) -> ReaderBoard:
        with self._open_lock:
            if self._board is None:
                self._board = open_reader_board(self.root, self.name, self.dsn)
            return self._board

    def _report(self, applied: int) -> None:
        """Tell the board what this process shows, when it moved or a heartbeat is due; a board that does
        not answer costs this process nothing but its writers' wait (``board_problem``)."""
        pid, last, at = self._reported
        now = time.monotonic()
        if pid == os.getpid() and last == applied and now - at < HEARTBEAT_S:
            return
        try:
            self._opened_board().report(self.reader, applied, self.wake_name)
        except ChangeLogError as exc:
            if self.board_problem != str(exc):
                log.warning("reporting to the reader board of index %s failed: %s", self.name, exc)
            self.board_problem = str(exc)
            return
        self.board_problem = None
        self._reported = (os.getpid(), applied, now)

    def behind(self, seq: int) -> dict[str, int]:
        """The other processes serving the index, heard of lately, that do not show ``seq`` yet (what they
        show); empty where the board cannot be read (then only this process is waited for)."""
        return {reader: applied for reader, (applied, _) in self._laggards(seq).items()}

    def _laggards(self, seq: int) -> dict[str, tuple[int, str | None]]:
        try:
            laggards = self._opened_board().laggards(seq)
        except ChangeLogError as exc:
            self.board_problem = str(exc)
            return {}
        laggards.pop(self.reader, None)
        return laggards

    def wait_for(self, served: Served, seq: int, timeout_s: float) -> bool:
        """Apply the log up to ``seq`` to ``served``, then wait for every other process serving the index
        to show it, waking them (``store.live.wake``: again every ``NUDGE_S`` while they lag): whether all
        of them did within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.catch_up(served, upto=seq)
            index = served.index
            if isinstance(index, LiveIndex) and index.live_sequence >= seq:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        nudged = -math.inf
        while laggards := self._laggards(seq):
            now = time.monotonic()
            if now >= deadline:
                return False
            if now - nudged >= NUDGE_S:
                nudge(wake for _, wake in laggards.values() if wake)
                nudged = now
            time.sleep(0.002)
        return True
