"""The index holder: the served version's metadata row cache (same answers as the format module's reader,
bounded, copied), version overrides against the poller, and sharded versions served like any other."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.errors import IndexUnavailableError, ReloadFailedError, ReloadOutOfMemoryError
from service.index_holder import MEMORY_RETRY_MAX_S, MEMORY_RETRY_S, IndexHolder, Served, memory_retry_delay
from store.errors import IndexFormatError, IndexUnreachableError
from store.layout import CURRENT_FILE, EMBEDDINGS_FILE, MANIFEST_FILE, index_dir
from store.shards.sharded import ShardedIndex
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.versions import publish_version
from tests.fixtures import INDEX_NAME, Catalogue, write_version
from tests.store.writing import grid_vectors, write_rows

# A CUDA error that may pass and is not about memory (``model.runtime.is_out_of_memory``).
CUDA_FAILURE = "CUDA error: unspecified launch failure"


def waiting_holder(root: Path, now: list[float], **options: Any) -> IndexHolder:
    """A holder of INDEX_NAME under ``root`` that gives up after 300 s of the fake clock ``now[0]``."""
    return IndexHolder(
        root, INDEX_NAME, expect_fingerprint=None, give_up_after_s=300.0, clock=lambda: now[0], **options
    )


def test_item_cache_answers_like_sqlite_and_stays_bounded(
    index_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = IndexVersion.open(index_root, INDEX_NAME)
    try:
        sqlite = index.items  # the reference answers, read past the recording below
        reads: list[list[int]] = []  # every batch of rows the cache had to read from SQLite

        def recording(rows: list[int]) -> list[dict[str, object]]:
            reads.append(list(rows))
            return sqlite(rows)

        monkeypatch.setattr(index, "items", recording)
        served = Served(index, item_cache_rows=5)
        rows = [3, 0, 7, 3, 1]
        assert served.items(rows) == sqlite(rows)
        assert reads == [[3, 0, 7, 1]]  # a repeated row is read once
        assert served.items(rows) == sqlite(rows)
        assert reads == [[3, 0, 7, 1]]  # a hit: nothing read again (equal answers alone would not show it)
        assert len(served._items) == 4

        first = served.items([3])[0]
        first.pop("id")  # a caller changing its copy (the search route pops id and path)
        assert served.items([3])[0]["id"] == sqlite([3])[0]["id"]
        assert len(reads) == 1

        wide = list(range(10, 22))
        assert served.items(wide) == sqlite(wide)  # more rows than the cache holds: still all right
        assert reads[1:] == [wide]
        assert len(served._items) == 12  # the older rows made room; one batch may overshoot the bound
        served.items([0, 1])
        assert reads[2:] == [[0, 1]]  # evicted by the wide batch: read again
        assert list(served._items) == [19, 20, 21, 0, 1] and served.items([2, 1]) == sqlite([2, 1])
        assert reads[3:] == [[2]]  # 1 is a hit, 2 is not

        with pytest.raises(IndexFormatError):
            served.items([0, 10**6])
    finally:
        index.close()


def test_a_version_override_lasts_until_current_changes(tmp_path: Path, catalogue: Catalogue) -> None:
    """An explicit version (admin rollback) is not undone by the poller while CURRENT stays the same; a new
    publish is followed again."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    second = write_version(tmp_path, catalogue, rows=list(range(30)))
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    try:
        assert holder.reload() is not None and holder.served.version == second
        assert holder.reload(first) is not None and holder.served.version == first
        assert holder.check() is False and holder.served.version == first  # CURRENT is still `second`
        third = write_version(tmp_path, catalogue, rows=list(range(40)))
        assert holder.check() is True and holder.served.version == third
        assert holder.reload(first) is not None
        assert holder.reload() is not None and holder.served.version == third  # CURRENT, asked for
        assert holder.check() is False and holder.served.version == third
    finally:
        holder.close()


def test_a_sharded_version_swaps_in_and_out(tmp_path: Path) -> None:
    """CURRENT naming a sharded version is opened over its shards (``store.opening.open_version``) and served
    like any version; the leased one is closed only when returned."""
    embeds = grid_vectors(40, 16, np.random.default_rng(0))
    ids = [f"sku-{i}" for i in range(40)]
    plain = write_rows(tmp_path, INDEX_NAME, embeds, ids)
    sharded = write_rows(tmp_path, INDEX_NAME, embeds, ids, shard_count=3)
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    try:
        assert holder.reload(plain) is not None and isinstance(holder.served.index, IndexVersion)
        with holder.lease() as old:
            assert holder.reload() is not None and holder.served.version == sharded
            assert isinstance(holder.served.index, ShardedIndex) and len(holder.served.index) == 40
            assert old.retired and len(old.index) == 40  # still open while leased
        served = holder.served
        rows = [served.index.row_of(i) for i in ids[:5]]
        assert [item["id"] for item in served.items(rows)] == ids[:5]
        _, found = served.index.search(embeds[:5], 1)
        assert found[:, 0].tolist() == rows
    finally:
        holder.close()


def test_the_last_lease_of_a_retired_version_closes_it_on_another_thread(tmp_path: Path) -> None:
    """Returning the last lease does not wait for the retired version to close (it may be returned on the
    event loop): the close runs on a thread of its own, once."""
    import threading
    import time

    embeds = grid_vectors(20, 8, np.random.default_rng(1))
    first = write_rows(tmp_path, INDEX_NAME, embeds, [f"a-{i}" for i in range(20)])
    second = write_rows(tmp_path, INDEX_NAME, embeds, [f"b-{i}" for i in range(20)])
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    closed: list[str] = []
    done = threading.Event()
    try:
        assert holder.reload(first) is not None
        with holder.lease() as old:
            real_close = old.index.close

            def slow_close() -> None:
                time.sleep(0.5)
                closed.append(threading.current_thread().name)
                real_close()
                done.set()

            old.index.close = slow_close  # type: ignore[method-assign]
            assert holder.reload(second) is not None and old.retired and not closed
            started = time.perf_counter()
        assert time.perf_counter() - started < 0.3  # the lease returned without waiting for the close
        assert done.wait(10) and closed == ["ccrk-close-retired"]
    finally:
        holder.close()


def test_shards_out_of_reach_count_as_given_up_after_give_up_after_s(tmp_path: Path) -> None:
    """A version whose shards stay out of reach keeps the holder loading (tried again at each poll) until a
    try fails ``give_up_after_s`` after the first failing one began, then counts as given up (``loading``
    False), however few tries that took (each open here waits out a 120 s timeout); the poller still tries
    it, and serves it once the shards answer. Without a bound it loads for good."""
    embeds = grid_vectors(20, 8, np.random.default_rng(2))
    version = write_rows(tmp_path, INDEX_NAME, embeds, [f"u-{i}" for i in range(20)])
    reachable = False
    now = [50.0]

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        if not reachable:
            now[0] += 120.0  # the open's timeout
            raise IndexUnreachableError("shard deployments still starting")
        return IndexVersion.open(root, name, version)

    def clock() -> float:
        return now[0]

    holder = waiting_holder(tmp_path, now, opener=opener)
    unbounded = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, opener=opener, clock=clock)
    try:
        with pytest.raises(ReloadFailedError, match="still starting"):
            holder.reload()  # began at 0 s (on the clock: 50), failed at 120 s
        assert holder.loading
        now[0] += 30.0
        assert holder.check() is False and holder.loading  # 150 s to 270 s
        now[0] += 29.0
        assert holder.check() is False and not holder.loading  # 299 s to 419 s: given up
        for _ in range(5):
            assert unbounded.check() is False
        assert unbounded.loading
        reachable = True
        assert holder.check() is True and holder.served is not None and holder.served.version == version
        assert not holder.loading
    finally:
        holder.close()
        unbounded.close()


def test_a_holder_waiting_on_shards_gives_up_when_current_disappears(tmp_path: Path) -> None:
    """A holder that serves nothing, its last try having found the shards out of reach, stops loading once
    CURRENT is gone (nothing published: nothing to wait for, as ``reload`` finds), and loads again at the
    next publish."""
    embeds = grid_vectors(20, 8, np.random.default_rng(3))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"c-{i}" for i in range(20)])

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        raise IndexUnreachableError("shard deployments still starting")

    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, opener=opener)
    try:
        with pytest.raises(ReloadFailedError):
            holder.reload()
        assert holder.loading
        current = index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE
        saved = current.read_bytes()
        current.unlink()
        assert holder.check() is False and not holder.loading
        current.write_bytes(saved)
        assert holder.check() is False and holder.loading  # published again, shards still out of reach
    finally:
        holder.close()


def test_a_new_publish_waits_afresh_for_its_shards(tmp_path: Path) -> None:
    """After the holder gave up on a version whose shards stayed out of reach, a new publish (its shards
    still starting) is waited for again for ``give_up_after_s``, not given up at its first try."""
    embeds = grid_vectors(20, 8, np.random.default_rng(4))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"n-{i}" for i in range(20)])
    now = [0.0]

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        now[0] += 120.0  # the open's timeout
        raise IndexUnreachableError("shard deployments still starting")

    holder = waiting_holder(tmp_path, now, opener=opener)
    try:
        with pytest.raises(ReloadFailedError):
            holder.reload()
        for _ in range(2):
            now[0] += 30.0
            assert holder.check() is False
        assert not holder.loading  # the first version: given up
        write_rows(tmp_path, INDEX_NAME, embeds, [f"m-{i}" for i in range(20)])
        now[0] += 30.0
        assert holder.check() is False and holder.loading  # the new one's first try: waiting
        now[0] += 30.0
        assert holder.check() is False and holder.loading
        now[0] += 30.0
        assert holder.check() is False and not holder.loading  # its own wait is over
    finally:
        holder.close()


def test_a_failed_read_of_current_does_not_count_as_none_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CURRENT that cannot be read (an I/O error) leaves a holder waiting on its shards loading, at a poll
    and at a reload alike (read again next time); only a missing CURRENT gives up."""
    import errno

    from service import index_holder as holder_module

    embeds = grid_vectors(20, 8, np.random.default_rng(5))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"r-{i}" for i in range(20)])
    real = holder_module.current_version
    failing = [False]

    def current_version(root: Path, name: str) -> str | None:
        if failing[0]:
            raise OSError(errno.EIO, "Input/output error", "CURRENT")
        return real(root, name)

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        raise IndexUnreachableError("shard deployments still starting")

    monkeypatch.setattr(holder_module, "current_version", current_version)
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, opener=opener)
    try:
        failing[0] = True
        with pytest.raises(ReloadFailedError, match="cannot read CURRENT"):
            holder.reload()  # the start's try
        assert holder.loading and "Input/output error" in (holder.last_error or "")
        failing[0] = False
        with pytest.raises(ReloadFailedError, match="still starting"):
            holder.reload()
        failing[0] = True
        assert holder.check() is False and holder.loading
        failing[0] = False
        (index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE).unlink()
        assert holder.check() is False and not holder.loading  # missing: none published
    finally:
        holder.close()


def test_a_current_that_stays_unreadable_gives_up_after_give_up_after_s(tmp_path: Path) -> None:
    """CURRENT that cannot be read (a folder here: EISDIR) keeps a holder serving nothing loading only for
    ``give_up_after_s`` from the first failed read (then ``loading`` False, so /readyz and Ray's health
    check stop waiting on it); ``last_error`` names the read failure at a poll as at a reload, a failed
    reload counts as one, and a read that succeeds ends the wait (the next failure waits afresh)."""
    embeds = grid_vectors(20, 8, np.random.default_rng(6))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"e-{i}" for i in range(20)])
    current = index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE
    saved = current.read_bytes()
    now = [0.0]
    failures: list[str] = []

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        raise IndexUnreachableError("shard deployments still starting")

    def unreadable() -> None:
        current.unlink()
        current.mkdir()

    def readable() -> None:
        current.rmdir()
        current.write_bytes(saved)

    holder = waiting_holder(tmp_path, now, opener=opener, on_failure=failures.append)
    try:
        with pytest.raises(ReloadFailedError, match="still starting"):
            holder.reload()
        failures.clear()
        unreadable()
        now[0] = 10.0
        assert holder.check() is False and holder.loading
        assert "cannot read CURRENT" in (holder.last_error or "")  # not the old reason
        now[0] = 200.0
        with pytest.raises(ReloadFailedError, match="cannot read CURRENT"):
            holder.reload()
        assert holder.loading and len(failures) == 1 and "cannot read CURRENT" in failures[0]
        now[0] = 310.0
        assert holder.check() is False and not holder.loading  # 300 s since the first failed read
        readable()
        write_rows(tmp_path, INDEX_NAME, embeds, [f"f-{i}" for i in range(20)])  # a wait of its own
        saved = current.read_bytes()
        now[0] = 320.0
        assert holder.check() is False and holder.loading and "still starting" in (holder.last_error or "")
        unreadable()
        now[0] = 330.0
        assert holder.check() is False and holder.loading  # a fresh wait
        now[0] = 629.0
        assert holder.check() is False and holder.loading
        now[0] = 630.0
        assert holder.check() is False and not holder.loading
    finally:
        holder.close()


@pytest.mark.parametrize("by", ["check", "reload"])
def test_the_same_version_published_again_waits_afresh_for_its_shards(tmp_path: Path, by: str) -> None:
    """A holder whose version's shards were out of reach, then found none published (CURRENT gone, seen by
    a poll or a reload), waits ``give_up_after_s`` afresh when the same version is published again later,
    not given up at its first try."""
    embeds = grid_vectors(20, 8, np.random.default_rng(7))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"g-{i}" for i in range(20)])
    current = index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE
    saved = current.read_bytes()
    now = [0.0]

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        raise IndexUnreachableError("shard deployments still starting")

    holder = waiting_holder(tmp_path, now, opener=opener)
    try:
        with pytest.raises(ReloadFailedError):
            holder.reload()  # the wait begins at 0 s
        current.unlink()
        now[0] = 100.0
        if by == "check":
            assert holder.check() is False
        else:
            with pytest.raises(ReloadFailedError, match="no published version"):
                holder.reload()
        assert not holder.loading
        current.write_bytes(saved)  # the same version again, long after
        now[0] = 1000.0
        assert holder.check() is False and holder.loading
        now[0] = 1299.0
        assert holder.check() is False and holder.loading
        now[0] = 1300.0
        assert holder.check() is False and not holder.loading
    finally:
        holder.close()


def test_a_current_that_is_not_utf8_counts_as_unreadable(tmp_path: Path) -> None:
    """A binary CURRENT is an unreadable one (a clear ReloadFailedError, the poll answering False, loading
    until ``give_up_after_s``), not a UnicodeDecodeError out of ``reload``."""
    embeds = grid_vectors(20, 8, np.random.default_rng(8))
    write_rows(tmp_path, INDEX_NAME, embeds, [f"b-{i}" for i in range(20)])
    (index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE).write_bytes(b"\xff\xfe\x00garbage")
    now = [0.0]
    holder = waiting_holder(tmp_path, now)
    try:
        with pytest.raises(ReloadFailedError, match=r"cannot read CURRENT.*not UTF-8"):
            holder.reload()
        assert holder.loading and holder.served is None
        now[0] = 300.0
        assert holder.check() is False and not holder.loading
        assert "not UTF-8" in (holder.last_error or "")
    finally:
        holder.close()


def test_a_version_whose_load_fails_is_refused_like_one_that_cannot_be_opened(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """A failing ``on_load`` (the runtime calibrating the version's match labels) refuses the version as a
    broken one: a ReloadFailedError naming it (the admin route's 409, not a 500), the old version still
    served, the failure recorded (``last_error``, ``on_failure``; not tried again at every poll), the index
    opened for it closed. A new publish is loaded again."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    closed: list[str] = []

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        index = IndexVersion.open(root, name, version)
        real_close = index.close

        def close() -> None:
            closed.append(index.manifest.version)
            real_close()

        index.close = close  # type: ignore[method-assign]
        return index

    broken: set[str] = set()
    loads: list[str] = []

    def on_load(served: Served) -> None:
        loads.append(served.version)
        if served.version in broken:
            raise KeyError("default")  # as MatchCalibration.from_dict on a malformed calibration did

    failures: list[str] = []
    holder = IndexHolder(
        tmp_path,
        INDEX_NAME,
        expect_fingerprint=None,
        opener=opener,
        on_load=on_load,
        on_failure=failures.append,
    )
    try:
        assert holder.reload() is not None and holder.served.version == first
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        broken.add(second)
        with pytest.raises(ReloadFailedError, match=second):
            holder.reload()
        assert holder.served.version == first and closed == [second]
        assert second in (holder.last_error or "") and len(failures) == 1 and second in failures[0]
        assert holder.check() is False and loads == [first, second]  # not loaded again at each poll
        third = write_version(tmp_path, catalogue, rows=list(range(40)))
        assert holder.check() is True and holder.served.version == third and holder.last_error is None
    finally:
        holder.close()


class _SignallingLock:
    """A lock that sets ``second`` when a second ``with`` begins to wait for it."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.entered = 0
        self.second = threading.Event()

    def __enter__(self) -> None:
        self.entered += 1
        if self.entered == 2:
            self.second.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_poll_during_an_admin_rollback_does_not_undo_it(tmp_path: Path, catalogue: Catalogue) -> None:
    """A poll while an admin rollback loads decides once the rollback is done (under the load lock): it
    finds the override and leaves it. Deciding before the lock, it loaded the CURRENT the rollback was
    made over as soon as the rollback finished."""
    import threading

    zero = write_version(tmp_path, catalogue, rows=list(range(10)))
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    opening, go = threading.Event(), threading.Event()

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        if version == zero:
            opening.set()
            assert go.wait(10)
        return IndexVersion.open(root, name, version)

    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, opener=opener)
    lock = holder._load_lock = _SignallingLock()  # type: ignore[assignment]
    polled: list[bool] = []
    try:
        assert holder.reload() is not None and holder.served.version == first
        lock.entered = 0
        write_version(tmp_path, catalogue, rows=list(range(30)))  # CURRENT: a new publish, not polled yet
        rollback = threading.Thread(target=holder.reload, args=(zero,))
        rollback.start()
        assert opening.wait(10)
        poll = threading.Thread(target=lambda: polled.append(holder.check()))
        poll.start()
        assert lock.second.wait(10)  # the poll waits for the load lock
        go.set()
        rollback.join(10)
        poll.join(10)
        assert polled == [False] and holder.served.version == zero
        assert holder.check() is False and holder.served.version == zero  # CURRENT is still the new one
    finally:
        go.set()
        holder.close()


def test_a_rollback_while_current_cannot_be_read_is_kept(tmp_path: Path, catalogue: Catalogue) -> None:
    """An admin rollback while CURRENT cannot be read overrides the CURRENT last read: the polls that read
    it again leave the rollback in place. CURRENT naming the served version again ends the override, so a
    later publish of the version it was made over is followed; so is a new publish."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    second = write_version(tmp_path, catalogue, rows=list(range(30)))
    current = index_dir(tmp_path, INDEX_NAME) / CURRENT_FILE
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    try:
        assert holder.reload() is not None and holder.served.version == second
        saved = current.read_bytes()
        current.unlink()
        current.mkdir()  # EISDIR
        assert holder.reload(first) is not None and holder.served.version == first
        current.rmdir()
        current.write_bytes(saved)
        assert holder.check() is False and holder.served.version == first  # CURRENT is still `second`
        publish_version(tmp_path, INDEX_NAME, first)  # `ccrk index rollback --to first`
        assert holder.check() is False and holder.served.version == first
        publish_version(tmp_path, INDEX_NAME, second)  # and back
        assert holder.check() is True and holder.served.version == second
        assert holder.reload(first) is not None
        third = write_version(tmp_path, catalogue, rows=list(range(40)))
        assert holder.check() is True and holder.served.version == third
    finally:
        holder.close()


def test_a_poll_serves_a_gate_refused_version_published_as_current(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """``ccrk index rollback --to V --force`` publishes a version the quality gate refused: a poll serves
    CURRENT as the start does (publishing it was the decision), where it refused it at every poll as an
    explicit version without ``force``."""
    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    refused = write_version(tmp_path, catalogue, rows=list(range(10)), publish=False)
    _refuse(tmp_path, refused)
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    try:
        assert holder.reload() is not None and holder.served.version == good
        publish_version(tmp_path, INDEX_NAME, refused)
        assert holder.check() is True and holder.served.version == refused
    finally:
        holder.close()


def _refuse(root: Path, version: str) -> None:
    """Record in ``version``'s manifest that the quality gate refused it."""
    manifest_path = index_dir(root, INDEX_NAME) / version / MANIFEST_FILE
    manifest = IndexManifest.load(manifest_path)
    manifest.build_params = {**manifest.build_params, "quality_gate": {"passed": False, "reasons": ["test"]}}
    manifest.save(manifest_path)


def _recording_on_load(loads: list[str], errors: list[Exception]) -> Callable[[Served], None]:
    """An ``on_load`` that records each version it is given and raises the next of ``errors`` while any."""

    def on_load(served: Served) -> None:
        loads.append(served.version)
        if errors:
            raise errors.pop(0)

    return on_load


def test_a_load_error_that_may_pass_is_tried_again_at_the_next_poll(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """An ``on_load`` failing on something other than the version's data (a MemoryError, a CUDA runtime
    error while the runtime calibrates match labels) is tried again at the next poll, as shards out
    of reach are: it refused the version for good, which held the index back (readiness 503) from the start
    until a new publish. With nothing served it gives up after ``give_up_after_s``; the poller still tries."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    errors: list[Exception] = [MemoryError()]
    loads: list[str] = []

    on_load = _recording_on_load(loads, errors)

    now = [0.0]
    holder = waiting_holder(tmp_path, now, on_load=on_load)
    try:
        with pytest.raises(ReloadOutOfMemoryError, match=first):  # the MemoryError: a 503 at the admin route
            holder.reload()  # the start's try
        assert holder.loading and holder.served is None
        now[0] = 10.0
        assert holder.check() is True and holder.served.version == first and loads == [first, first]
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        errors.append(RuntimeError(CUDA_FAILURE))
        assert holder.check() is False and holder.served.version == first
        assert holder.check() is True and holder.served.version == second
        errors.append(RuntimeError(CUDA_FAILURE))
        with pytest.raises(ReloadFailedError) as raised:
            holder.reload(first)  # an admin rollback: the same
        assert type(raised.value) is ReloadFailedError  # a CUDA failure not of memory: a 409
        assert holder.reload(first) is not None and holder.served.version == first
    finally:
        holder.close()

    errors.extend(RuntimeError(CUDA_FAILURE) for _ in range(2))
    stuck = waiting_holder(tmp_path, now, on_load=on_load)
    try:
        with pytest.raises(ReloadFailedError) as raised:
            stuck.reload()  # began at 10 s
        assert type(raised.value) is ReloadFailedError
        now[0] = 309.0
        assert stuck.check() is False and stuck.loading
        now[0] = 310.0
        assert stuck.check() is True and stuck.served.version == second  # the third try
    finally:
        stuck.close()


def test_a_load_error_that_may_pass_refuses_the_version_after_load_tries(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """A version whose load fails ``LOAD_TRIES`` times in a row on an error that may pass (an error of its
    own data outside the data errors: an IndexError) is refused until its next publish, as a broken one:
    else each poll reopened and recalibrated it (seconds of CPU on a serving replica), for good."""
    from service.index_holder import LOAD_TRIES

    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    loads: list[str] = []
    broken: set[str] = set()

    def on_load(served: Served) -> None:
        loads.append(served.version)
        if served.version in broken:
            raise IndexError("list index out of range")

    now = [0.0]
    holder = waiting_holder(tmp_path, now, on_load=on_load)
    try:
        assert holder.reload() is not None
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        broken.add(second)
        for _ in range(LOAD_TRIES + 2):
            assert holder.check() is False and holder.served.version == first
        assert loads.count(second) == LOAD_TRIES
        publish_version(tmp_path, INDEX_NAME, second)  # published again: tried afresh
        broken.discard(second)
        assert holder.check() is False  # the same name in CURRENT: still refused until another publish
        third = write_version(tmp_path, catalogue, rows=list(range(40)))
        assert holder.check() is True and holder.served.version == third
    finally:
        holder.close()


def test_running_out_of_memory_opening_a_version_may_pass(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MemoryError out of a version's open (faiss or np.load reading a large graph or array, a huge
    damaged file among them) is a ReloadOutOfMemoryError naming the version (the admin route's 503; it
    escaped as itself: a 500 there, and out of the start's try, which catches ReloadFailedError), the old
    version still served. Not surely the files' fault: tried again at every poll, however often it failed
    (``test_running_out_of_memory_never_refuses_a_version``)."""
    import faiss

    from service.index_holder import LOAD_TRIES

    short: set[str] = set()  # versions whose index read runs out of memory
    reads: list[str] = []
    real_read = faiss.read_index

    def read_index(path: str, *args: Any) -> Any:
        version = Path(path).parent.name
        reads.append(version)
        if version in short:
            raise MemoryError("std::bad_alloc")  # what faiss's bindings raise for a failed allocation
        return real_read(path, *args)

    monkeypatch.setattr(faiss, "read_index", read_index)
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    short.add(first)
    now = [0.0]
    holder = waiting_holder(tmp_path, now)
    try:
        with pytest.raises(ReloadOutOfMemoryError, match=f"{first}.*out of memory \\(std::bad_alloc\\)"):
            holder.reload()  # the start's try
        assert holder.loading and holder.served is None and first in (holder.last_error or "")
        short.clear()
        assert holder.check() is True and holder.served.version == first
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        short.add(second)
        for _ in range(LOAD_TRIES + 2):
            assert holder.check() is False and holder.served.version == first
        # With a version served, not reopened at every poll (one too large to hold beside it would take CPU
        # and memory from its searches): after MEMORY_RETRY_S.
        assert reads.count(second) == 1
        with pytest.raises(ReloadOutOfMemoryError, match=second):
            holder.reload()  # an admin may try it at any time
        short.clear()
        now[0] += 2 * MEMORY_RETRY_S - 1.0  # the admin's try was the second: a wait twice as long
        assert holder.check() is False and holder.served.version == first and reads.count(second) == 2
        now[0] += 1.0
        assert holder.check() is True and holder.served.version == second
    finally:
        holder.close()


def test_running_out_of_memory_never_refuses_a_version(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing served, a MemoryError, opening a version or in ``on_load``, does not count toward
    ``LOAD_TRIES``: it counted, the version was refused until its next publish after the third in a row, and
    the default index stayed unready (/readyz 503) for good while /healthz stayed ok, so nothing restarted
    the replica. Tried at every poll instead, however often, and served once memory allows. With a version
    served, tried again after a wait that doubles, never refused."""
    import faiss

    from service.index_holder import LOAD_TRIES

    short = [True]  # the index read runs out of memory
    real_read = faiss.read_index

    def read_index(path: str, *args: Any) -> Any:
        if short[0]:
            raise MemoryError("std::bad_alloc")
        return real_read(path, *args)

    monkeypatch.setattr(faiss, "read_index", read_index)
    errors: list[Exception] = []
    loads: list[str] = []

    on_load = _recording_on_load(loads, errors)

    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    now = [0.0]
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, on_load=on_load, clock=lambda: now[0])
    try:
        with pytest.raises(ReloadOutOfMemoryError, match=first):
            holder.reload()  # the start's try
        for _ in range(LOAD_TRIES + 2):  # the open runs out of memory at every poll
            now[0] += 5.0
            assert holder.check() is False and holder.served is None and holder.loading
        short[0] = False
        errors.extend(MemoryError() for _ in range(LOAD_TRIES + 2))  # then the calibration does
        for _ in range(LOAD_TRIES + 2):
            assert holder.check() is False and holder.served is None and holder.loading
        assert loads == [first] * (LOAD_TRIES + 2)
        assert holder.check() is True and holder.served.version == first and holder.last_error is None
        # A version served: a MemoryError is tried again after a wait that doubles (30, 60, 120 s), never
        # refused; it counted toward LOAD_TRIES, and a spike at three polls kept the old version served
        # until the next publish.
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        errors.extend(MemoryError() for _ in range(LOAD_TRIES))
        for wait in (MEMORY_RETRY_S, 2 * MEMORY_RETRY_S, 4 * MEMORY_RETRY_S):
            tried = loads.count(second)
            assert holder.check() is False and holder.served.version == first
            assert loads.count(second) == tried + 1
            now[0] += wait - 1.0
            assert holder.check() is False and loads.count(second) == tried + 1  # not yet
            now[0] += 1.0
        assert not errors and holder.check() is True and holder.served.version == second
        assert loads.count(second) == LOAD_TRIES + 1
    finally:
        holder.close()


def test_the_memory_retry_wait_doubles_to_its_cap_and_never_overflows() -> None:
    """30, 60, 120 ... s up to 15 minutes; the 1,025th try in a row (about ten days of 15-minute tries) is
    still 15 minutes: ``2 ** 1024`` raised OverflowError inside the holder's failure path."""
    assert [memory_retry_delay(n) for n in (1, 2, 3)] == [
        MEMORY_RETRY_S,
        2 * MEMORY_RETRY_S,
        4 * MEMORY_RETRY_S,
    ]
    assert (
        memory_retry_delay(6) == memory_retry_delay(1025) == memory_retry_delay(10**6) == MEMORY_RETRY_MAX_S
    )


def test_a_memory_wait_ends_when_current_moves_on(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version that ran out of memory beside the served one waits; CURRENT moved back to the served
    version and then the same version published again: tried at once, not after the old wait."""
    errors: list[Exception] = []
    loads: list[str] = []
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    now = [0.0]
    on_load = _recording_on_load(loads, errors)
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, on_load=on_load, clock=lambda: now[0])
    try:
        assert holder.reload().version == first
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        errors.append(MemoryError())
        assert holder.check() is False and loads.count(second) == 1  # waits MEMORY_RETRY_S from now
        publish_version(tmp_path, INDEX_NAME, first)
        assert holder.check() is False and holder.served.version == first
        publish_version(tmp_path, INDEX_NAME, second)
        assert holder.check() is True and holder.served.version == second and loads.count(second) == 2
    finally:
        holder.close()


def _gpu_out_of_memory(runtime: str) -> Exception:
    """What a GPU out of memory raises while the runtime encodes (the match calibration of ``on_load``)."""
    if runtime == "torch":
        torch = pytest.importorskip("torch")
        return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    ort_state = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state")
    return ort_state.RuntimeException(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul"
        " node. Status Message: bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t,"
        " bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for"
        " requested buffer of size 939524096"
    )


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_a_gpu_running_out_of_memory_is_handled_as_a_memory_error(
    tmp_path: Path, catalogue: Catalogue, runtime: str
) -> None:
    """torch's ``OutOfMemoryError`` and ONNX Runtime's CUDA allocation failures out of ``on_load`` are what
    a MemoryError is on the host: a ReloadOutOfMemoryError (the admin route's 503 with Retry-After), never
    counted toward ``LOAD_TRIES``, tried again after a wait with a version served. They were a version's
    failure (a 409), and with nothing served the third refused the version until its next publish: the index
    unready (/readyz 503) for good over a GPU that was briefly full."""
    from service.index_holder import LOAD_TRIES

    errors: list[Exception] = [_gpu_out_of_memory(runtime) for _ in range(LOAD_TRIES + 2)]
    loads: list[str] = []

    on_load = _recording_on_load(loads, errors)

    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    now = [0.0]
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, on_load=on_load, clock=lambda: now[0])
    try:
        with pytest.raises(ReloadOutOfMemoryError, match=f"{first}.*: out of memory \\("):
            holder.reload()  # the start's try
        for _ in range(LOAD_TRIES + 1):
            assert holder.check() is False and holder.served is None and holder.loading
        assert holder.check() is True and holder.served.version == first
        assert loads == [first] * (LOAD_TRIES + 3) and holder.last_error is None
        second = write_version(tmp_path, catalogue, rows=list(range(30)))
        errors.extend(_gpu_out_of_memory(runtime) for _ in range(LOAD_TRIES + 2))
        for _ in range(LOAD_TRIES + 2):
            assert holder.check() is False and holder.served.version == first
        assert loads.count(second) == 1  # with one served: tried again after MEMORY_RETRY_S, not at each poll
        now[0] += MEMORY_RETRY_S
        assert holder.check() is False and loads.count(second) == 2
        with pytest.raises(ReloadOutOfMemoryError, match=second):
            holder.reload()  # an admin may try it at any time: a 503 again
        errors.clear()
        assert holder.reload().version == second and holder.served.version == second
    finally:
        holder.close()


def test_an_admin_try_of_another_version_leaves_currents_wait_alone(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """An admin's reload of a version CURRENT does not name, failing on an error that may pass, records the
    error but not how CURRENT's version is waited for: CURRENT's refusal (a data error) stands, so the
    process does not turn unready again (``loading``) for a version it has already given up on."""
    old = write_version(tmp_path, catalogue, rows=list(range(20)))
    current = write_version(tmp_path, catalogue, rows=list(range(30)))

    def on_load(served: Served) -> None:
        if served.version == current:
            raise ValueError("malformed")
        raise RuntimeError("CUDA error: out of memory")

    now = [0.0]
    holder = waiting_holder(tmp_path, now, on_load=on_load)
    try:
        with pytest.raises(ReloadFailedError):
            holder.reload()
        assert not holder.loading  # CURRENT's version is broken: given up
        with pytest.raises(ReloadFailedError, match=old):
            holder.reload(old)
        assert not holder.loading and holder.last_error is not None and old in holder.last_error
    finally:
        holder.close()


def test_an_admin_reload_of_the_served_version_keeps_it_over_a_new_publish(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """``reload(V)`` of the served V while CURRENT already names a newer version the poller has not swapped
    in yet keeps V: an override of that CURRENT, as a rollback to V would be."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    holder = waiting_holder(tmp_path, [0.0])
    try:
        assert holder.reload() is not None
        write_version(tmp_path, catalogue, rows=list(range(30)))  # published, not polled yet
        assert holder.reload(first) is None
        assert holder.check() is False and holder.served.version == first
    finally:
        holder.close()


def test_a_publish_that_fails_to_load_ends_an_override(tmp_path: Path, catalogue: Catalogue) -> None:
    """An admin rollback lasts until CURRENT names another version, whether or not that one loads: the
    CURRENT the rollback was made over, republished after a broken publish (`ccrk index rollback`), is
    served. It was skipped at every poll as the override's, and the rolled-back version stayed served."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    second = write_version(tmp_path, catalogue, rows=list(range(30)))
    third = write_version(tmp_path, catalogue, rows=list(range(40)), publish=False)

    def on_load(served: Served) -> None:
        if served.version == third:
            raise KeyError("default")  # broken data: refused for good

    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, on_load=on_load)
    try:
        assert holder.reload() is not None and holder.served.version == second
        assert holder.reload(first) is not None and holder.served.version == first
        publish_version(tmp_path, INDEX_NAME, third)
        assert holder.check() is False and holder.served.version == first
        publish_version(tmp_path, INDEX_NAME, second)
        assert holder.check() is True and holder.served.version == second
    finally:
        holder.close()


def test_a_publish_during_an_admin_rollback_is_followed(tmp_path: Path, catalogue: Catalogue) -> None:
    """A version published while an admin rollback opens and loads is a new publish, served at the next
    poll: the rollback overrides the CURRENT read before its load. Read after it, the new version was taken
    for the one overridden and never served."""
    zero = write_version(tmp_path, catalogue, rows=list(range(10)))
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    newer = write_version(tmp_path, catalogue, rows=list(range(30)), publish=False)

    def opener(root: Path, name: str, version: str | None = None, **kwargs: object) -> IndexVersion:
        if version == zero:
            publish_version(root, name, newer)  # lands while the rollback loads
        return IndexVersion.open(root, name, version)

    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, opener=opener)
    try:
        assert holder.reload() is not None and holder.served.version == first
        assert holder.reload(zero) is not None and holder.served.version == zero
        assert holder.check() is True and holder.served.version == newer
    finally:
        holder.close()


def test_a_swap_stands_when_closing_the_old_version_or_on_swap_fails(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """After the swap, a failing close of the old version (logged) does not skip ``on_swap`` (metrics,
    monitor, huge pages), and a failing ``on_swap`` (logged) does not make the reload fail (the admin
    route's 500): the new version is served either way."""
    first = write_version(tmp_path, catalogue, rows=list(range(20)))
    second = write_version(tmp_path, catalogue, rows=list(range(30)))
    third = write_version(tmp_path, catalogue, rows=list(range(40)))
    swapped: list[str] = []

    def on_swap(served: Served) -> None:
        swapped.append(served.version)
        if served.version == third:
            raise RuntimeError("monitor broke")

    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None, on_swap=on_swap)
    try:
        assert holder.reload(first) is not None
        old = holder.served.index
        real_close = old.close

        def failing_close() -> None:
            real_close()
            raise OSError("munmap failed")

        old.close = failing_close  # type: ignore[method-assign]
        assert holder.reload(second) is not None and holder.served.version == second
        assert swapped == [first, second]
        assert holder.reload() is not None and holder.served.version == third
        assert swapped == [first, second, third] and holder.last_error is None
    finally:
        holder.close()


def test_an_admin_reload_of_the_published_version_passes_the_gate(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """A refused version published as CURRENT (`ccrk index rollback --to V --force`) is served by an admin
    reload naming it, as by a plain reload or a poll; another refused version still needs ``force``."""
    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    refused = write_version(tmp_path, catalogue, rows=list(range(10)), publish=False)
    other = write_version(tmp_path, catalogue, rows=list(range(15)), publish=False)
    _refuse(tmp_path, refused)
    _refuse(tmp_path, other)
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    try:
        assert holder.reload() is not None and holder.served.version == good
        publish_version(tmp_path, INDEX_NAME, refused)
        assert holder.reload(refused) is not None and holder.served.version == refused
        with pytest.raises(ReloadFailedError, match="quality gate"):
            holder.reload(other)
        assert holder.reload(other, force=True) is not None and holder.served.version == other
    finally:
        holder.close()


def test_the_poller_retires_a_version_whose_files_are_truncated_in_place_and_serves_the_next_publish(
    tmp_path: Path,
) -> None:
    """No request asking: the poll finds the lease being broken (``store.guard``), retires and closes the
    version (which lets the held truncation go on), refuses it until a new publish, then serves that."""
    first = write_rows(
        tmp_path, INDEX_NAME, grid_vectors(40, 8, np.random.default_rng(0)), [f"a-{i}" for i in range(40)]
    )
    holder = IndexHolder(tmp_path, INDEX_NAME, expect_fingerprint=None)
    holder.reload()
    path = index_dir(tmp_path, INDEX_NAME) / first / EMBEDDINGS_FILE
    truncation = threading.Thread(target=os.truncate, args=(path, 64), daemon=True)
    truncation.start()
    deadline = time.monotonic() + 10
    while holder.served is not None:  # with a lease the truncation is held; without, its size is seen
        assert time.monotonic() < deadline, "not retired"
        time.sleep(0.02)
        holder.check()
    truncation.join(timeout=10)
    assert not truncation.is_alive() and path.stat().st_size == 64
    with (
        pytest.raises(IndexUnavailableError, match=rf"{EMBEDDINGS_FILE} .*in place.*{first}"),
        holder.lease(),
    ):
        pass
    assert not holder.loading and holder.check() is False  # not opened again while CURRENT names it
    second = write_rows(
        tmp_path, INDEX_NAME, grid_vectors(30, 8, np.random.default_rng(1)), [f"b-{i}" for i in range(30)]
    )
    assert holder.check() is True
    with holder.lease() as served:
        assert served.version == second and served.index.damage() is None
    holder.close()
