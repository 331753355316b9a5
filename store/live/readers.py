"""Which processes serve an index's live catalogue, and how far each has applied its change log.

A write with ``wait=true`` returns once every process serving the index shows it, not only the one that
took it: the next search may reach any worker (``ccrk serve --workers N``) or pod. Each process reports
here the sequence it shows, whenever it changes and at least every ``HEARTBEAT_S``; a waiting writer asks
which fresh readers are still behind its sequence. A reader not heard of for ``fresh_s`` (killed, hung,
gone) is not waited for, so a dead process never blocks writes for longer than that.

The board is state about processes, not about the catalogue: losing it loses nothing (readers report again
within a heartbeat). So the embedded board is a SQLite file of its own beside the log
(``INDEX_ROOT/NAME/live-readers.sqlite``, WAL, no sync: no fsync per report, and never the log's write
lock), and in PostgreSQL an ``UNLOGGED`` table beside the log's.
"""

from __future__ import annotations

import abc
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.errors import ChangeLogUnavailableError
from store.layout import index_dir
from store.live.changelog import ProcessConnection
from store.live.wal import open_wal

if TYPE_CHECKING:
    import psycopg

READERS_FILE = "live-readers.sqlite"
HEARTBEAT_S = 1.0  # a reader reports at least this often while it serves
DEFAULT_FRESH_S = 5.0  # a reader silent for longer is not waited for


class ReaderBoard(abc.ABC):
    """The readers of one index's log. Thread-safe; opens its own connection in a forked child."""

    where: str

    @abc.abstractmethod
    def report(self, reader: str, applied: int, wake: str | None = None) -> None:
        """``reader`` shows every change up to ``applied`` (now); ``wake``: the name of its wake-up socket
        (``store.live.wake``), if it has one."""

    @abc.abstractmethod
    def leave(self, reader: str) -> None:
        """``reader`` stops serving the index (a clean shutdown): not waited for any more."""

    def behind(self, seq: int, fresh_s: float = DEFAULT_FRESH_S) -> dict[str, int]:
        """The readers heard of within ``fresh_s`` that show less than ``seq``, with what they show."""
        return {reader: applied for reader, (applied, _) in self.laggards(seq, fresh_s).items()}

    @abc.abstractmethod
    def laggards(self, seq: int, fresh_s: float = DEFAULT_FRESH_S) -> dict[str, tuple[int, str | None]]:
        """``behind``, with each one's wake-up socket name (None: it has none)."""

    @abc.abstractmethod
    def close(self) -> None: ...


class SqliteReaderBoard(ReaderBoard):
    def __init__(self, path: Path, busy_timeout_s: float = 2.0) -> None:
        self.path = Path(path)
        self.where = f"reader board {self.path}"
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conns: ProcessConnection[sqlite3.Connection] = ProcessConnection(self._open)

    @classmethod
    def for_index(cls, root: Path, name: str) -> SqliteReaderBoard:
        return cls(index_dir(root, name) / READERS_FILE)

    def _open(self) -> sqlite3.Connection:
        conn = open_wal(
            self.path,
            self.busy_timeout_s,
            "OFF",  # process state, reported again at each heartbeat
            "CREATE TABLE IF NOT EXISTS readers (reader TEXT PRIMARY KEY, applied INTEGER NOT NULL,"
            " seen_at REAL NOT NULL, wake TEXT)",
        )
        try:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(readers)")}
            if "wake" not in columns:  # a board of the first release of this file
                conn.execute("ALTER TABLE readers ADD COLUMN wake TEXT")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conns.get()
            except sqlite3.Error as exc:
                raise ChangeLogUnavailableError(f"{self.where}: {exc}") from exc

    def report(self, reader: str, applied: int, wake: str | None = None) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO readers (reader, applied, seen_at, wake) VALUES (?, ?, ?, ?) ON CONFLICT"
                " (reader) DO UPDATE SET applied = excluded.applied, seen_at = excluded.seen_at,"
                " wake = excluded.wake",
                (reader, applied, time.time(), wake),
            )

    def leave(self, reader: str) -> None:
        with self._conn() as conn:
            conn.execute("DELETE FROM readers WHERE reader = ?", (reader,))

    def laggards(self, seq: int, fresh_s: float = DEFAULT_FRESH_S) -> dict[str, tuple[int, str | None]]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT reader, applied, wake FROM readers WHERE applied < ? AND seen_at >= ?",
                (seq, time.time() - fresh_s),
            ).fetchall()
        return {str(r): (int(a), w) for r, a, w in rows}

    def close(self) -> None:
        with self._lock:
            self._conns.close()


class PostgresReaderBoard(ReaderBoard):
    """``{schema}.readers`` (UNLOGGED), keyed by index and reader; created when missing. Times are the
    database's clock, so the machines' clocks need not agree."""

    def __init__(self, dsn: str, index: str, schema: str, connect_timeout_s: int = 5) -> None:
        self.dsn, self.index, self.schema = dsn, index, schema
        self.connect_timeout_s = connect_timeout_s
        self.where = f"reader board {schema}.readers of index {index!r}"
        self._lock = threading.Lock()
        self._conns: ProcessConnection[psycopg.Connection[Any]] = ProcessConnection(
            self._open, lambda conn: not conn.closed and not conn.broken
        )

    def _sql(self, text: str) -> Any:
        from psycopg import sql

        return sql.SQL(text).format(s=sql.Identifier(self.schema))

    def _open(self) -> psycopg.Connection[Any]:
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout_s)
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ccrk_live:{self.schema}",))
                conn.execute(self._sql("CREATE SCHEMA IF NOT EXISTS {s}"))
                conn.execute(
                    self._sql(
                        "CREATE UNLOGGED TABLE IF NOT EXISTS {s}.readers (index_name text NOT NULL,"
                        " reader text NOT NULL, applied bigint NOT NULL, seen_at double precision NOT NULL,"
                        " wake text, PRIMARY KEY (index_name, reader))"
                    )
                )
                conn.execute(self._sql("ALTER TABLE {s}.readers ADD COLUMN IF NOT EXISTS wake text"))
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        import psycopg

        with self._lock:
            try:
                yield self._conns.get()
            except psycopg.Error as exc:
                raise ChangeLogUnavailableError(f"{self.where}: {exc}") from exc

    def report(self, reader: str, applied: int, wake: str | None = None) -> None:
        with self._conn() as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO {s}.readers (index_name, reader, applied, seen_at, wake) VALUES (%s, %s,"
                    " %s, extract(epoch FROM clock_timestamp()), %s) ON CONFLICT (index_name, reader) DO"
                    " UPDATE SET applied = excluded.applied, seen_at = excluded.seen_at, wake = excluded.wake"
                ),
                (self.index, reader, applied, wake),
            )

    def leave(self, reader: str) -> None:
        with self._conn() as conn:
            conn.execute(
                self._sql("DELETE FROM {s}.readers WHERE index_name = %s AND reader = %s"),
                (self.index, reader),
            )

    def laggards(self, seq: int, fresh_s: float = DEFAULT_FRESH_S) -> dict[str, tuple[int, str | None]]:
        with self._conn() as conn:
            rows = conn.execute(
                self._sql(
                    "SELECT reader, applied, wake FROM {s}.readers WHERE index_name = %s AND applied < %s"
                    " AND seen_at >= extract(epoch FROM clock_timestamp()) - %s"
                ),
                (self.index, seq, fresh_s),
            ).fetchall()
        return {str(r): (int(a), w) for r, a, w in rows}

    def close(self) -> None:
        with self._lock:
            self._conns.close()


def open_reader_board(root: Path, name: str, dsn: str | None = None) -> ReaderBoard:
    """Index ``name``'s board: beside its log in PostgreSQL at ``dsn``, else a SQLite file in its folder."""
    if dsn:
        from store.live.postgres import DEFAULT_SCHEMA

        return PostgresReaderBoard(dsn, name, DEFAULT_SCHEMA)
    return SqliteReaderBoard.for_index(root, name)
