"""``LiveFeed`` over a real version and a real log on both backends: a version attached applies the whole
log before it serves; two feeds (two processes' stand-ins) see each other's writes; a damaged log stops
the catch-up with the reason while searches keep the overlay already applied, as a version older than the
log (its next changes dropped) does; a reader creates no log file in an index nothing was written to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.index_holder import Served
from service.live.feed import LiveFeed
from store.live import Delete, Patch, changelog_path
from store.live.view import LiveIndex
from store.opening import open_version
from tests.store.live.logs import PG_DSN, damage
from tests.store.writing import write_version


@pytest.fixture(params=["sqlite", "postgres"])
def dsn(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    try:
        psycopg.connect(PG_DSN, connect_timeout=2).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL does not answer at {PG_DSN}: {exc}")
    yield PG_DSN


def served(root: Path) -> Served:
    return Served(open_version(root, "shop"))


def test_feeds_apply_each_others_writes_and_a_late_version_catches_up(
    tmp_path: Path, dsn: str | None
) -> None:
    write_version(tmp_path, "shop", n=50)
    name = f"shop-{tmp_path.name}"[-60:] if dsn else "shop"  # PostgreSQL: one log per test
    one, two = LiveFeed(tmp_path, name, dsn), LiveFeed(tmp_path, name, dsn)
    a, b = served(tmp_path), served(tmp_path)
    try:
        one.attach(a)
        two.attach(b)
        assert isinstance(a.index, LiveIndex) and a.index.live_sequence == 0
        assert a.items([5])[0]["price"] == 5.0  # read into the row cache before the write
        seq = one.write([Patch("sku-5", fields={"price": 0.5})])[0]
        # Applied here at once, but not visible everywhere: the other feed (on the board since its
        # attach) has not polled yet, so the wait runs out.
        assert not one.wait_for(a, seq, 0.2) and a.items([5])[0]["price"] == 0.5
        assert one.behind(seq) == {two.reader: 0}
        assert b.items([5])[0]["price"] == 5.0  # not polled yet
        two.catch_up(b)
        assert b.items([5])[0]["price"] == 0.5 and b.index.live_sequence == seq
        assert one.behind(seq) == {} and one.wait_for(a, seq, 1.0)  # now shown by both
        two.write([Delete("sku-6")])
        one.catch_up(a)
        assert a.index.row_of("sku-6") is None and len(a.index) == 49
        late = served(tmp_path)  # a version loaded later applies the whole log before it serves
        one.attach(late)
        assert late.index.row_of("sku-6") is None and late.items([5])[0]["price"] == 0.5
        assert one.pending() == 2
        late.index.close()
    finally:
        for feed in (one, two):
            feed.close()
        for s in (a, b):
            s.index.close()
        if dsn:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM ccrk_live.changes WHERE index_name = %s", (name,))
                conn.execute("DELETE FROM ccrk_live.log_state WHERE index_name = %s", (name,))
                conn.execute("DELETE FROM ccrk_live.readers WHERE index_name = %s", (name,))


def test_a_damaged_log_stops_the_catch_up_and_keeps_what_was_applied(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", n=20)
    feed, reader = LiveFeed(tmp_path, "shop"), LiveFeed(tmp_path, "shop")
    a = served(tmp_path)
    feed.attach(a)
    first = feed.write([Patch("sku-1", fields={"price": 1.5})])[0]
    feed.catch_up(a)
    second = feed.write([Patch("sku-2", fields={"price": 2.5})])[0]
    damage(feed._opened(create=False), second, '{"not": "a change"}')  # type: ignore[arg-type]
    assert feed.catch_up(a) is None
    assert feed.problem is not None and f"record {second}" in feed.problem
    assert a.index.live_sequence == first and a.items([1])[0]["price"] == 1.5  # still served as applied
    reader.close()
    feed.close()
    a.index.close()


def test_a_reader_creates_no_log(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", n=10)
    feed = LiveFeed(tmp_path, "shop")
    a = served(tmp_path)
    feed.attach(a)
    assert feed.catch_up(a) is None and feed.problem is None and feed.pending() == 0
    assert not changelog_path(tmp_path, "shop").exists()
    a.index.close()


def test_a_version_older_than_the_log_applies_nothing_past_the_gap(tmp_path: Path) -> None:
    """The entries right after what a version holds were folded and dropped (``truncate_upto``, as a fold
    does once every kept version holds them): applying the later ones would skip changes in silence, so
    the feed applies none and says why."""
    write_version(tmp_path, "shop", n=20)
    feed = LiveFeed(tmp_path, "shop")
    opened = feed._opened(create=True)
    assert opened is not None
    first = feed.write([Patch("sku-1", fields={"price": 1.5})])[0]
    feed.write([Patch("sku-2", fields={"price": 2.5})])
    opened.fold_upto(first)
    assert opened.truncate_upto(first) == 1
    old = served(tmp_path)  # holds sequence 0: change 1 is gone from the log
    feed.attach(old)
    assert old.index.live_sequence == 0 and old.items([2])[0]["price"] == 2.0
    assert feed.problem is not None and "no longer holds changes 1 to 1" in feed.problem
    feed.close()
    old.index.close()
