"""Daily quotas that outlive Redis (``service.quota_ledger``, ``store.quota_state``): a quota spent before a
Redis restart without persistence stays spent, for the processes that counted it and for fresh ones; while
Redis is down, processes count on from each other's totals instead of each from zero."""

from __future__ import annotations

import json
from pathlib import Path

from service.quota_ledger import QuotaLedger
from service.ratelimit import Limit, RateLimiter
from store.quota_state import QUOTA_DIR, merge_counts, quota_path
from tests.service.conftest import RedisProcess, free_port

QUOTA = Limit(rate=1000.0, burst=1000, quota_per_day=5)


def limiter(url: str, root: Path, retry_s: float = 30.0) -> RateLimiter:
    ledger = QuotaLedger(root)  # flushed in a thread every 2 s; the tests flush where they need to
    return RateLimiter(redis_url=url, prefix="q:", timeout_s=0.5, retry_s=retry_s, ledger=ledger)


def test_a_spent_quota_survives_a_redis_restart(tmp_path: Path) -> None:
    redis_server = RedisProcess()  # --save "" --appendonly no: a restart forgets every key
    redis_server.start()
    try:
        one, two = limiter(redis_server.url, tmp_path), limiter(redis_server.url, tmp_path)
        answers = [(one if n % 2 else two).check("key:aaaaaaaa", QUOTA) for n in range(6)]
        assert [a.allowed for a in answers] == [True] * 5 + [False] and answers[-1].quota_spent
        for lim in (one, two):  # what a flush thread does within 2 s
            assert lim.ledger is not None
            lim.ledger.flush()
        redis_server.stop()
        redis_server.start()
        # The processes that counted it (Redis errors first: in process for retry_s, from the state) ...
        assert not one.check("key:aaaaaaaa", QUOTA).allowed and one.backend == "memory"
        # ... and a fresh process on the fresh Redis (the counter resumes from the state).
        fresh = limiter(redis_server.url, tmp_path)
        refused = fresh.check("key:aaaaaaaa", QUOTA)
        assert not refused.allowed and refused.quota_spent and fresh.backend == "redis"
        assert fresh.check("key:bbbbbbbb", QUOTA).allowed  # another key's quota is its own
        for lim in (one, two, fresh):
            lim.close()
    finally:
        redis_server.stop()
    day_file = next((tmp_path / QUOTA_DIR).glob("*.json"))
    assert json.loads(day_file.read_text())["used"] == {"key:aaaaaaaa": 5, "key:bbbbbbbb": 1}


def test_while_redis_is_down_processes_count_on_from_each_other(tmp_path: Path) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    one, two = limiter(down, tmp_path), limiter(down, tmp_path)
    assert [one.check("key:cccccccc", QUOTA).allowed for _ in range(3)] == [True] * 3
    assert one.ledger is not None
    one.ledger.flush()  # what its flush thread does within 2 s
    assert [two.check("key:cccccccc", QUOTA).allowed for _ in range(3)] == [True, True, False]
    assert one.backend == two.backend == "memory"
    one.close()
    two.close()


def test_the_state_merges_by_the_largest_count_and_drops_old_days(tmp_path: Path) -> None:
    merge_counts(tmp_path, "20261128", {"a": 9})
    assert merge_counts(tmp_path, "20261201", {"a": 3, "b": 1}) == {"a": 3, "b": 1}
    assert merge_counts(tmp_path, "20261201", {"a": 2, "c": 4}) == {"a": 3, "b": 1, "c": 4}
    assert not quota_path(tmp_path, "20261128").exists()  # before yesterday
    quota_path(tmp_path, "20261201").write_text("{torn")  # unreadable: replaced by what is known
    assert merge_counts(tmp_path, "20261201", {"a": 5}) == {"a": 5}
