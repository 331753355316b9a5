"""Match quality end to end: an index built with captions carries its calibration; queries that match
nothing are labelled none/weak, in-domain captions strong; min_score filters; the no-match rate reaches
/metrics and the dashboard's traffic history."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from synthetic.catalogue import load_split
from synthetic.synth import SynthConfig, generate_catalogue
from tests.fixtures import LiveServer, make_settings

# Written for this test: other domains, mashes, scripts the demo model does not know, code.
NO_MATCH = (
    "asdfgh",
    "qwertz uiop",
    "SELECT * FROM users",
    "<script>alert(1)</script>",
    "weather forecast for tomorrow",
    "Steuererklärung online",
    "résultats du match de football",
    "прогноз погоды",
    "明日の天気",
    "明天天气怎么样",
    "무선 헤드폰",
    "سماعات لاسلكية",
    "वायरलेस हेडफ़ोन",
    "καιρός αύριο",
)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    data = tmp_path_factory.mktemp("shop")
    generate_catalogue(data, SynthConfig(seed=21, n_train=0, n_val=0, n_test=120), workers=1)
    root = tmp_path_factory.mktemp("indexes")
    settings = Settings(model_dir=DEFAULT_MODEL_DIR, index_root=root, threads=1, index_workers=0)
    assert build("shop", [data / "test.jsonl"], settings=settings).published
    return root, load_split(data / "test.jsonl")


@pytest.fixture(scope="module")
def server(calibrated: tuple[Path, list]) -> Iterator[LiveServer]:
    with LiveServer(make_settings(calibrated[0], traffic_flush_s=0.5)) as live:
        yield live


@pytest.fixture()
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_no_match_queries_are_none_or_weak_and_captions_strong(
    client: httpx.Client, calibrated: tuple[Path, list]
) -> None:
    labels = [client.post("/v1/search", json={"query": q, "top_k": 5}).json()["match"] for q in NO_MATCH]
    assert set(labels) <= {"none", "weak"}, dict(zip(NO_MATCH, labels, strict=True))
    assert labels.count("none") >= 0.8 * len(NO_MATCH), dict(zip(NO_MATCH, labels, strict=True))
    records = calibrated[1]
    strong = 0
    for n, lang in enumerate(("en", "de", "fr", "ja", "zh", "ru")):
        for record in records[n * 5 : n * 5 + 5]:
            answer = client.post("/v1/search", json={"query": record.captions[lang][1], "top_k": 5}).json()
            assert answer["match"] in ("strong", "weak"), (lang, record.id, answer["match"])
            strong += answer["match"] == "strong"
            assert answer["results"][0]["match"] == answer["match"] or answer["reranked"]
    # The calibration aims at 90 % strong for whole captions (the 10th percentile); 30 queries.
    assert strong >= 24, strong


def test_min_score_filters(client: httpx.Client) -> None:
    body = {"query": "SELECT * FROM users", "top_k": 20}
    everything = client.post("/v1/search", json=body).json()
    assert len(everything["results"]) == 20 and everything["match"] == "none"
    thresholds = everything["match_thresholds"]
    assert thresholds["none_below"] <= thresholds["strong_from"]
    # What the label reads: the top result's cosine, under none_below for a "none".
    assert everything["match_score"] == pytest.approx(everything["results"][0]["score"], abs=1e-6)
    assert everything["match_score"] < thresholds["none_below"]
    assert client.post("/v1/search", json={**body, "min_score": "weak"}).json()["results"] == []
    assert client.post("/v1/search", json={**body, "min_score": "strong"}).json()["results"] == []
    floor = everything["results"][4]["score"]
    kept = client.post("/v1/search", json={**body, "min_score": floor}).json()["results"]
    assert [h["id"] for h in kept] == [h["id"] for h in everything["results"] if h["score"] >= floor]
    refused = client.post("/v1/search", json={**body, "min_score": "high"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][:2] == ["body", "min_score"]


def test_no_match_rate_reaches_metrics_and_history(client: httpx.Client) -> None:
    for query in ("asdfgh", "qwertz uiop", "xkcd zzz"):
        client.post("/v1/search", json={"query": query, "lang": "en"})
    metrics = client.get("/metrics").text
    line = next(
        x for x in metrics.splitlines() if x.startswith('ccrk_search_match_total{lang="en",match="none"}')
    )
    assert float(line.split()[-1]) >= 3
    deadline = time.monotonic() + 30
    while True:
        traffic = client.get("/v1/consistency/history", params={"lang": "en"}).json()["traffic"]
        rates = [t["no_match_rate"] for t in traffic if t["no_match_rate"] is not None]
        if rates and max(rates) > 0:
            break
        assert time.monotonic() < deadline, traffic
        time.sleep(0.3)


def test_a_version_without_calibration_is_calibrated_while_it_loads(index_root: Path) -> None:
    """An index written before match calibration existed: calibrated when the service loads it, so no
    search pays for it; searches then label with that calibration."""
    with LiveServer(make_settings(index_root)) as live:
        runtime = live.app.state.runtime
        assert not runtime.holder.served.index.manifest.match_calibration  # nothing recorded in the version
        assert runtime.holder.served.index in runtime.pipeline.judge._by_index  # measured before any search
        with live.client() as client:
            answer = client.post("/v1/search", json={"query": "SELECT * FROM users"}).json()
        assert answer["match"] in ("none", "weak") and answer["match_thresholds"] is not None


def test_a_malformed_recorded_calibration_is_measured_afresh(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The judge measures a version whose recorded calibration cannot be read, as one without any (a
    warning says why), instead of failing its load or every search of it."""
    from indexer.match_calibration import MatchCalibration, MatchThresholds
    from service import matching

    measured = MatchCalibration(MatchThresholds(0.2, 0.5))
    calls: list[object] = []

    def calibrate_version(index: object, encoder: object, captions: object) -> MatchCalibration:
        calls.append(index)
        return measured

    monkeypatch.setattr(matching, "calibrate_version", calibrate_version)
    judge = matching.MatchJudge(encoder=None)  # type: ignore[arg-type]
    recorded = ({"per_language": {}}, {"default": {"none_below": "low", "strong_from": 0.9}}, ["default"])
    for n, calibration in enumerate(recorded):
        served = SimpleNamespace(version=f"v{n}", index=_Index(calibration))
        assert judge.calibration(served) is measured  # type: ignore[arg-type]
    assert len(calls) == 3 and caplog.text.count("unreadable match calibration") == 3


class _Index:
    """An opened version's stand-in: hashed and weakly referenced by identity, as the real ones are."""

    def __init__(self, calibration: object = None) -> None:
        self.manifest = SimpleNamespace(match_calibration=calibration)


def test_every_served_version_is_calibrated_once_however_their_searches_interleave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Versions without a recorded calibration in more served indexes than the judge used to keep (4), one
    name in two of them (a name is unique only within its index: a copied index folder repeats them): each
    is measured once, at its first use, and keeps its own measurement for as long as it is open. The judge
    kept the last four version names for every index together, so shops searched in turn measured again at
    search time (seconds each), and two shops of one version name read the first one's labels."""
    from indexer.match_calibration import MatchCalibration, MatchThresholds
    from service import matching

    calls: list[object] = []

    def calibrate_version(index: object, encoder: object, captions: object) -> MatchCalibration:
        calls.append(index)
        return MatchCalibration(MatchThresholds(0.1 * len(calls), 0.9))

    monkeypatch.setattr(matching, "calibrate_version", calibrate_version)
    judge = matching.MatchJudge(encoder=None)  # type: ignore[arg-type]
    shops = [SimpleNamespace(version=f"2026-v{n}", index=_Index()) for n in range(6)]
    shops.append(SimpleNamespace(version="2026-v0", index=_Index()))  # another index, the same version name
    first = [judge.calibration(served) for served in shops]  # type: ignore[arg-type]
    for _ in range(3):
        for served, measured in zip(reversed(shops), reversed(first), strict=True):
            assert judge.calibration(served) is measured  # type: ignore[arg-type]
    assert calls == [served.index for served in shops]
    assert len({id(measured) for measured in first}) == len(shops)
    shops.pop()
    calls.clear()
    gc.collect()  # a version no longer served (its index closed and gone) takes its calibration with it
    assert len(judge._by_index) == len(shops)
