"""What the PostgreSQL log adds to the shared contract (tests/store/live/test_changelog.py runs that on
both backends): a server that does not answer is a typed, retryable error; a lost connection is opened
again; one schema holds the logs of several indexes apart; each commit sends NOTIFY."""

from __future__ import annotations

import json
import time

import pytest

from store.errors import ChangeLogUnavailableError
from store.live import Delete, Patch
from tests.store.live.logs import PG_DSN

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")

from store.live.postgres import PostgresChangeLog  # noqa: E402  (after the skip: it needs psycopg)


def test_a_server_that_does_not_answer_is_unavailable() -> None:
    started = time.monotonic()
    with pytest.raises(ChangeLogUnavailableError):
        PostgresChangeLog("postgresql://postgres@127.0.0.1:1/test", "shop", connect_timeout_s=2)
    assert time.monotonic() - started < 10


def test_a_lost_connection_is_unavailable_once_then_opened_again(pg_schema: str) -> None:
    log = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    log.append([Delete(id="a")])
    opened = log._conns.current
    assert opened is not None
    pid = opened.info.backend_pid
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(ChangeLogUnavailableError):
        log.append([Delete(id="b")])
    assert log.append([Delete(id="c")]) == [2], "the failed append wrote nothing"
    assert [e.change.id for e in log.changes_since(0)] == ["a", "c"]
    log.close()


def test_indexes_in_one_schema_keep_their_own_sequences_and_marks(pg_schema: str) -> None:
    shop = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    other = PostgresChangeLog(PG_DSN, "other", schema=pg_schema)
    assert shop.append([Delete(id="s1"), Delete(id="s2")]) == [1, 2]
    assert other.append([Patch(id="o1", fields={"x": 1})]) == [1]
    shop.fold_upto(2)
    assert shop.truncate_upto(2) == 2
    assert [e.change.id for e in other.changes_since(0)] == ["o1"]
    assert (other.folded_sequence(), other.pending(), shop.pending(), shop.last_sequence()) == (0, 1, 0, 2)
    shop.close()
    other.close()


def test_each_commit_notifies_the_listeners(pg_schema: str) -> None:
    log = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    with psycopg.connect(PG_DSN, autocommit=True) as listener:
        listener.execute(f"LISTEN {log.notify_channel}")
        log.append([Delete(id="a"), Delete(id="b")])
        got = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [{"index": "shop", "last": 2}]
    log.close()
