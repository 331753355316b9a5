"""Zero failed requests while Redis dies and comes back, and while the index is swapped under load."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from service.cache import RESULT, Cache
from store.layout import INDEX_FILE, MANIFEST_FILE
from store.version.manifest import IndexManifest
from store.version.versions import current_version, publish_version
from tests.fixtures import Catalogue, LiveServer, make_settings, write_version
from tests.service.conftest import RedisProcess

QUERIES = [
    "three yellow umbrellas",
    "drei gelbe Regenschirme",
    "trois parapluies jaunes",
    "红色的杯子",
    "a blue striped mug",
    "две зелёные шапки",
]


class Load:
    """Client threads searching in a loop; every status and index version seen is recorded."""

    def __init__(self, url: str, threads: int = 6, body: dict | None = None) -> None:
        self.url = url
        self.body = body or {}
        self.stop = threading.Event()
        self.statuses: Counter[int | str] = Counter()
        self.versions: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(threads)]

    def _run(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            i = n
            while not self.stop.is_set():
                query = f"{QUERIES[i % len(QUERIES)]} {i % 7}"  # some repeats (cache), some new
                try:
                    r = c.post("/v1/search", json={"query": query, "top_k": 5, **self.body})
                    status: int | str = r.status_code
                    version = r.json().get("index_version") if r.status_code == 200 else None
                except httpx.HTTPError as exc:
                    status, version = type(exc).__name__, None
                with self.lock:
                    self.statuses[status] += 1
                    if version:
                        self.versions.append(version)
                i += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_redis_stopped_mid_test_fails_no_request(index_root: Path) -> None:
    own = RedisProcess()
    own.start()
    try:
        settings = make_settings(index_root, redis_url=own.url, redis_timeout_s=0.05, redis_retry_s=0.3)
        with LiveServer(settings) as live:
            metrics = live.app.state.runtime.metrics
            with Load(live.url) as load:
                assert wait_for(lambda: load.statuses[200] > 40)
                assert redis.Redis(port=own.port).dbsize() > 0  # the cache was in use
                own.stop()
                served_before = load.statuses[200]
                assert wait_for(lambda: load.statuses[200] > served_before + 60)
                errors = sum(
                    s.value for s in metrics.redis_errors.collect()[0].samples if s.name.endswith("_total")
                )
                assert errors >= 1
                own.start()  # an empty Redis on the same port: the service finds it again by itself
                assert wait_for(lambda: redis.Redis(port=own.port).dbsize() > 0)
                served_after = load.statuses[200]
                assert wait_for(lambda: load.statuses[200] > served_after + 20)
            assert set(load.statuses) == {200}, load.statuses
    finally:
        own.stop()


def test_reload_under_concurrent_load_fails_no_request(tmp_path: Path, catalogue: Catalogue) -> None:
    first = write_version(tmp_path, catalogue, rows=list(range(40)))
    settings = make_settings(tmp_path, index_poll_s=0.1)
    with LiveServer(settings) as live, live.client() as admin, Load(live.url, body={"rerank": True}) as load:
        holder = live.app.state.runtime.holder
        assert wait_for(lambda: load.statuses[200] > 30)
        old = holder.served
        # 1) an admin reload of a freshly published version
        second = write_version(tmp_path, catalogue, rows=list(range(20, 60)), publish=False)
        publish_version(tmp_path, "shop", second)
        response = admin.post("/v1/admin/reload", headers={"x-api-key": "test-admin-key"})
        assert response.status_code == 200, response.text
        assert response.json()["version"] == second  # (the poller may have been quicker than the call)
        n = load.statuses[200]
        assert wait_for(lambda: load.statuses[200] > n + 30)
        # The old version was closed once its last request returned it.
        assert old is not None and old.retired and wait_for(lambda: old.leases == 0)
        # 2) the poller picks up a new CURRENT by itself
        third = write_version(tmp_path, catalogue, rows=list(range(0, 60, 2)))
        assert wait_for(lambda: holder.served is not None and holder.served.version == third)
        n = load.statuses[200]
        assert wait_for(lambda: load.statuses[200] > n + 30)
        # 3) a broken version is refused (409) and the good one keeps serving
        fourth = write_version(tmp_path, catalogue, rows=list(range(10)), publish=False)
        (tmp_path / "shop" / fourth / INDEX_FILE).write_bytes(b"corrupt")
        publish_version(tmp_path, "shop", fourth)
        response = admin.post("/v1/admin/reload", headers={"x-api-key": "test-admin-key"})
        assert response.status_code == 409 and fourth in response.json()["detail"][0]["msg"]
        n = load.statuses[200]
        assert wait_for(lambda: load.statuses[200] > n + 20)
        assert holder.served is not None and holder.served.version == third
        # 4) rollback to a kept version by name
        response = admin.post(
            "/v1/admin/reload", headers={"x-api-key": "test-admin-key"}, params={"version": first}
        )
        assert response.status_code == 200 and response.json()["version"] == first
        n = load.statuses[200]
        assert wait_for(lambda: load.statuses[200] > n + 20)
    assert set(load.statuses) == {200}, load.statuses
    seen = list(dict.fromkeys(load.versions))
    assert seen[:3] == [first, second, third], seen
    assert load.versions[-1] == first


def test_admin_reload_serves_a_gate_refused_version_only_when_forced(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    refused = write_version(tmp_path, catalogue, rows=list(range(10)), publish=False)
    manifest_path = tmp_path / "shop" / refused / MANIFEST_FILE
    manifest = IndexManifest.load(manifest_path)
    manifest.build_params = {**manifest.build_params, "quality_gate": {"passed": False, "reasons": ["test"]}}
    manifest.save(manifest_path)
    key = {"x-api-key": "test-admin-key"}
    with LiveServer(make_settings(tmp_path)) as live, live.client() as admin:
        response = admin.post("/v1/admin/reload", headers=key, params={"version": refused})
        assert response.status_code == 409 and "refused by the quality gate" in response.text
        assert live.app.state.runtime.holder.served.version == good
        response = admin.post("/v1/admin/reload", headers=key, params={"version": refused, "force": True})
        assert response.status_code == 200 and response.json()["version"] == refused
        assert current_version(tmp_path, "shop") == good  # a replica's override never moves CURRENT


def _with_calibration(root: Path, version: str, calibration: object) -> str:
    """``version`` with ``calibration`` as its manifest's recorded match calibration (a hand-edited one)."""
    manifest_path = root / "shop" / version / MANIFEST_FILE
    manifest = IndexManifest.load(manifest_path)
    manifest.match_calibration = calibration  # type: ignore[assignment]
    manifest.save(manifest_path)
    return version


def test_a_version_whose_load_fails_answers_409_and_a_malformed_calibration_is_measured_afresh(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed recorded match calibration is measured afresh (as a version without one), at the load
    and at a search alike: the admin reload answered 500 (a KeyError out of the load), a search 500 (a
    threshold compared as text). A load that fails for another reason answers 409 naming the version, and
    the old version keeps serving."""
    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    no_default = write_version(tmp_path, catalogue, rows=list(range(20)), publish=False)
    _with_calibration(tmp_path, no_default, {"per_language": {}})
    text = write_version(tmp_path, catalogue, rows=list(range(25)), publish=False)
    _with_calibration(tmp_path, text, {"default": {"none_below": "low", "strong_from": 0.9}})
    key = {"x-api-key": "test-admin-key"}
    query = {"query": "a blue striped mug"}
    with LiveServer(make_settings(tmp_path)) as live, live.client() as client:
        runtime = live.app.state.runtime
        judge = runtime.pipeline.judge
        response = client.post("/v1/admin/reload", headers=key, params={"version": no_default})
        assert response.status_code == 200 and response.json()["version"] == no_default, response.text
        answer = client.post("/v1/search", json=query)
        assert answer.status_code == 200 and answer.json()["match_thresholds"] is not None
        response = client.post("/v1/admin/reload", headers=key, params={"version": text})
        assert response.status_code == 200 and response.json()["version"] == text, response.text
        judge._by_index.clear()  # parsed again by the search (the judge keeps each open version's own)
        answer = client.post("/v1/search", json=query)
        assert answer.status_code == 200, answer.text
        assert isinstance(answer.json()["match_thresholds"]["none_below"], float)

        def failing(served: object) -> None:
            raise RuntimeError("calibration broke")

        monkeypatch.setattr(judge, "calibration", failing)
        response = client.post("/v1/admin/reload", headers=key, params={"version": good})
        assert response.status_code == 409 and good in response.json()["detail"][0]["msg"]
        assert runtime.holder.served.version == text and good in (runtime.holder.last_error or "")


def _reload_answers_503_then_loads(tmp_path: Path, good: str, big: str, short: list[bool], says: str) -> None:
    """Reloading ``big`` while ``short[0]`` (memory short): a 503 with Retry-After (the poll interval rounded
    up) whose message has ``says``, ``good`` still served and searched; then, memory back, ``big`` loads."""
    key = {"x-api-key": "test-admin-key"}
    with LiveServer(make_settings(tmp_path, index_poll_s=7.5)) as live, live.client() as client:
        response = client.post("/v1/admin/reload", headers=key, params={"version": big})
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "8"
        (error,) = response.json()["detail"]
        assert error["type"] == "reload_out_of_memory" and big in error["msg"]
        assert says in error["msg"]
        assert live.app.state.runtime.holder.served.version == good
        assert client.post("/v1/search", json={"query": "a blue striped mug"}).status_code == 200
        short[0] = False
        response = client.post("/v1/admin/reload", headers=key, params={"version": big})
        assert response.status_code == 200 and response.json()["version"] == big, response.text


def test_running_out_of_memory_opening_a_version_answers_503_naming_it(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin reload whose open of the version runs out of memory (np.load of a huge array, a damaged
    file's header among them) answers a 503 naming the version, not a 500 (the MemoryError escaped the
    holder), with a Retry-After of the index poll interval (rounded up: whole seconds); the old version keeps
    serving, and the same version loads once memory allows."""
    from store.guard import FileGuard

    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    big = write_version(tmp_path, catalogue, rows=list(range(20)), publish=False)
    short = [True]
    real_map = FileGuard.map_array  # how a version's arrays are read at its open

    def load(guard: FileGuard, path: Path) -> object:
        if short[0] and path.parent.name == big:
            raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (1000000000000,)")
        return real_map(guard, path)

    monkeypatch.setattr(FileGuard, "map_array", load)
    _reload_answers_503_then_loads(tmp_path, good, big, short, "out of memory (Unable to allocate")


def test_a_gpu_running_out_of_memory_loading_a_version_answers_503(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's CUDA OutOfMemoryError while a version loads (its match calibration encodes queries on the
    GPU) answers as a MemoryError does: a 503 with Retry-After naming the version, not a 409 (a version's
    failure); the old version keeps serving, and the same version loads once memory allows."""
    torch = pytest.importorskip("torch")
    from service.matching import MatchJudge

    good = write_version(tmp_path, catalogue, rows=list(range(30)))
    big = write_version(tmp_path, catalogue, rows=list(range(20)), publish=False)
    short = [True]
    real_calibration = MatchJudge.calibration

    def calibration(self: MatchJudge, served: Any) -> Any:
        if short[0] and served.version == big:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_calibration(self, served)

    monkeypatch.setattr(MatchJudge, "calibration", calibration)
    _reload_answers_503_then_loads(tmp_path, good, big, short, "out of memory (CUDA out of memory")


def test_the_local_lru_serves_while_redis_is_down() -> None:
    """With Redis gone the cache keeps working in-process (uncached, a loaded service fell behind); once
    Redis answers again after the retry window, entries go there."""
    redis_server = RedisProcess()
    cache = Cache(redis_url=redis_server.url, prefix="t:", size=100, ttl_s=60, timeout_s=0.2, retry_s=0.2)
    try:
        cache.set(RESULT, "k", b"during the outage")  # nothing listens yet
        assert not cache.redis_available()
        assert cache.get(RESULT, "k") == b"during the outage"
        redis_server.start()
        time.sleep(0.3)
        assert cache.redis_available()
        cache.set(RESULT, "k2", b"in redis")
        client = redis.Redis.from_url(redis_server.url)
        assert client.get("t:" + RESULT + ":k2") == b"in redis"
        client.close()
    finally:
        cache.close()
        redis_server.stop()
