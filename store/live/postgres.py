"""The change log in PostgreSQL: the same ``ChangeLog`` for processes on several machines (API pods, Ray
Serve replicas on several nodes), where one SQLite file cannot be shared.

Two tables in one schema (default ``ccrk_live``), every index's rows keyed by its name::

    changes(index_name, seq, committed_at, record, crc)     PRIMARY KEY (index_name, seq)
    log_state(index_name, last_sequence, folded_sequence)   one row per index

Sequence numbers come from ``log_state.last_sequence``, not a PostgreSQL sequence: ``nextval`` is taken
before commit, so two writers could commit 11 before 10 and a reader at 10 would skip 10 forever. The
``UPDATE ... RETURNING`` of the index's state row locks it until the transaction ends, so writers of one
index commit one at a time, in the order of their numbers, with no gap. A commit returns once PostgreSQL
has flushed it (``synchronous_commit`` is set ``on`` for the session, whatever the server's default).
Each append also sends ``NOTIFY`` on the channel named by ``notify_channel`` (payload: the index name and
its last sequence), delivered at commit: every serving process, on any machine, ``LISTEN``s there
(``store.live.listen.ChangeListener``) and reads the log at once rather than at its next poll. The
notification is only a hint: one missed (a listener reconnecting, PostgreSQL away) costs the poll.

psycopg is imported when a log is opened, not at import: the embedded default needs no PostgreSQL client.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from store.errors import ChangeLogError, ChangeLogUnavailableError
from store.live.changelog import ChangeLog, ProcessConnection, Row, fold_refused, record_crc, truncate_refused

if TYPE_CHECKING:
    import psycopg

DEFAULT_SCHEMA = "ccrk_live"
DEFAULT_CONNECT_TIMEOUT_S = 5

_DDL = (
    "CREATE TABLE IF NOT EXISTS {s}.changes (index_name text NOT NULL, seq bigint NOT NULL,"
    " committed_at double precision NOT NULL, record text NOT NULL, crc bigint NOT NULL,"
    " PRIMARY KEY (index_name, seq))",
    "CREATE TABLE IF NOT EXISTS {s}.log_state (index_name text PRIMARY KEY,"
    " last_sequence bigint NOT NULL DEFAULT 0, folded_sequence bigint NOT NULL DEFAULT 0)",
)


def notify_channel(schema: str = DEFAULT_SCHEMA) -> str:
    """The ``NOTIFY`` channel of the logs in ``schema``: one per schema, the payload names the index."""
    return f"{schema}_changes"


_INSERT = "INSERT INTO {s}.changes (index_name, seq, committed_at, record, crc) VALUES (%s, %s, %s, %s, %s)"


class PostgresChangeLog(ChangeLog):
    """The log of index ``index`` in the database at ``dsn`` (a libpq connection string or URL), under
    ``schema``, created when missing."""

    def __init__(
        self,
        dsn: str,
        index: str,
        schema: str = DEFAULT_SCHEMA,
        connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        if not index:
            raise ValueError("an index name is needed")
        if not schema.isidentifier() or len(schema) > 55:
            raise ValueError(f"schema {schema!r} must be a plain identifier of at most 55 characters")
        self.dsn, self.index, self.schema = dsn, index, schema
        self.connect_timeout_s = connect_timeout_s
        self.where = f"change log {schema}.changes of index {index!r}"
        self.notify_channel = notify_channel(schema)
        self._lock = threading.Lock()
        # Opened again after a fork (``ProcessConnection``) or once the connection is lost.
        self._conns: ProcessConnection[psycopg.Connection[Any]] = ProcessConnection(
            self._open, lambda conn: not conn.closed and not conn.broken
        )
        with self._lock:
            self._connection()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        import psycopg

        try:
            yield
        except psycopg.OperationalError as exc:  # down, unreachable, the connection lost
            raise ChangeLogUnavailableError(f"{self.where}: {exc}") from exc
        except psycopg.Error as exc:
            raise ChangeLogError(f"{self.where}: {exc}") from exc

    def _sql(self, text: str) -> Any:
        """``text`` with ``{s}`` as the quoted schema name."""
        from psycopg import sql

        return sql.SQL(text).format(s=sql.Identifier(self.schema))

    def _connection(self) -> psycopg.Connection[Any]:
        """This process's connection, opened again after a fork or a lost connection; with ``_lock`` held."""

        return self._conns.get()

    def _open(self) -> psycopg.Connection[Any]:
        import psycopg

        with self._errors():
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout_s)
            try:
                conn.execute("SET synchronous_commit TO on")
                with conn.transaction():
                    # CREATE ... IF NOT EXISTS races between sessions: one at a time per schema.
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ccrk_live:{self.schema}",))
                    conn.execute(self._sql("CREATE SCHEMA IF NOT EXISTS {s}"))
                    for statement in _DDL:
                        conn.execute(self._sql(statement))
                    conn.execute(
                        self._sql(
                            "INSERT INTO {s}.log_state (index_name) VALUES (%s) ON CONFLICT DO NOTHING"
                        ),
                        (self.index,),
                    )
            except BaseException:
                conn.close()
                raise
        return conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock, self._errors():
            conn = self._connection()
            with conn.transaction():
                yield conn

    def _append(self, records: list[str]) -> int:
        with self._transaction() as conn:
            last, now = conn.execute(
                self._sql(
                    "UPDATE {s}.log_state SET last_sequence = last_sequence + %s WHERE index_name = %s"
                    " RETURNING last_sequence, extract(epoch FROM clock_timestamp())::double precision"
                ),
                (len(records), self.index),
            ).fetchone()
            first = int(last) - len(records) + 1
            rows = [(first + i, float(now), r, record_crc(r)) for i, r in enumerate(records)]
            self._insert(conn, rows)
            payload = json.dumps({"index": self.index, "last": int(last)})
            conn.execute("SELECT pg_notify(%s, %s)", (self.notify_channel, payload))
        return first

    def _insert(self, conn: psycopg.Connection[Any], rows: list[Row]) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                self._sql(_INSERT),
                [(self.index, *row) for row in rows],
            )

    def _rows(self, after: int, upto: int | None, limit: int) -> list[Row]:
        with self._transaction() as conn:
            rows = conn.execute(
                self._sql(
                    "SELECT seq, committed_at, record, crc FROM {s}.changes WHERE index_name = %s"
                    " AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
                ),
                (self.index, after, (1 << 63) - 1 if upto is None else upto, limit),
            ).fetchall()
        return [(int(seq), float(at), str(record), int(crc)) for seq, at, record, crc in rows]

    def _count_after(self, after: int) -> int:
        with self._transaction() as conn:
            row = conn.execute(
                self._sql("SELECT count(*) FROM {s}.changes WHERE index_name = %s AND seq > %s"),
                (self.index, after),
            ).fetchone()
        return int(row[0])

    def _state(self, conn: psycopg.Connection[Any], lock: str = "") -> tuple[int, int]:
        row = conn.execute(
            self._sql(
                f"SELECT last_sequence, folded_sequence FROM {{s}}.log_state WHERE index_name = %s {lock}"
            ),
            (self.index,),
        ).fetchone()
        if row is None:  # the row is made when the log is opened; someone dropped it since
            raise ChangeLogError(f"{self.where}: the index's state row is missing")
        return int(row[0]), int(row[1])

    def last_sequence(self) -> int:
        with self._transaction() as conn:
            return self._state(conn)[0]

    def folded_sequence(self) -> int:
        with self._transaction() as conn:
            return self._state(conn)[1]

    def _fold(self, seq: int) -> int:
        with self._transaction() as conn:
            last, folded = self._state(conn, "FOR UPDATE")
            if seq > last:
                raise fold_refused(self.where, seq, last)
            if seq > folded:
                conn.execute(
                    self._sql("UPDATE {s}.log_state SET folded_sequence = %s WHERE index_name = %s"),
                    (seq, self.index),
                )
        return max(seq, folded)

    def _truncate(self, seq: int) -> int:
        with self._transaction() as conn:
            _, folded = self._state(conn, "FOR SHARE")
            if seq > folded:
                raise truncate_refused(self.where, seq, folded)
            cur = conn.execute(
                self._sql("DELETE FROM {s}.changes WHERE index_name = %s AND seq <= %s"), (self.index, seq)
            )
            return cur.rowcount

    def close(self) -> None:
        with self._lock:
            self._conns.close()
