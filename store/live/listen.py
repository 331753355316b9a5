"""Hearing the PostgreSQL change log's appends as they commit: ``LISTEN`` on its ``NOTIFY`` channel.

Each append to a ``store.live.postgres.PostgresChangeLog`` sends ``NOTIFY`` on the log's channel (payload:
the index name and its last sequence), delivered when it commits, to every session listening, on any
machine. A ``ChangeListener`` is one such session per process: one dedicated connection in autocommit
(a ``LISTEN`` inside a transaction would wait for its commit), opened again in a forked child
(``ProcessConnection``) and after the connection is lost, with a backoff from ``MIN_BACKOFF_S`` doubling up
to ``MAX_BACKOFF_S`` between failed attempts. ``wait`` never raises for PostgreSQL being away: it answers
nothing heard and keeps trying; ``problem`` says why meanwhile.

A notification is a hint, never the data: it is not stored, and one sent while the listener was not
connected is lost. So each (re)connection is reported as ``Heard.everything`` (anything may have been
missed: read every log), and a reader still polls its log on its own clock; the listener only makes the
poll come early. While a connection stays silent it is checked every ``PING_S`` (``SELECT 1``) and by TCP
keepalives, so a connection that died without a word (a partition, a restarted proxy) is noticed within
about a minute rather than never.

psycopg is imported when the listener first connects: the embedded SQLite default needs none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from store.live.changelog import ProcessConnection
from store.live.postgres import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_SCHEMA, notify_channel

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

MIN_BACKOFF_S = 0.1  # the first retry after a failed connection, doubled at each failure after it
MAX_BACKOFF_S = 5.0
PING_S = 30.0  # a silent connection is checked this often
# libpq's TCP keepalives: a peer gone without closing is noticed after about idle + interval * count.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


@dataclass(frozen=True)
class Heard:
    """What one ``wait`` heard: the indexes notified, and whether anything may have been missed (the
    listener (re)connected, or a payload it could not read)."""

    indexes: frozenset[str] = frozenset()
    everything: bool = False

    def __bool__(self) -> bool:
        return self.everything or bool(self.indexes)

    def concerns(self, index: str) -> bool:
        return self.everything or index in self.indexes


class ChangeListener:
    """This process's ``LISTEN`` on ``channel`` of the database at ``dsn``. Thread-safe (one ``wait`` at a
    time); ``close`` from the thread that waits, or once it no longer does."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
        min_backoff_s: float = MIN_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        if not channel.isidentifier():
            raise ValueError(f"channel {channel!r} must be a plain identifier")
        self.dsn, self.channel = dsn, channel
        self.connect_timeout_s = connect_timeout_s
        self.min_backoff_s, self.max_backoff_s = min_backoff_s, max_backoff_s
        self.problem: str | None = None  # why the last connection attempt failed or was lost
        self.connections = 0  # connections opened (the first, then one per reconnection)
        self._lock = threading.Lock()
        self._conns: ProcessConnection[psycopg.Connection[Any]] = ProcessConnection(
            self._open, lambda conn: not conn.closed and not conn.broken
        )
        self._backoff_s = 0.0  # before the next attempt (0: none failed since the last success)
        self._retry_at = 0.0  # monotonic time of the next attempt
        self._checked_at = 0.0  # when the connection was last known alive

    @classmethod
    def for_logs(cls, dsn: str, schema: str = DEFAULT_SCHEMA) -> ChangeListener:
        """The listener of every ``PostgresChangeLog`` in ``schema`` of the database at ``dsn``."""
        return cls(dsn, notify_channel(schema))

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend of the current connection (None: not connected)."""
        conn = self._conns.current
        return None if conn is None or conn.closed else conn.info.backend_pid

    def _open(self) -> psycopg.Connection[Any]:
        import psycopg
        from psycopg import sql

        conn = psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=self.connect_timeout_s, **_KEEPALIVES
        )
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def wait(self, timeout_s: float) -> Heard:
        """Block at most ``timeout_s`` (plus a connection attempt's ``connect_timeout_s``) for
        notifications; what was heard (empty: nothing, or not connected). Returns as soon as one arrives,
        with every other one already received; at once with ``everything`` after a (re)connection."""
        import psycopg

        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            before = self._conns.current
            try:
                conn = self._connected(deadline)
                if conn is None:
                    return Heard()
                if conn is not before:  # (re)connected, or in a forked child: anything was missed
                    return Heard(everything=True)
                return self._heard(conn, deadline)
            except psycopg.Error as exc:  # lost (or refused the LISTEN): connect again after a backoff
                self._failed(exc)
                return Heard()

    def _connected(self, deadline: float) -> psycopg.Connection[Any] | None:
        """The connection, opened again where needed once the backoff allows; None while it waits."""
        current = self._conns.current
        if current is None or current.closed or current.broken:
            now = time.monotonic()
            if now < self._retry_at:
                time.sleep(max(0.0, min(self._retry_at, deadline) - now))
                if time.monotonic() < self._retry_at:
                    return None
        conn = self._conns.get()  # the same one, or a new one (first, lost, or in a forked child)
        if conn is not current:
            self.connections += 1
            if self.problem is not None:
                log.info("listening on %s again", self.channel)
            self.problem, self._backoff_s = None, 0.0
            self._checked_at = time.monotonic()
        return conn

    def _heard(self, conn: psycopg.Connection[Any], deadline: float) -> Heard:
        now = time.monotonic()
        if now - self._checked_at >= PING_S:
            conn.execute("SELECT 1")  # a dead connection raises here, not never
            self._checked_at = now
        indexes: set[str] = set()
        everything = False
        # The first notification (or the deadline), then whatever else has already arrived.
        for timeout, stop_after in ((max(0.0, deadline - now), 1), (0.0, None)):
            for notice in conn.notifies(timeout=timeout, stop_after=stop_after):
                index = _index_of(notice.payload)
                if index is None:
                    everything = True
                else:
                    indexes.add(index)
            if not indexes and not everything:
                return Heard()
        self._checked_at = time.monotonic()
        return Heard(frozenset(indexes), everything)

    def _failed(self, exc: Exception) -> None:
        message = str(exc).strip() or type(exc).__name__
        if self.problem is None:
            log.warning("listening on %s failed (the poll stands in): %s", self.channel, message)
        self.problem = message
        self._backoff_s = min(self.max_backoff_s, max(self.min_backoff_s, self._backoff_s * 2))
        self._retry_at = time.monotonic() + self._backoff_s
        with contextlib.suppress(Exception):  # a broken connection may fail to close: it is gone anyway
            self._conns.close()

    def close(self) -> None:
        with self._lock:
            self._conns.close()


def _index_of(payload: str) -> str | None:
    """The index a change log's payload names (``{"index": ..., "last": ...}``); None for another."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    index = data.get("index") if isinstance(data, dict) else None
    return index if isinstance(index, str) and index else None
