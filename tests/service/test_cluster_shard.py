"""``ShardServer`` (one shard of any version) and its Ray Serve body ``ShardDeployment`` in one process:
which versions stay open, that none is closed under a call reading it, and that the threaded body answers
as the plain one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from service.cluster.deployments import ShardDeployment
from service.cluster.remote_index import RemoteShardedIndex, remote_opener
from service.cluster.shard import ShardServer
from service.index_holder import IndexHolder
from store.errors import IndexUnreachableError
from store.opening import open_version
from store.version.versions import current_version
from tests.store.writing import vectors, write_rows

NAME = "sharded"


@pytest.fixture()
def two_versions(tmp_path: Path) -> tuple[Path, str, str]:
    ids = [f"p-{i}" for i in range(40)]
    old = write_rows(tmp_path, NAME, vectors(40, seed=1), ids, shard_count=2)
    new = write_rows(tmp_path, NAME, vectors(40, seed=2), ids, shard_count=2)
    assert current_version(tmp_path, NAME) == new
    return tmp_path, old, new


def test_a_released_version_closes_once_idle(two_versions: tuple[Path, str, str]) -> None:
    root, old, new = two_versions
    server = ShardServer(str(root), NAME, 1, idle_s=3600)
    server.open(old)
    server.open(new)
    server.release(old)
    server.search(new, vectors(1, seed=3), 3, None)
    assert server.loaded() == sorted([old, new])  # released, not idle long enough
    server.idle_s = -1.0
    server.search(new, vectors(1, seed=3), 3, None)
    assert server.loaded() == [new]
    server.open(old)  # asked for again, but CURRENT names new: closed once idle all the same
    assert server.loaded() == sorted([old, new])
    server.search(new, vectors(1, seed=3), 3, None)
    assert server.loaded() == [new]


def test_a_version_current_no_longer_names_closes_on_every_replica(
    two_versions: tuple[Path, str, str],
) -> None:
    """The ingress's release reaches one replica of a shard; the others close an idle version CURRENT no
    longer names, and keep the current one however long it idles."""
    root, old, new = two_versions
    replica = ShardServer(str(root), NAME, 0, idle_s=-1.0)
    replica.open(old)  # serving=True: not released on this replica
    replica.open(new)
    replica.search(new, vectors(1, seed=3), 3, None)
    assert replica.loaded() == [new]
    replica.search(new, vectors(1, seed=3), 3, None)
    assert replica.loaded() == [new]


def test_no_version_is_closed_under_a_call(two_versions: tuple[Path, str, str]) -> None:
    root, old, new = two_versions
    server = ShardServer(str(root), NAME, 0, max_versions=1, idle_s=-1.0)
    server.open(old)
    server.release(old)
    with server._using(old) as reading:  # a call on old in another thread, still running
        server.search(new, vectors(1, seed=3), 3, None)
        assert server.loaded() == sorted([old, new])  # over max_versions rather than closing it
        assert len(reading.search(vectors(1, seed=3), 3)[1][0]) == 3
    server.search(new, vectors(1, seed=3), 3, None)
    assert server.loaded() == [new]


def test_the_threaded_body_answers_as_the_plain_one(two_versions: tuple[Path, str, str]) -> None:
    root, _, new = two_versions
    plain = ShardServer(str(root), NAME, 1)
    threaded = ShardDeployment(str(root), NAME, 1)
    q = vectors(3, seed=4)

    async def calls() -> list:
        info = await threaded.open(new)
        results = await asyncio.gather(*(threaded.search(new, q, k, None) for k in (1, 5, 20)))
        exact = await threaded.search_exact(new, q, 4, np.arange(0, 40, 2))
        rows = results[-1][1][0][:4]
        items = await threaded.items(new, rows)
        tokens = await threaded.rerank_tokens(new, rows)
        row = await threaded.row_of(new, items[0]["id"])
        filtered = await threaded.filter_rows(new, {})
        await threaded.release(new)
        return [info, results, exact, items, tokens, row, filtered, rows]

    info, results, exact, items, tokens, row, filtered, rows = asyncio.run(calls())
    assert info == plain.open(new)
    for k, (scores, found) in zip((1, 5, 20), results, strict=True):
        want = plain.search(new, q, k, None)
        np.testing.assert_array_equal(found, want[1])
        np.testing.assert_array_equal(scores, want[0])
    np.testing.assert_array_equal(exact[1], plain.search_exact(new, q, 4, np.arange(0, 40, 2))[1])
    assert items == plain.items(new, rows)
    np.testing.assert_array_equal(tokens, plain.rerank_tokens(new, rows))
    assert row == plain.row_of(new, items[0]["id"]) == int(rows[0])
    np.testing.assert_array_equal(filtered, plain.filter_rows(new, {}))


class _Gone(Exception):
    pass


class _Pending:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def result(self, timeout_s: float | None = None) -> object:
        raise self.error


def test_shards_out_of_reach_give_a_retryable_error(two_versions: tuple[Path, str, str]) -> None:
    """Every replica asked died, or a shard timed out: IndexUnreachableError (503 at the edge), and the
    index holder tries that version again at its next poll instead of waiting for another one."""
    root, _, new = two_versions
    calls: list[str] = []

    def dead(shard: int, method: str, *args: object) -> _Pending:
        calls.append(method)
        return _Pending(_Gone("replica died"))

    def slow(shard: int, method: str, *args: object) -> _Pending:
        return _Pending(TimeoutError("timed out"))

    with open_version(root, NAME) as local:
        with pytest.raises(IndexUnreachableError, match="open failed on 3 replicas"):
            RemoteShardedIndex(local.path, local.manifest, dead, shard_count=2, retries=2, retry_on=(_Gone,))
        assert calls == ["open"] * 4  # both shards sent at once; shard 0 tried 3 times, then it gave up
        with pytest.raises(IndexUnreachableError, match="did not answer open within 120 s"):
            RemoteShardedIndex(local.path, local.manifest, slow, shard_count=2, retry_on=(_Gone,))

    servers = [ShardServer(str(root), NAME, i) for i in range(2)]
    reachable = {"now": False}

    def call(shard: int, method: str, *args: object) -> object:
        if not reachable["now"]:
            return _Pending(_Gone("no replica yet"))
        value = getattr(servers[shard], method)(*args)
        return type("Done", (), {"result": lambda self, timeout_s=None: value})()

    opener = remote_opener(call, 2, open_version, retries=0, retry_on=(_Gone,))
    holder = IndexHolder(root, NAME, expect_fingerprint=None, opener=opener)
    assert not holder.check() and holder.served is None and "no replica yet" in (holder.last_error or "")
    reachable["now"] = True
    assert holder.check() and holder.served is not None and holder.served.version == new
    holder.close()


def test_a_slow_load_blocks_no_other_version_and_current_is_preloaded(
    two_versions: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a version (reading a shard's files) happens outside the lock, once: calls on the old version
    go on meanwhile, and every call for the new one waits for that one load. A replica the ingress's open
    did not reach loads the version CURRENT names by itself."""
    import threading

    root, old, new = two_versions
    server = ShardServer(str(root), NAME, 0)
    gate, loads = threading.Event(), []
    real_load = server._load

    def slow_load(version: str):  # type: ignore[no-untyped-def]
        loads.append(version)
        if version == new:
            assert gate.wait(10)
        return real_load(version)

    # Before the first open: its look at CURRENT starts loading the new version in the background, which
    # raced this patch (the real load could finish first, and no load of the new version was seen).
    monkeypatch.setattr(server, "_load", slow_load)
    server.open(old)
    server._current = (-1.0, None)  # read CURRENT at the next call: it names new, not loaded here
    found: list = []
    callers = [threading.Thread(target=lambda: found.append(server.search(new, vectors(1, seed=3), 3, None)))]
    callers[0].start()
    assert len(server.search(old, vectors(1, seed=3), 3, None)[1][0]) == 3  # not stuck behind the load
    callers.append(
        threading.Thread(target=lambda: found.append(server.search(new, vectors(1, seed=3), 3, None)))
    )
    callers[1].start()
    gate.set()
    for caller in callers:
        caller.join(10)
    assert len(found) == 2 and loads.count(new) == 1
    assert server.loaded() == sorted([old, new])

    fresh = ShardServer(str(root), NAME, 1)
    fresh.open(old)  # its first look at CURRENT: new, loaded in the background
    deadline = time.monotonic() + 10
    while new not in fresh.loaded():
        assert time.monotonic() < deadline, "CURRENT's version was not preloaded"
        time.sleep(0.01)
