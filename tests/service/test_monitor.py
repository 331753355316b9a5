"""The service's monitor on a real uvicorn with Redis history: a probe at startup and after a swap,
live traffic per language and minute, live ANN recall samples, and GET /v1/consistency/history."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from monitoring.probe_set import probes_from_captions, save_probe_set
from tests.fixtures import REDIS_URL, Catalogue, LiveServer, make_settings, write_version


def wait_for(fetch: Callable[[], Any], ok: Callable[[Any], bool], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {value!r}")
        time.sleep(0.1)


def history(client: httpx.Client, **params: str) -> dict[str, Any]:
    response = client.get("/v1/consistency/history", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_probes_traffic_and_ann_recall(catalogue: Catalogue, tmp_path: Path, redis_prefix: str) -> None:
    root = tmp_path / "indexes"
    first = write_version(root, catalogue, rows=list(range(40)))
    probe_path = tmp_path / "probes.jsonl"
    probes = probes_from_captions([(r.id, r.captions) for r in catalogue.records[:40]], n=6, seed=1)
    save_probe_set(probes, probe_path)
    settings = make_settings(
        root,
        redis_url=REDIS_URL,
        cache_prefix=f"{redis_prefix}svcmon:",
        probe_set=probe_path,
        probe_interval_min=0,
        probe_pause_s=0.0,
        probe_depth=20,
        traffic_flush_s=0.2,
        ann_sample_rate=1.0,
    )
    with LiveServer(settings) as live, live.client() as client:
        runs = wait_for(lambda: history(client)["runs"], lambda r: len(r) >= 1, "the startup probe")
        assert runs[0]["source"] == "startup" and runs[0]["index_version"] == first
        assert runs[0]["n_probes"] == 6 and len(runs[0]["per_language"]) == 10
        assert runs[0]["model"] == "ccrk-demo" and runs[0]["depth"] == 20

        # Live searches in two languages; every one is also an ANN sample (Flat index: recall 1).
        de_text = catalogue.records[0].captions["de"][0]
        ja_text = catalogue.records[1].captions["ja"][0]
        for text, lang in ((de_text, "de"), (de_text, "de"), (ja_text, "ja")):
            assert (
                client.post("/v1/search", json={"query": text, "lang": lang, "top_k": 5}).status_code == 200
            )

        def traffic() -> dict[str, dict[str, Any]]:
            return {t["lang"]: t for t in history(client)["traffic"]}

        seen = wait_for(
            traffic,
            lambda t: (
                t.get("de", {}).get("count") == 2
                and t.get("ja", {}).get("ann_samples") == 1
                and t.get("de", {}).get("ann_samples") == 2
            ),
            "traffic and ANN samples",
        )
        assert seen["de"]["zero_result_rate"] == 0.0 and seen["ja"]["count"] == 1
        assert seen["de"]["ann_recall_at_10"] == 1.0 and seen["de"]["latency_ms_p50"] is not None
        assert 0.0 < seen["de"]["mean_top_score"] <= 1.0
        only_ja = history(client, lang="ja")
        assert {t["lang"] for t in only_ja["traffic"]} == {"ja"}
        assert all(list(r["per_language"]) == ["ja"] for r in only_ja["runs"])

        # A newly published version is probed after the swap.
        second = write_version(root, catalogue)
        runs = wait_for(
            lambda: history(client)["runs"],
            lambda r: any(x["index_version"] == second for x in r),
            "swap probe",
        )
        swap = next(r for r in runs if r["index_version"] == second)
        assert swap["source"] == "swap"
        marks = [(m["kind"], m["label"]) for m in history(client)["markers"]]
        assert marks == [("index", first), ("index", second)]

        # since in the future: nothing; bad inputs name the field.
        assert history(client, since="2999-01-01T00:00:00Z")["runs"] == []
        bad = client.get("/v1/consistency/history", params={"lang": "xx"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "lang"]
        bad = client.get("/v1/consistency/history", params={"since": "yesterday"})
        assert bad.status_code == 422 and "since" in bad.json()["detail"][0]["loc"]
        page = client.get("/dashboard")
        assert page.status_code == 200 and "chart-mrv" in page.text and second in page.text
