"""The live poller's wake-ups from PostgreSQL (``service.live.notices``) on the real server: an append to a
served index wakes it, one to another index does not, the connection is woken for once; ``stop`` ends the
thread within its slice and closes its connection; a server that does not answer wakes nothing and stops
nothing; the listening state (``ccrk_live_notices_listening``, ``/readyz`` ``change_notices``) is reported
after each wait."""

from __future__ import annotations

import threading
import time

import pytest

from service.live.notices import ChangeNotices
from store.live import Delete
from store.live.listen import ChangeListener
from store.live.postgres import PostgresChangeLog
from tests.store.live.conftest import pg_schema as pg_schema  # the fixture: a fresh schema, dropped after
from tests.store.live.logs import PG_DSN

pytest.importorskip("psycopg", reason="psycopg is not installed")


class Wakes:
    """Counts the wake-ups, and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._event = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self._event.set()

    def next(self, timeout_s: float) -> bool:
        woken = self._event.wait(timeout_s)
        self._event.clear()
        return woken


def test_an_append_to_a_served_index_wakes_and_another_does_not(pg_schema: str) -> None:
    wakes = Wakes()
    states: list[bool] = []
    listener = ChangeListener.for_logs(PG_DSN, pg_schema)
    serves = lambda name: name == "shop"  # noqa: E731
    notices = ChangeNotices(listener, serves, wakes, slice_s=0.2, listening=states.append)
    shop = PostgresChangeLog(PG_DSN, "shop", schema=pg_schema)
    other = PostgresChangeLog(PG_DSN, "other", schema=pg_schema)
    try:
        notices.start()
        assert wakes.next(10.0), "connecting wakes once: anything may have been missed before"
        other.append([Delete(id="o")])
        assert not wakes.next(1.0), "an index not served here"
        shop.append([Delete(id="s")])
        assert wakes.next(10.0)
        assert notices.wakeups == wakes.count == 2
        assert states and all(states) and notices.problem is None  # what /metrics and /readyz read
        started = time.monotonic()
        assert notices.stop()
        assert time.monotonic() - started < 5.0 and not notices.running
        assert listener.backend_pid is None, "the thread closed its connection as it ended"
    finally:
        notices.stop()
        shop.close()
        other.close()


def test_a_server_that_does_not_answer_wakes_nothing_and_stops() -> None:
    wakes = Wakes()
    states: list[bool] = []
    listener = ChangeListener("postgresql://postgres@127.0.0.1:1/test", "ccrk_live_changes")
    notices = ChangeNotices(listener, lambda name: True, wakes, slice_s=0.2, listening=states.append)
    notices.start()
    try:
        assert not wakes.next(1.0)
        assert notices.running and listener.problem and notices.problem == listener.problem
        assert states and not any(states)  # ccrk_live_notices_listening 0, /readyz change_notices says why
    finally:
        assert notices.stop()
    assert wakes.count == 0
