"""Helpers of the change log's tests: the real PostgreSQL server's address, and damage done to a stored
record behind the log's back."""

from __future__ import annotations

import os
from collections.abc import Callable

from store.live import ChangeLog, SqliteChangeLog

PG_DSN = os.environ.get("CCRK_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")

MakeLog = Callable[[], ChangeLog]  # a new handle on the test's one log (as another process would open it)


def damage(log: ChangeLog, seq: int, record: str, crc: int | None = None) -> None:
    """Overwrite the stored record of ``seq`` behind the log's back (a bit rot, a foreign writer)."""
    from store.live.changelog import record_crc

    crc = record_crc(record) if crc is None else crc
    if isinstance(log, SqliteChangeLog):
        import sqlite3

        with sqlite3.connect(log.path) as conn:
            conn.execute("UPDATE changes SET record = ?, crc = ? WHERE seq = ?", (record, crc, seq))
        return
    import psycopg

    from store.live.postgres import PostgresChangeLog

    assert isinstance(log, PostgresChangeLog)
    with psycopg.connect(log.dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{log.schema}".changes SET record = %s, crc = %s WHERE index_name = %s AND seq = %s',
            (record, crc, log.index, seq),
        )
