"""The change log on both backends (SQLite file, real PostgreSQL): exact round trips, order and bounded
pages, all-or-nothing batches, the fold and truncate marks, damaged records, and processes that append
at once or are killed while appending."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import struct
import threading
import time
from pathlib import Path

import pytest

from store.errors import ChangeLogCorruptError, ChangeLogError, ChangeLogUnavailableError, InvalidChangeError
from store.live import MAX_PAGE, ChangeLog, Delete, Patch, PhotoRef, SqliteChangeLog, Upsert
from store.live.changelog import changelog_path, record_crc
from tests.store.live.logs import MakeLog, damage

DIGEST = "00112233445566778899aabbccddeeff"


def product(i: int) -> Upsert:
    return Upsert(
        id=f"p{i}",
        fields={"price": i + 0.5, "in_stock": i % 2 == 0, "tags": ["a", str(i)]},
        text={"title": f"Produkt {i} – ürün"},
        photos=(PhotoRef(DIGEST, f"photos/{i}.jpg"),),
    )


def test_a_batch_reads_back_exactly_with_increasing_sequences(log: ChangeLog) -> None:
    assert (log.last_sequence(), log.folded_sequence(), log.pending(), log.changes_since(0)) == (0, 0, 0, [])
    batch = [product(1), Patch(id="p1", fields={"price": 0.99}, text={"title": "neu"}), Delete(id="p1")]
    before = time.time()
    assert log.append(batch) == [1, 2, 3]
    assert log.append([product(2)]) == [4]
    assert log.append([]) == []
    entries = log.changes_since(0)
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert [e.change for e in entries] == [*batch, product(2)]
    assert all(before - 1 <= e.committed_at <= time.time() + 1 for e in entries)
    assert entries[0].committed_at <= entries[3].committed_at
    assert (log.last_sequence(), log.pending(), log.pending(after=3)) == (4, 4, 1)


def test_pages_are_bounded_ordered_and_cover_every_entry(log: ChangeLog) -> None:
    for start in range(0, 250, 50):
        log.append([product(i) for i in range(start, start + 50)])
    page = log.changes_since(100, limit=30)
    assert [e.seq for e in page] == list(range(101, 131))
    assert [e.seq for e in log.changes_since(0, limit=5, upto=3)] == [1, 2, 3]
    assert [e.change.id for e in log.iter_changes(0, page=7)] == [f"p{i}" for i in range(250)]
    assert [e.seq for e in log.iter_changes(240)] == list(range(241, 251))
    for bad in (0, MAX_PAGE + 1):
        with pytest.raises(ValueError, match="limit"):
            log.changes_since(0, limit=bad)
    with pytest.raises(ValueError, match="sequence"):
        log.changes_since(-1)


def test_a_batch_with_one_bad_change_writes_nothing(log: ChangeLog) -> None:
    log.append([product(0)])
    with pytest.raises(InvalidChangeError, match="change 2") as caught:
        log.append([product(1), product(2), Upsert(id="p3", fields={"price": float("nan")}), product(4)])
    assert caught.value.field == "fields.price"
    assert (log.last_sequence(), [e.seq for e in log.changes_since(0)]) == (1, [1])


def test_a_batch_that_fails_inside_its_transaction_leaves_nothing_and_no_gap(
    log: ChangeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are inserted, then the transaction fails before its commit: none of them stays, and the
    next batch takes the very numbers the failed one had."""
    log.append([product(0)])
    real_insert = log._insert  # type: ignore[attr-defined]

    def insert_then_fail(conn: object, rows: list[object]) -> None:
        real_insert(conn, rows)
        raise OSError("disk full, say")

    monkeypatch.setattr(log, "_insert", insert_then_fail)
    with pytest.raises(OSError, match="disk full"):
        log.append([product(i) for i in range(1, 6)])
    monkeypatch.undo()
    assert log.last_sequence() == 1 and log.pending() == 1
    assert log.append([product(9)]) == [2]
    assert [e.change.id for e in log.changes_since(0)] == ["p0", "p9"]


def test_fold_marks_and_truncate_drops_exactly_up_to_the_sequence(log: ChangeLog, make_log: MakeLog) -> None:
    log.append([product(i) for i in range(10)])
    recorded = log.last_sequence()  # what a build records when it starts reading the log
    log.append([Patch(id="p3", fields={"price": 7}), Delete(id="p4")])  # written while the build runs
    with pytest.raises(ChangeLogError, match="only those up to 0 are folded"):
        log.truncate_upto(5)  # nothing is in a version yet
    with pytest.raises(ChangeLogError, match="last sequence committed is 12"):
        log.fold_upto(13)
    assert log.fold_upto(recorded) == 10
    assert (log.folded_sequence(), log.pending(), log.pending(after=0)) == (10, 2, 12)
    assert log.fold_upto(4) == 10, "the mark never moves back"
    assert log.truncate_upto(6) == 6
    assert [e.seq for e in log.changes_since(0)] == [7, 8, 9, 10, 11, 12]
    assert log.truncate_upto(recorded) == 4 and log.truncate_upto(recorded) == 0
    left = log.changes_since(0)
    expected = [(11, Patch(id="p3", fields={"price": 7})), (12, Delete(id="p4"))]
    assert [(e.seq, e.change) for e in left] == expected
    # Numbers are never reused, and another process sees the same marks.
    assert log.append([product(99)]) == [13]
    other = make_log()
    assert (other.last_sequence(), other.folded_sequence(), other.pending()) == (13, 10, 3)


def test_a_log_reopened_holds_everything(make_log: MakeLog) -> None:
    first = make_log()
    first.append([product(i) for i in range(20)])
    first.fold_upto(5)
    first.close()
    again = make_log()
    assert [e.change for e in again.changes_since(0)] == [product(i) for i in range(20)]
    assert (again.last_sequence(), again.folded_sequence()) == (20, 5)


@pytest.mark.parametrize(
    ("record", "crc", "why"),
    [
        ("{not json", None, "not JSON"),
        ('{"format":1,"kind":"teleport","id":"p1"}', None, "unknown kind"),
        (None, None, "checksum differs"),  # valid JSON, one digit changed in place, its checksum not
    ],
)
def test_a_damaged_record_is_a_typed_error_naming_its_sequence(
    log: ChangeLog, record: str | None, crc: int | None, why: str
) -> None:
    log.append([product(i) for i in range(3)])
    if record is None:
        from store.live import encode_change

        good = encode_change(product(1))
        crc, record = record_crc(good), good.replace('"price":1.5', '"price":9.5')
    damage(log, 2, record, crc)
    assert [e.seq for e in log.changes_since(0, limit=1)] == [1]
    with pytest.raises(ChangeLogCorruptError, match=f"record 2 is damaged: {why}"):
        log.changes_since(0)
    assert [e.seq for e in log.changes_since(2)] == [3], "the entries after it still read"


# -- processes ---------------------------------------------------------------------------------------------

FORK = multiprocessing.get_context("fork")  # the child opens its own connection (ChangeLog checks the pid)


def _append_many(
    log: ChangeLog, worker: int, count: int, start: threading.Barrier, out: multiprocessing.SimpleQueue
) -> None:
    log.last_sequence()  # connected before the start, so that both begin appending at once
    start.wait(timeout=30)
    rng = random.Random(worker)
    seqs: list[int] = []
    done = 0
    while done < count:
        size = min(rng.randint(1, 5), count - done)
        seqs += log.append([Patch(id=f"w{worker}-{done + i}", fields={"n": done + i}) for i in range(size)])
        done += size
        # Writes arrive with gaps (requests): back to back, SQLite's busy wait (a sleep, retried) can leave
        # the lock to the writer that holds it for a whole run of appends, and the two would not interleave.
        time.sleep(0.001)
    out.put((worker, seqs))


def test_two_processes_appending_at_once_get_distinct_increasing_sequences(log: ChangeLog) -> None:
    count = 150
    out = FORK.SimpleQueue()
    start = FORK.Barrier(2)
    workers = [FORK.Process(target=_append_many, args=(log, w, count, start, out)) for w in range(2)]
    for p in workers:
        p.start()
    results = dict(out.get() for _ in workers)
    for p in workers:
        p.join(timeout=30)
        assert p.exitcode == 0
    a, b = results[0], results[1]
    assert a == sorted(a) and b == sorted(b) and not set(a) & set(b)
    assert sorted(a + b) == list(range(1, 2 * count + 1)), "no gap, no number twice"
    assert min(a) < max(b) and min(b) < max(a), "the two interleaved (else this tested little)"
    read = {e.seq: e.change for e in log.iter_changes(0)}
    for worker, seqs in results.items():
        assert [read[s] for s in seqs] == [Patch(id=f"w{worker}-{i}", fields={"n": i}) for i in range(count)]


def _append_and_acknowledge(log: ChangeLog, count: int, fd: int) -> None:
    for i in range(count):
        (seq,) = log.append([Patch(id=f"ack-{i}", fields={"i": i})])
        os.write(fd, struct.pack("<q", seq))  # 8 bytes: one atomic pipe write
    os.close(fd)


def test_every_acknowledged_append_survives_sigkill_of_the_writer(make_log: MakeLog) -> None:
    """A child appends one change at a time and reports each sequence once ``append`` returned; it is
    killed with SIGKILL at a random moment. Every reported sequence is then in the log, with its change.
    (This kills the process, not the machine: the commit's fsync is what ``synchronous=FULL`` adds.)"""
    log = make_log()
    rng = random.Random(46)
    acknowledged: list[int] = []
    for _round in range(3):
        read_fd, write_fd = os.pipe()
        child = FORK.Process(target=_append_and_acknowledge, args=(log, 500, write_fd))
        child.start()
        os.close(write_fd)
        kill_after = rng.randint(20, 400)
        got = b""
        deadline = time.monotonic() + 30
        while len(got) < 8 * kill_after and time.monotonic() < deadline:
            chunk = os.read(read_fd, 8 * kill_after - len(got))
            if not chunk:
                break
            got += chunk
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=10)
        while chunk := os.read(read_fd, 4096):  # what it acknowledged before the kill landed
            got += chunk
        os.close(read_fd)
        assert child.exitcode == -signal.SIGKILL and len(got) >= 8 * kill_after
        acknowledged += [s for (s,) in struct.iter_unpack("<q", got[: len(got) // 8 * 8])]
    reopened = make_log()
    present = {e.seq: e.change for e in reopened.iter_changes(0)}  # every record still reads
    assert acknowledged == sorted(acknowledged)
    missing = [s for s in acknowledged if s not in present]
    assert not missing, f"{len(missing)} acknowledged appends lost"
    assert all(isinstance(present[s], Patch) for s in acknowledged)


# -- SQLite only -------------------------------------------------------------------------------------------


def test_the_sqlite_log_lives_in_the_index_folder_in_wal_mode_synced_at_commit(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    log = SqliteChangeLog.for_index(tmp_path, "shop")
    assert log.path == changelog_path(tmp_path, "shop") == tmp_path / "shop" / "changes.sqlite"
    log.append([product(1)])
    opened = log._conns.current  # the log's own connection, as it was configured
    assert opened is not None
    assert opened.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with sqlite3.connect(log.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    log.close()


def _open_and_append(path: Path, worker: int) -> None:
    SqliteChangeLog(path, busy_timeout_s=10.0).append([Delete(id=f"opener-{worker}")])


def test_processes_opening_a_new_log_at_once_all_append(tmp_path: Path) -> None:
    """The first opening creates the file, sets WAL mode and the tables: racing openers wait their turn."""
    path = tmp_path / "changes.sqlite"
    openers = [FORK.Process(target=_open_and_append, args=(path, w)) for w in range(4)]
    for p in openers:
        p.start()
    for p in openers:
        p.join(timeout=30)
    assert [p.exitcode for p in openers] == [0, 0, 0, 0]
    log = SqliteChangeLog(path)
    assert sorted(e.change.id for e in log.changes_since(0)) == [f"opener-{w}" for w in range(4)]
    assert log.last_sequence() == 4
    log.close()


def test_a_writer_held_up_past_the_busy_timeout_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    log = SqliteChangeLog(tmp_path / "changes.sqlite", busy_timeout_s=0.2)
    log.append([product(0)])
    holder = sqlite3.connect(log.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, stuck
    started = time.monotonic()
    with pytest.raises(ChangeLogUnavailableError, match="locked"):
        log.append([product(1)])
    assert time.monotonic() - started < 5
    assert [e.seq for e in log.changes_since(0)] == [1], "readers still read while a writer holds the lock"
    holder.execute("ROLLBACK")
    assert log.append([product(1)]) == [2]
    holder.close()
    log.close()


def test_a_file_that_is_not_a_log_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "changes.sqlite"
    path.write_bytes(b"this is no database, " * 100)
    with pytest.raises(ChangeLogCorruptError, match="not a database"):
        SqliteChangeLog(path)


def test_a_log_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "changes.sqlite"
    SqliteChangeLog(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 2")
    with pytest.raises(ChangeLogError, match="schema 2, newer"):
        SqliteChangeLog(path)
