"""History stores (SQLite and a real Redis): runs by time, traffic minutes that add up, retention; the
latency histogram's quantiles by hand; alerts and markers from a hand-made history."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from monitoring.history import HistoryStore, RedisHistory, SqliteHistory
from monitoring.report import AlertRules, alerts, markers
from monitoring.traffic import LATENCY_BOUNDS_MS, Bucket, TrafficAggregator, latency_quantile
from tests.fixtures import REDIS_URL

DAY = 86400.0


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistoryStore]:
    if request.param == "sqlite":
        yield SqliteHistory(tmp_path / "h.sqlite", retention_s=DAY)
    else:
        # Asked for here only: the SQLite cases must not need a Redis.
        redis_prefix: str = request.getfixturevalue("redis_prefix")
        s = RedisHistory(REDIS_URL, f"{redis_prefix}{uuid.uuid4().hex[:6]}:", retention_s=DAY)
        yield s
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=s.prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
        s.close()


def test_runs_by_time_and_retention(store: HistoryStore) -> None:
    now = 1_800_000_000.0
    for age_days, version in ((2.0, "old"), (0.5, "v1"), (0.1, "v2")):
        store.add_run({"time": now - age_days * DAY, "index_version": version, "mrv": age_days})
    assert [r["index_version"] for r in store.runs(0)] == ["old", "v1", "v2"]
    assert [r["index_version"] for r in store.runs(now - DAY)] == ["v1", "v2"]
    assert [r["index_version"] for r in store.runs(0, until=now - 0.2 * DAY)] == ["old", "v1"]
    store.prune(now)
    assert [r["index_version"] for r in store.runs(0)] == ["v1", "v2"]


def test_traffic_minutes_add_up(store: HistoryStore) -> None:
    now = 1_800_000_030.0  # 30 s into a minute
    agg = TrafficAggregator()
    agg.record("de", 20, 0.5, 3.0, now=now)
    agg.record("de", 0, None, 40.0, now=now + 10)
    agg.record("ja", 5, 0.25, 1.0, now=now)
    agg.record_ann("de", 0.75, now=now)
    store.add_traffic(agg.drain())
    assert agg.drain() == []
    # A second process (or flush) adds to the same minute.
    agg.record("de", 3, 0.75, 3.0, now=now + 20)
    agg.record_ann("de", 1.0, now=now + 20)
    store.add_traffic(agg.drain())
    buckets = store.traffic(now - 60)
    assert [(b.minute, b.lang) for b in buckets] == [(1_800_000_000, "de"), (1_800_000_000, "ja")]
    de = buckets[0].summary()
    assert de["count"] == 3 and de["zero_result_rate"] == pytest.approx(1 / 3, abs=5e-5)
    assert de["mean_top_score"] == pytest.approx((0.5 + 0.75) / 2)
    assert de["ann_samples"] == 2 and de["ann_recall_at_10"] == pytest.approx(0.875)
    # Latencies 3, 3 (bucket (2, 3]) and 40 (bucket (25, 50]): the median is at rank 1.5 of 3 in (2, 3].
    assert de["latency_ms_p50"] == pytest.approx(2 + 1.0 * 1.5 / 2)
    assert store.traffic(now + 60) == []
    store.prune(now + DAY + 120)
    assert store.traffic(0) == []


def _add_searches(path: str, flushes: int) -> None:
    """One server process: ``flushes`` flushes of one search each to the same minute of a SQLite history."""
    store = SqliteHistory(Path(path), retention_s=DAY)
    for _ in range(flushes):
        agg = TrafficAggregator()
        agg.record("de", 5, 0.5, 3.0, now=1_800_000_030.0)
        store.add_traffic(agg.drain())


def test_two_processes_flushing_to_one_sqlite_minute_lose_no_search(tmp_path: Path) -> None:
    """Server processes flush to the same SQLite history and the same minute's row: every search counted.
    Both read the row's old counts before either wrote (sqlite3 begins a transaction at the first write),
    so one write replaced the other's: `ccrk serve --workers 2` stored 23 of 24 searches."""
    path = tmp_path / "h.sqlite"
    SqliteHistory(path, retention_s=DAY).traffic(0)  # the schema, before the processes race to make it
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_add_searches, args=(str(path), 150)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    (bucket,) = SqliteHistory(path, retention_s=DAY).traffic(0)
    assert bucket.count == 450 and sum(bucket.latency_hist) == 450


def test_latency_quantiles_by_hand() -> None:
    hist = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    hist[0] = 50  # (0, 1] ms
    hist[LATENCY_BOUNDS_MS.index(10)] = 50  # (7.5, 10] ms
    assert latency_quantile(hist, 0.5) == pytest.approx(1.0)
    assert latency_quantile(hist, 0.75) == pytest.approx(7.5 + 2.5 * 25 / 50)
    assert latency_quantile([0] * len(hist), 0.5) is None
    hist[-1] = 100  # beyond the last bound: reported as the last bound
    assert latency_quantile(hist, 0.99) == LATENCY_BOUNDS_MS[-1]
    b = Bucket(0, "en", latency_hist=list(hist))
    b.merge(Bucket(0, "en", count=2, latency_hist=list(hist)))
    assert b.count == 2 and b.latency_hist[-1] == 200


def probe_run(
    t: float, version: str, mrv: float, recall: dict[str, float], **extra: object
) -> dict[str, object]:
    return {
        "time": t,
        "index_version": version,
        "model": extra.pop("model", "ccrk-demo"),
        "source": extra.pop("source", "schedule"),
        "mrv": mrv,
        "per_language": {k: {"recall_at_10": v} for k, v in recall.items()},
        **extra,
    }


def test_alerts_and_markers_by_hand() -> None:
    runs = [
        probe_run(1.0, "v1", 4.0, {"en": 0.9, "ja": 0.8}),
        probe_run(2.0, "v1", 5.0, {"en": 0.92, "ja": 0.82}),
        probe_run(
            3.0, "v3", 30.0, {"en": 0.5}, source="gate", gate={"passed": False, "reasons": ["en: low"]}
        ),
        probe_run(4.0, "v2", 12.0, {"en": 0.91, "ja": 0.7}, model="ccrk-2"),
    ]
    found = alerts(runs, AlertRules(mrv_max=10.0, recall_drop=0.05))
    assert [(a["kind"], a["lang"]) for a in found] == [("mrv", None), ("recall_drop", "ja"), ("gate", None)]
    assert "12.0 points (0.820 -> 0.700) from v1 to v2" in found[1]["message"]
    assert found[2]["message"] == "quality gate refused v3: en: low"
    assert [(m["time"], m["kind"], m["label"]) for m in markers(runs)] == [
        (1.0, "index", "v1"),
        (3.0, "gate_refused", "refused: v3"),
        (4.0, "index", "v2"),
        (4.0, "model", "ccrk-2"),
    ]
    assert alerts(runs[:2], AlertRules(mrv_max=10.0, recall_drop=0.05)) == []


def test_each_served_index_has_its_own_history_by_default(tmp_path: Path) -> None:
    """Every service on a machine wrote one ``artifacts/monitoring.sqlite``: one service's dashboard showed
    another's traffic and probe runs. Without ``history_db``, each index has its own file beside it."""
    from ccrk_settings import Settings
    from monitoring.history import history_path, open_history

    def service(root: str, name: str) -> Settings:
        return Settings(index_root=tmp_path / root, index_name=name, history_db=None, redis_url=None)

    demo, photos, elsewhere = service("a", "demo"), service("a", "photos"), service("b", "demo")
    assert len({history_path(s) for s in (demo, photos, elsewhere)}) == 3
    assert history_path(demo) == tmp_path / "a" / "demo.monitoring.sqlite"
    assert history_path(demo, "photos") == history_path(photos)  # a build's gate writes the built index's
    store = open_history(demo)
    try:
        store.add_run({"time": time.time(), "index_version": "v1"})
        assert [r["index_version"] for r in store.runs(0)] == ["v1"]
    finally:
        store.close()
    for other in (photos, elsewhere):
        store = open_history(other)
        try:
            assert store.runs(0) == []
        finally:
            store.close()
    given = demo.model_copy(update={"history_db": tmp_path / "given.sqlite"})
    assert history_path(given, "photos") == tmp_path / "given.sqlite"
