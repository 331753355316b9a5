"""Fair share (``service.ratelimit``): the Redis script's bucket against the exact reference (``take``) and a
hand-computed sequence; the in-process fallback when Redis is down; a live server's 429 with Retry-After and
RateLimit-* headers, per key and per anonymous address, shared by two apps on one Redis; the daily quota;
the cap on a caller's concurrent expensive work."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from starlette.requests import Request

from service.errors import RateLimitedError
from service.keys import KeyStore
from service.metrics import Metrics
from service.ratelimit import BucketConnection, BucketState, Limit, RateLimiter, take
from service.runtime import Caller, Runtime
from tests.fixtures import REDIS_URL, Catalogue, LiveServer, make_settings, write_version
from tests.service.conftest import free_port

QUERY = {"query": "blue bag", "top_k": 2}


def limiter(url: str | None, prefix: str) -> RateLimiter:
    return RateLimiter(redis_url=url, prefix=prefix, timeout_s=0.5, retry_s=30.0)


@pytest.mark.parametrize("client", ["own", "redis-py"])
def test_the_script_computes_what_the_reference_does(
    redis_prefix: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if client == "redis-py":  # what other URLs (rediss://, unix://) go through
        monkeypatch.setattr(BucketConnection, "supports", staticmethod(lambda url: False))
    rng = random.Random(3)
    lim = limiter(REDIS_URL, redis_prefix + f"ref-{client}:")
    assert (lim._conn is None) == (client == "redis-py")
    local = limiter(None, "unused")
    for case in range(6):
        rate, burst = rng.choice([0.5, 2.0, 7.0, 50.0, 333.3]), rng.choice([1, 3, 10, 100])
        state: BucketState | None = None
        now = 1_700_000_000_000
        for _ in range(150):
            now += rng.choice([0, 0, 1, 7, 30, 140, 999, 2500])
            state, allowed, wait, reset = take(state, now, rate, burst)
            got = lim.check(f"case{case}", Limit(rate, burst), now_ms=now)
            also = local.check(f"case{case}", Limit(rate, burst), now_ms=now)
            assert got == also
            assert (got.allowed, got.remaining, got.limit) == (bool(allowed), int(state.tokens), burst)
            assert got.retry_after_s == (0 if allowed else max(1, -(-wait // 1000)))
            assert got.reset_s == -(-reset // 1000)
    lim.close()


def test_a_hand_computed_bucket(redis_prefix: str) -> None:
    lim = limiter(REDIS_URL, redis_prefix + "hand:")
    limit = Limit(rate=2.0, burst=3)
    t = 1_000_000
    answers = [lim.check("k", limit, now_ms=t) for _ in range(4)]
    assert [(a.allowed, a.remaining) for a in answers] == [(True, 2), (True, 1), (True, 0), (False, 0)]
    assert answers[3].headers() == {
        "RateLimit-Limit": "3",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "2",  # 3 tokens at 2/s: 1.5 s, rounded up
        "Retry-After": "1",  # one token: 0.5 s, rounded up
    }
    assert not lim.check("k", limit, now_ms=t + 499).allowed  # 0.998 tokens
    after = lim.check("k", limit, now_ms=t + 500)
    assert after.allowed and after.remaining == 0
    assert lim.check("k", limit, now_ms=t + 10_000).remaining == 2  # full again (3), one taken
    lim.close()


def test_the_daily_quota(redis_prefix: str) -> None:
    for lim in (limiter(REDIS_URL, redis_prefix + "quota:"), limiter(None, "local:")):
        limit = Limit(rate=1000.0, burst=1000, quota_per_day=3)
        answers = [lim.check("q", limit) for _ in range(5)]
        assert [a.allowed for a in answers] == [True, True, True, False, False]
        assert answers[3].quota_spent and 1 <= answers[3].retry_after_s <= 86400
        lim.close()


def test_a_script_redis_does_not_hold_is_sent_whole(redis_prefix: str) -> None:
    lim = limiter(REDIS_URL, redis_prefix + "noscript:")
    assert lim.check("f", Limit(1.0, 5)).remaining == 4
    assert lim._conn is not None
    lim._conn.sha = b"0" * 40  # as after a SCRIPT FLUSH or a Redis restart: NOSCRIPT, then EVAL
    assert lim.check("f", Limit(1.0, 5)).remaining == 3 and lim.backend == "redis"
    lim.close()


def test_without_redis_the_buckets_are_in_process() -> None:
    down = limiter(f"redis://127.0.0.1:{free_port()}/0", "x:")  # nothing listens there
    answers = [down.check("d", Limit(rate=1.0, burst=2), now_ms=5_000) for _ in range(3)]
    assert [a.allowed for a in answers] == [True, True, False]
    assert down.backend == "memory"
    down.close()


@pytest.fixture(scope="module")
def limited_root(tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue) -> Path:
    root = tmp_path_factory.mktemp("limited")
    write_version(root, catalogue, rows=list(range(20)))
    return root


@pytest.fixture(scope="module")
def limited(limited_root: Path, redis_prefix: str) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two apps on one Redis (as two worker processes): anonymous addresses get 1/s, bursts of 2."""
    settings = make_settings(
        limited_root,
        redis_url=REDIS_URL,
        cache_prefix=redis_prefix + "live:",
        anonymous_rate=0.5,
        anonymous_burst=2,
        ann_sample_rate=0.0,
    )
    with LiveServer(settings) as one, LiveServer(settings) as two:
        yield one, two


def test_429_with_retry_after_shared_across_processes(
    limited: tuple[LiveServer, LiveServer], limited_root: Path
) -> None:
    one, two = limited
    _, key = KeyStore(limited_root).create("search", [], rate=0.5, burst=3)
    headers = {"Authorization": f"Bearer {key}"}
    with one.client() as a, two.client() as b:
        codes = []
        for client in (a, b, a, b):
            response = client.post("/v1/search", json=QUERY, headers=headers)
            codes.append(response.status_code)
        assert codes == [200, 200, 200, 429]  # one bucket of 3 for both apps
        assert response.headers["retry-after"] == "2"  # a token every 2 s
        assert response.headers["ratelimit-limit"] == "3" and response.headers["ratelimit-remaining"] == "0"
        assert response.json()["detail"][0]["type"] == "rate_limited"
        ok = a.post("/v1/search", json=QUERY, headers={"X-API-Key": "test-admin-key"})
        assert ok.status_code == 200 and "ratelimit-limit" not in ok.headers  # the admin key: no limit

        # Anonymous traffic: one bucket per address, apart from the key's.
        first = a.post("/v1/search", json=QUERY)
        assert first.status_code == 200 and first.headers["ratelimit-remaining"] == "1"
        assert b.post("/v1/search", json=QUERY).status_code == 200
        refused = a.post("/v1/search", json=QUERY)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1


def test_expensive_work_is_capped_per_caller(limited_root: Path) -> None:
    runtime = Runtime(make_settings(limited_root, max_expensive_per_caller=2), Metrics())
    greedy, polite = Caller("key:aaaaaaaa", None), Caller("key:bbbbbbbb", None)

    async def run() -> None:
        async with runtime.expensive(greedy), runtime.expensive(greedy):
            with pytest.raises(RateLimitedError) as refused:
                async with runtime.expensive(greedy):
                    pass
            assert refused.value.headers == {"Retry-After": "1"}
            async with runtime.expensive(polite):  # another caller's slots are its own
                pass
        async with runtime.expensive(greedy):  # released
            pass

    asyncio.run(run())
    assert runtime.expensive_slots._held == {}


def test_admit_sets_the_headers_of_the_answer(limited_root: Path, redis_prefix: str) -> None:
    settings = make_settings(
        limited_root, key_rate=10.0, redis_url=REDIS_URL, cache_prefix=redis_prefix + "ad:"
    )
    runtime = Runtime(settings, Metrics())
    record, _ = KeyStore(limited_root).create("search", [])
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "state": {}})
    runtime.admit(Caller(f"key:{record.id}", record), request)
    assert request.state.ratelimit_headers == {
        "RateLimit-Limit": "10",  # key_rate 10/s, its burst one second's
        "RateLimit-Remaining": "9",
        "RateLimit-Reset": "1",
    }
    runtime.rate_limiter.close()
    client = redis.Redis.from_url(REDIS_URL)
    assert client.exists(f"{redis_prefix}ad:rl:key:{record.id}") == 1
    client.close()


def test_a_callers_searches_wait_in_their_own_line(limited_root: Path) -> None:
    runtime = Runtime(make_settings(limited_root, max_concurrent_per_caller=2, search_workers=4), Metrics())
    runtime.caller_queues.wait_s = 0.5
    greedy, polite = Caller("key:aaaaaaaa", None), Caller("ip:127.0.0.2", None)
    inside: list[str] = []
    most = 0

    async def search(caller: Caller, release: anyio.Event) -> None:
        nonlocal most
        async with runtime.in_line(caller):
            inside.append(caller.identity)
            most = max(most, inside.count(greedy.identity))
            await release.wait()
            inside.remove(caller.identity)

    async def run() -> None:
        release = anyio.Event()
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(search, greedy, release)
            await anyio.sleep(0.05)
            assert inside.count(greedy.identity) == 2  # three wait, holding no thread
            polite_done = anyio.Event()

            async def polite_search() -> None:
                async with runtime.in_line(polite):
                    polite_done.set()

            tg.start_soon(polite_search)
            with anyio.fail_after(1):
                await polite_done.wait()  # not behind the greedy line
            release.set()
        assert most == 2 and inside == []
        # Waiting longer than wait_s: 429.
        hold = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(search, greedy, hold)
            tg.start_soon(search, greedy, hold)
            await anyio.sleep(0.05)
            with pytest.raises(RateLimitedError) as refused:
                async with runtime.in_line(greedy):
                    pass
            assert refused.value.headers == {"Retry-After": "1"}
            hold.set()

    anyio.run(run)
    assert runtime.caller_queues.waiting() == 0 and runtime.caller_queues.held(greedy.identity) == 0
