"""Search analytics through a real uvicorn (``service.analytics``): every text and photo search answers with
a query id and is logged off its path (the stored rows read back: the normalised text or the photo's
digest, the language, the label, the page's products, the key's id, and never the key or the client's
address); events need a key of scope events, and an unknown query id, a bad kind or too many events get a
422 naming the field; the report's CTR and MRR per language equal those of the simulated shoppers who
clicked here, and its top ``none`` queries are the ones that failed; analytics off: no query id, no log."""

from __future__ import annotations

import http.client
import io
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from service.keys import KeyStore
from tests.fixtures import INDEX_NAME, Catalogue, LiveServer, make_settings, write_version

ADMIN = {"X-API-Key": "test-admin-key"}


@dataclass
class Shop:
    server: LiveServer
    root: Path
    history: Path
    search_key: str
    search_key_id: str
    events_key: str
    events_key_id: str


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue) -> Iterator[Shop]:
    root = tmp_path_factory.mktemp("analytics-indexes")
    write_version(root, catalogue)
    keys = KeyStore(root)
    search_record, search_key = keys.create("search", [INDEX_NAME])
    events_record, events_key = keys.create("events", [INDEX_NAME])
    history = tmp_path_factory.mktemp("analytics-history") / "monitoring.sqlite"
    settings = make_settings(root, history_db=history, analytics_flush_s=0.1)
    with LiveServer(settings) as live:
        yield Shop(live, root, history, search_key, search_record.id, events_key, events_record.id)


def rows(shop: Shop, sql: str, named: bool = False) -> list:
    """The stored rows, once every search so far is written (the recorder's buffer flushed)."""
    recorder = shop.server.app.state.runtime.recorder(INDEX_NAME)
    recorder.flush()
    db = sqlite3.connect(shop.history.parent / f"{INDEX_NAME}.analytics.sqlite")
    if named:
        db.row_factory = sqlite3.Row
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def search(shop: Shop, body: dict, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key or shop.search_key}"}
    with shop.server.client() as client:
        answer = client.post("/v1/search", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def send(shop: Shop, events: list[dict], key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or shop.events_key}"} if key != "" else {}
    with shop.server.client() as client:
        return client.post("/v1/events", json={"events": events}, headers=headers)


def test_a_search_is_logged_with_its_query_id_and_never_the_key_or_address(
    shop: Shop, catalogue: Catalogue
) -> None:
    caption = catalogue.records[3].captions["de"][0]
    body = search(shop, {"query": f"  {caption.upper()}  ", "top_k": 5})
    qid = body["query_id"]
    assert qid and qid.startswith("q")
    (row,) = rows(shop, f"SELECT * FROM queries WHERE query_id = '{qid}'", named=True)
    db_row = dict(row)
    assert db_row["query"] == " ".join(caption.casefold().split())
    assert (db_row["kind"], db_row["lang"], db_row["results"]) == ("text", body["language"]["code"], 5)
    assert db_row["label"] == body["match"]
    assert db_row["top_ids"] == str([h["id"] for h in body["results"]]).replace("'", '"')
    everything = rows(shop, "SELECT * FROM queries") + rows(shop, "SELECT * FROM events")
    text = repr(everything)
    assert shop.search_key not in text and "127.0.0.1" not in text
    assert db_row["key_id"] == shop.search_key_id


def test_a_photo_search_is_logged_by_its_digest(shop: Shop, catalogue: Catalogue) -> None:
    buf = io.BytesIO()
    Image.open(catalogue.records[0].image).convert("RGB").save(buf, "PNG")
    with shop.server.client() as client:
        answer = client.post(
            "/v1/search/image",
            files={"file": ("q.png", buf.getvalue(), "image/png")},
            headers={"Authorization": f"Bearer {shop.search_key}"},
        )
    assert answer.status_code == 200, answer.text
    qid = answer.json()["query_id"]
    ((kind, query, photo, first),) = rows(
        shop,
        f"SELECT kind, query, photo, json_extract(top_ids, '$[0]') FROM queries WHERE query_id = '{qid}'",
    )
    assert (kind, query, len(photo), first) == ("photo", None, 32, answer.json()["results"][0]["id"])


def test_events_need_an_events_key_and_a_known_query_id(shop: Shop, catalogue: Catalogue) -> None:
    body = search(shop, {"query": catalogue.records[1].captions["en"][0], "top_k": 3})
    event = {"kind": "click", "query_id": body["query_id"], "product_id": body["results"][0]["id"]}
    assert send(shop, [event], key="").status_code == 401
    assert send(shop, [event], key=shop.search_key).status_code == 403
    with shop.server.client() as client:  # the admin key may send them too
        assert client.post("/v1/events", json={"events": [event]}, headers=ADMIN).status_code == 200
    cases = [
        ([event, {**event, "query_id": "q" + "A" * 32}], ["body", "events", 1, "query_id"]),
        ([{**event, "query_id": body["query_id"][:-1] + "x"}], ["body", "events", 0, "query_id"]),
        ([{**event, "kind": "like"}], ["body", "events", 0, "kind"]),
        ([event] * 101, ["body", "events"]),
        ([{**event, "extra": 1}], ["body", "events", 0, "extra"]),
    ]
    before = rows(shop, "SELECT COUNT(*) FROM events")
    for events, loc in cases:
        answer = send(shop, events)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == loc
    assert rows(shop, "SELECT COUNT(*) FROM events") == before  # all or nothing
    answer = send(shop, [event, {**event, "kind": "add_to_cart"}])
    assert answer.status_code == 200 and answer.json() == {"accepted": 2}
    stored = rows(shop, f"SELECT kind, product_id, key_id FROM events WHERE query_id = '{body['query_id']}'")
    assert ("add_to_cart", event["product_id"], shop.events_key_id) in stored


def test_the_report_has_the_simulated_ctr_mrr_and_failing_queries(shop: Shop, catalogue: Catalogue) -> None:
    """Shoppers in three languages click the searched product (where it is on the page) for a known share
    of their searches; a query of nonsense finds nothing that matches ('none'). The report equals what they
    did, computed here from the answers."""
    started = time.time()
    expected: dict[str, list[float]] = {}  # lang: [searches, clicked, sum of 1 / rank]
    nonsense = "zzqx vvkk"
    share = {"en": 2, "de": 3, "fr": 4}  # every 2nd, 3rd, 4th search clicked
    for lang, every in share.items():
        totals = expected.setdefault(lang, [0, 0, 0.0])
        for n, record in enumerate(catalogue.records[:24]):
            body = search(shop, {"query": record.captions[lang][0], "top_k": 10, "lang": lang})
            totals[0] += 1
            ids = [h["id"] for h in body["results"]]
            if n % every == 0 and record.id in ids:
                assert (
                    send(
                        shop, [{"kind": "click", "query_id": body["query_id"], "product_id": record.id}]
                    ).status_code
                    == 200
                )
                totals[1] += 1
                totals[2] += 1.0 / (ids.index(record.id) + 1)
    nones = 0
    for _ in range(3):
        body = search(shop, {"query": nonsense, "top_k": 10, "lang": "en"})
        expected["en"][0] += 1
        nones += body["match"] == "none"
    rows(shop, "SELECT 1")  # flushed
    with shop.server.client() as client:
        answer = client.get("/v1/analytics", params={"since": started, "top": 5}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    report = {x["lang"]: x for x in answer.json()["languages"]}
    assert set(report) == set(share)
    for lang, (searches, clicked, rr) in expected.items():
        got = report[lang]
        assert (got["queries"], got["clicked"]) == (searches, clicked)
        assert got["ctr"] == pytest.approx(clicked / searches, abs=1e-6)
        assert got["mrr"] == pytest.approx(rr / searches, abs=1e-6)
    assert nones == 3, "the nonsense query is labelled none"
    assert report["en"]["top_none_queries"][0] == {"query": nonsense, "count": nones}
    best = max(report[x]["ctr"] for x in report)
    assert all(report[x]["ctr_gap"] == pytest.approx(best - report[x]["ctr"], abs=1e-6) for x in report)
    with shop.server.client() as client:
        assert (
            client.get("/v1/analytics", headers={"Authorization": f"Bearer {shop.events_key}"}).status_code
            == 403
        )
        assert client.get("/v1/analytics", params={"since": 10, "until": 5}, headers=ADMIN).status_code == 422


def test_analytics_off_logs_nothing(tmp_path: Path, catalogue: Catalogue) -> None:
    root = tmp_path / "indexes"
    write_version(root, catalogue)
    history = tmp_path / "history" / "monitoring.sqlite"
    history.parent.mkdir()
    with (
        LiveServer(make_settings(root, history_db=history, analytics=False)) as live,
        live.client() as client,
    ):
        body = client.post("/v1/search", json={"query": "a red umbrella", "top_k": 3}).json()
        assert body["query_id"] is None
        event = {"kind": "click", "query_id": "q" + "A" * 32, "product_id": "x"}
        assert client.post("/v1/events", json={"events": [event]}, headers=ADMIN).status_code == 404
    assert not list(history.parent.glob("*.analytics.sqlite"))


def test_the_cli_report_reads_the_same_log(
    shop: Shop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ccrk_cli.main import app
    from ccrk_settings import get_settings

    rows(shop, "SELECT 1")  # flushed
    out = tmp_path / "report.json"
    monkeypatch.setenv("CCRK_INDEX_ROOT", str(shop.root))
    monkeypatch.setenv("CCRK_HISTORY_DB", str(shop.history))
    get_settings.cache_clear()  # the process's settings are read again, from this environment
    try:
        result = CliRunner().invoke(app, ["analytics", "report", "--index", INDEX_NAME, "--json", str(out)])
        missing = CliRunner().invoke(app, ["analytics", "report", "--index", "nowhere"])
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    with shop.server.client() as client:
        api = client.get("/v1/analytics", headers=ADMIN).json()
    cli = json.loads(out.read_text())
    by = lambda report: {x["lang"]: (x["queries"], x["clicked"], x["mrr"]) for x in report["languages"]}  # noqa: E731
    assert by(cli) == by(api) and by(cli)
    assert missing.exit_code == 2 and "no query log for index 'nowhere'" in missing.output


def test_kill_9_under_load_loses_at_most_the_last_flush_interval(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """``ccrk serve --workers 2`` under two clients' searches, ``kill -9`` of every process: every search
    answered more than one flush interval (plus a write's time) before the kill is in the log."""
    from tests.service.live.test_processes import Serve, request

    root = tmp_path / "indexes"
    write_version(root, catalogue)
    flush_s = 0.3
    serve = Serve(
        root, ["--workers", "2", "--index-name", INDEX_NAME], {"CCRK_ANALYTICS_FLUSH_S": str(flush_s)}
    )
    answered: list[tuple[float, str]] = []
    stop = threading.Event()

    def client(n: int) -> None:
        conn = serve.connect()
        i = 0
        while not stop.is_set():
            try:
                status, body = request(
                    conn, "POST", "/v1/search", {"query": f"a red umbrella {n} {i}", "top_k": 3}
                )
            except (OSError, http.client.HTTPException):
                return
            if status == 200:
                answered.append((time.monotonic(), body["query_id"]))
            i += 1

    try:
        serve.start()
        threads = [threading.Thread(target=client, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        time.sleep(4.0)
        killed_at = time.monotonic()
        serve.kill()
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        serve.kill()
    history = root.parent / f"history-{serve.port}.sqlite"
    db = sqlite3.connect(history.parent / f"{INDEX_NAME}.analytics.sqlite")
    logged = {qid for (qid,) in db.execute("SELECT query_id FROM queries")}
    db.close()
    assert len(answered) > 50
    lost = [(at, qid) for at, qid in answered if qid not in logged]
    bound = killed_at - (flush_s + 1.0)  # the last interval, and a write's own time
    assert all(at >= bound for at, _ in lost), (len(lost), [killed_at - at for at, _ in lost][:5])
    assert len(lost) < len(answered) / 2  # most were written before the kill


def _recorder(tmp_path: Path, capacity: int) -> tuple[Any, Any]:
    from service.analytics import QueryRecorder
    from service.schemas import SearchRequest, SearchResponse
    from store.analytics import QueryIds, QueryLog

    log = QueryLog(tmp_path / "r.analytics.sqlite", retention_s=86400.0, max_rows=10_000)
    recorder = QueryRecorder("shop", log, QueryIds(b"s" * 32, "shop"), capacity=capacity, flush_s=60.0,
                             event_window_s=60.0)  # fmt: skip
    response = SearchResponse.model_validate(
        {"results": [], "mode": "hybrid", "language": {"code": "en", "confidence": 0.9, "source": "detected",
         "supported": True}, "index_version": "v", "model": "m", "reranked": False,
         "timings_ms": {"encode": 1.0, "search": 1.0, "rerank": 0.0, "total": 2.0}, "cached": False}
    )  # fmt: skip
    return recorder, lambda text: recorder.text(SearchRequest(query=text), response, None)


def test_a_full_buffer_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    recorder, search = _recorder(tmp_path, capacity=10)
    ids = [search(f"query {i}") for i in range(15)]
    assert recorder.dropped == 5 and recorder.buffered() == 10
    assert recorder.flush() == 10
    logged = {qid for (qid,) in recorder.log.read("SELECT query_id FROM queries")}
    assert logged == set(ids[5:])  # the newest kept
    recorder.close()


def test_a_failed_write_drops_its_rows_and_says_why(tmp_path: Path) -> None:
    recorder, search = _recorder(tmp_path, capacity=100)
    for i in range(3):
        search(f"query {i}")
    recorder.log._db.close()  # the log cannot be written now (as on a full disk)
    assert recorder.flush() == 0
    assert recorder.dropped == 3 and recorder.problem and recorder.buffered() == 0
    search("after")  # searches go on
    assert recorder.buffered() == 1


def test_the_public_dashboard_shows_rates_not_query_texts(shop: Shop) -> None:
    body = search(shop, {"query": "qqzx secret words", "top_k": 3})
    assert body["query_id"]
    rows(shop, "SELECT 1")  # flushed
    with shop.server.client() as client:
        page = client.get("/dashboard", params={"hours": 1})
    assert page.status_code == 200
    assert 'id="analytics"' in page.text and 'id="chart-none-rate"' in page.text
    assert "qqzx" not in page.text and "none-queries" not in page.text  # CCRK_DASHBOARD_QUERIES is off


@pytest.mark.parametrize(
    ("path", "params", "loc"),
    [
        ("/v1/analytics", {"since": "inf"}, ["query", "since"]),
        ("/v1/analytics", {"until": "-1"}, ["query", "until"]),
        ("/v1/analytics", {"top": "0"}, ["query", "top"]),
        ("/v1/analytics", {"bucket_s": "1"}, ["query", "bucket_s"]),
        ("/", {"q": "x", "mode": "everything"}, ["query", "mode"]),
        ("/", {"q": "x", "typos": "9"}, ["query", "typos"]),
        ("/", {"q": "x", "synonyms": "perhaps"}, ["query", "synonyms"]),
    ],
)
def test_hostile_report_and_page_parameters_get_a_422_naming_them(
    shop: Shop, path: str, params: dict[str, str], loc: list[str]
) -> None:
    with shop.server.client() as client:
        answer = client.get(path, params=params, headers=ADMIN)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize("value", [5, [True], {"on": True}, None])
def test_a_synonyms_field_that_is_not_a_boolean_gets_a_422(shop: Shop, value: object) -> None:
    with shop.server.client() as client:
        answer = client.post("/v1/search", json={"query": "a red umbrella", "synonyms": value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "synonyms"]
