"""The change log's listener on the real PostgreSQL server: it hears each append to a log of its schema,
names the index, says ``everything`` after each (re)connection; a killed backend is reconnected to and a
later append heard; a server that does not answer is no error, only ``problem`` and a bounded backoff; a
forked child listens on a connection of its own."""

from __future__ import annotations

import os
import time

import pytest

from store.live import Delete
from store.live.listen import ChangeListener, Heard
from tests.store.live.logs import PG_DSN

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")

from store.live.postgres import PostgresChangeLog  # noqa: E402  (after the skip: it needs psycopg)


def heard_within(listener: ChangeListener, want: str, timeout_s: float = 10.0) -> Heard:
    """Wait until ``listener`` hears of index ``want`` (not merely ``everything``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        heard = listener.wait(0.5)
        if want in heard.indexes:
            return heard
    raise AssertionError(f"no notification of {want!r} within {timeout_s} s")


def connected(listener: ChangeListener, timeout_s: float = 10.0) -> None:
    """Wait until ``listener`` reports a (re)connection."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if listener.wait(0.5).everything:
            return
    raise AssertionError(f"not connected within {timeout_s} s: {listener.problem}")


def test_appends_are_heard_by_index_name(pg_schema: str) -> None:
    listener = ChangeListener.for_logs(PG_DSN, pg_schema)
    shop = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    other = PostgresChangeLog(PG_DSN, "other", schema=pg_schema)
    try:
        first = listener.wait(0.5)
        assert first.everything and first.concerns("anything"), "the first connection may have missed any"
        assert not listener.wait(0.2), "nothing was written"
        shop.append([Delete(id="a")])
        other.append([Delete(id="b")])
        heard = heard_within(listener, "shop")
        if "other" not in heard.indexes:
            heard = heard_within(listener, "other")
        assert not heard.everything and heard.concerns("other") and not heard.concerns("third")
        assert listener.connections == 1
    finally:
        listener.close()
        shop.close()
        other.close()


def test_a_terminated_backend_is_reconnected_and_a_later_append_heard(pg_schema: str) -> None:
    listener = ChangeListener.for_logs(PG_DSN, pg_schema)
    shop = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    try:
        connected(listener)
        pid = listener.backend_pid
        assert pid is not None
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        connected(listener)  # the loss raised nothing; the reconnection says everything
        assert listener.connections == 2 and listener.backend_pid not in (None, pid)
        assert listener.problem is None
        shop.append([Delete(id="a")])
        heard_within(listener, "shop")
    finally:
        listener.close()
        shop.close()


def test_a_server_that_does_not_answer_is_no_error_and_is_tried_again_after_a_bounded_backoff() -> None:
    listener = ChangeListener(
        "postgresql://postgres@127.0.0.1:1/test", "ccrk_live_changes", min_backoff_s=0.05, max_backoff_s=0.4
    )
    assert not listener.wait(0.1)
    assert listener.problem and listener.connections == 0
    assert listener._backoff_s == 0.05
    started = time.monotonic()
    assert not listener.wait(0.0)  # within the backoff: no attempt, no sleep past the timeout
    assert time.monotonic() - started < 0.04 and listener._backoff_s == 0.05
    backoffs = []
    for _ in range(5):  # each wait long enough for one more attempt
        assert not listener.wait(1.0)
        backoffs.append(listener._backoff_s)
    assert backoffs == [0.1, 0.2, 0.4, 0.4, 0.4]
    listener.close()


def test_a_forked_child_listens_on_a_connection_of_its_own(pg_schema: str) -> None:
    listener = ChangeListener.for_logs(PG_DSN, pg_schema)
    try:
        connected(listener)
        parent_backend = listener.backend_pid
        child = os.fork()
        if child == 0:  # the child: its own connection, hears its own append; exits without cleanup
            code = 1
            try:
                if listener.wait(5.0).everything and listener.backend_pid != parent_backend:
                    log = PostgresChangeLog(PG_DSN, "child", schema=pg_schema)
                    log.append([Delete(id="c")])
                    heard_within(listener, "child")
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connection was left alone by the child, and heard the child's append.
        assert listener.backend_pid == parent_backend
        heard_within(listener, "child")
    finally:
        listener.close()
