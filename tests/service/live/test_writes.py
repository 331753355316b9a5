"""Product writes through the API (``service.live``): a price change reorders a ``sort: price`` query and an
out-of-stock product leaves an ``in_stock`` filter, in the writing server at once and in a second server
of the same index (another process's stand-in: its own app, runtime and log connection) within a poll;
deletes hide a product everywhere; writes survive a restart; scopes and bad input get the 4xx naming the
field; a log that does not answer gets a 503 with Retry-After and nothing written. The shipped demo model,
a synthetic catalogue built by the real indexer, real uvicorn."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ccrk_settings import Settings
from service.keys import KeyStore
from store.live import changelog_path
from tests.fixtures import LiveServer, make_settings
from tests.service.live.shop import BY_PRICE, EVERY, QUERY, build_shop


@dataclass
class Shop:
    root: Path
    settings: Settings
    a: LiveServer
    b: LiveServer
    write_key: str
    search_key: str
    other_key: str  # a write key of another index


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    tmp = tmp_path_factory.mktemp("live")
    build_settings = build_shop(tmp, "shop")
    keys = KeyStore(build_settings.index_root)
    _, write_key = keys.create("write", ["shop"])
    _, search_key = keys.create("search", ["shop"])
    _, other_key = keys.create("write", ["other"])
    settings = make_settings(build_settings.index_root, index_name="shop")
    with LiveServer(settings) as a, LiveServer(settings) as b:
        yield Shop(build_settings.index_root, settings, a, b, write_key, search_key, other_key)


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> float:
    """Seconds until ``check()`` holds (fails the test past ``timeout``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "not visible in time"
        time.sleep(0.02)
    return time.monotonic() - start


def settled(shop: Shop) -> None:
    """Until the second server shows every write the first one does (the tests run in any order)."""

    def shown(server: LiveServer) -> int:
        return server.app.state.runtime.holder.served.index.live_sequence

    wait_until(lambda: shown(shop.b) >= shown(shop.a))


def ids(server: LiveServer, body: dict[str, Any]) -> list[str]:
    with server.client() as client:
        answer = client.post("/v1/search", json=body)
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def write(shop: Shop, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key if key is not None else shop.write_key}"}
    headers.update(kwargs.pop("headers", {}))
    with shop.a.client() as client:
        return client.request(method, path, headers=headers, **kwargs)


def test_a_price_change_reorders_a_sort_by_price_in_both_servers(shop: Shop) -> None:
    settled(shop)
    before = ids(shop.a, BY_PRICE)
    assert len(before) >= 3 and ids(shop.b, BY_PRICE) == before
    dearest = before[-1]
    answer = write(shop, "PATCH", f"/v1/indexes/shop/products/{dearest}", json={"fields": {"price": 0.01}})
    assert answer.status_code == 200, answer.text
    receipt = answer.json()
    assert receipt["id"] == dearest and receipt["kind"] == "patch" and receipt["visible"] is True
    assert receipt["seq"] >= 1
    assert ids(shop.a, BY_PRICE)[0] == dearest  # the writer shows it as it answers
    wait_until(lambda: ids(shop.b, BY_PRICE)[0] == dearest)  # the other server's poll (no timed assertion)
    # The hit's metadata says the new price, in both.
    for server in (shop.a, shop.b):
        with server.client() as client:
            hits = client.post("/v1/search", json=BY_PRICE).json()["results"]
        assert hits[0]["metadata"]["price"] == 0.01


def test_an_out_of_stock_product_leaves_an_in_stock_filter(shop: Shop) -> None:
    in_stock = {**QUERY, "filters": {"in_stock": True}}
    before = ids(shop.a, in_stock)
    gone = before[0]
    answer = write(shop, "PATCH", f"/v1/products/{gone}", json={"fields": {"in_stock": False}})
    assert answer.status_code == 200, answer.text
    assert gone not in ids(shop.a, in_stock)
    wait_until(lambda: gone not in ids(shop.b, in_stock))
    assert gone in ids(shop.a, {**QUERY, "filters": {"in_stock": False}})
    with shop.b.client() as client:
        facets = client.post("/v1/search", json={**QUERY, "facets": ["in_stock"]}).json()["facets"]
    counts = {v["value"]: v["count"] for v in facets[0]["values"]}
    assert counts.get(False, 0) >= 1


def test_a_deleted_product_is_gone_from_searches_and_writes(shop: Shop) -> None:
    others = {f"prod-{n}" for n in (*range(8), *range(20, 30))}  # the other tests' products
    every = [i for i in ids(shop.a, QUERY) if i not in others]
    victim = every[len(every) // 2]
    answer = write(shop, "DELETE", f"/v1/indexes/shop/products/{victim}")
    assert answer.status_code == 200 and answer.json()["kind"] == "delete", answer.text
    assert victim not in ids(shop.a, QUERY)
    wait_until(lambda: victim not in ids(shop.b, QUERY))
    again = write(shop, "PATCH", f"/v1/products/{victim}", json={"fields": {"price": 1.0}})
    assert again.status_code == 404 and again.json()["detail"][0]["loc"] == ["path", "item_id"]
    with shop.b.client() as client:
        assert client.post(f"/v1/items/{victim}/similar", json={}).status_code == 404


def test_writes_survive_a_restart(shop: Shop) -> None:
    answer = write(shop, "PATCH", "/v1/products/prod-3", json={"fields": {"price": 77.0, "colour": "red"}})
    assert answer.status_code == 200
    with LiveServer(shop.settings) as fresh, fresh.client() as client:
        hits = client.post("/v1/search", json={**EVERY, "filters": {"colour": "red"}}).json()["results"]
    assert [(h["id"], h["metadata"]["price"]) for h in hits] == [("prod-3", 77.0)]


def test_writes_need_a_write_key_of_the_index(shop: Shop) -> None:
    body = {"json": {"fields": {"price": 2.0}}}
    assert write(shop, "PATCH", "/v1/products/prod-1", key=shop.search_key, **body).status_code == 403
    assert write(shop, "PATCH", "/v1/products/prod-1", key=shop.other_key, **body).status_code == 403
    assert write(shop, "DELETE", "/v1/products/prod-1", key=shop.search_key).status_code == 403
    assert write(shop, "PATCH", "/v1/products/prod-1", key="ccrk_wrong", **body).status_code == 401
    with shop.a.client() as client:
        assert client.patch("/v1/products/prod-1", **body).status_code == 401
    admin = write(shop, "PATCH", "/v1/products/prod-1", key="test-admin-key", **body)
    assert admin.status_code == 200, admin.text


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"fields": {"price": "cheap"}}, ["body", "fields", "price"]),
        ({"fields": {"in_stock": 1}}, ["body", "fields", "in_stock"]),
        ({"fields": {}}, ["body", "fields"]),
        ({"fields": {"price": 1.0}, "text": {"title": "new"}}, ["body", "text"]),
        ({"fields": {"bad name!": 1}}, ["body", "fields", "bad name!"]),
        ({"fields": {"title": "a new title"}}, ["body", "fields", "title"]),
        ({"fields": {"id": "prod-9"}}, ["body", "fields", "id"]),
        ({"fields": {"big": 2**64}}, ["body", "fields", "big"]),
        ({"fields": {"title@de": "ein Titel"}}, ["body", "fields", "title@de"]),
        ({}, ["body", "fields"]),
    ],
)
def test_bad_writes_get_a_422_naming_the_field(shop: Shop, body: dict[str, Any], loc: list[Any]) -> None:
    answer = write(shop, "PATCH", "/v1/products/prod-2", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"][: len(loc)] == loc


@pytest.mark.parametrize(
    ("body", "field"),
    [(b'{"fields": {"price": NaN}}', "price"), (b'{"fields": {"note": "\\ud800"}}', "note")],
)
def test_a_non_finite_number_or_a_lone_surrogate_is_refused_naming_the_field(
    shop: Shop, body: bytes, field: str
) -> None:
    headers = {"Content-Type": "application/json"}
    answer = write(shop, "PATCH", "/v1/products/prod-2", content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert field in json.dumps(answer.json()["detail"][0]["loc"])


def test_an_unknown_product_is_a_404(shop: Shop) -> None:
    answer = write(shop, "PATCH", "/v1/products/no-such", json={"fields": {"price": 1.0}})
    assert answer.status_code == 404 and answer.json()["detail"][0]["loc"] == ["path", "item_id"]
    assert write(shop, "DELETE", "/v1/indexes/shop/products/no-such").status_code == 404
    nowhere = write(shop, "DELETE", "/v1/indexes/nowhere/products/prod-1", key="test-admin-key")
    assert nowhere.status_code == 404


def test_a_log_that_does_not_answer_is_a_503_with_nothing_written(shop: Shop) -> None:
    path = changelog_path(shop.root, "shop")
    holder = sqlite3.connect(path, timeout=1, isolation_level=None)
    (last,) = holder.execute("SELECT value FROM log_state WHERE key = 'last_sequence'").fetchone()
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the log past the busy timeout
    try:
        answer = write(shop, "PATCH", "/v1/products/prod-4", json={"fields": {"price": 4.0}}, timeout=60)
    finally:
        holder.execute("ROLLBACK")
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert holder.execute("SELECT value FROM log_state WHERE key = 'last_sequence'").fetchone()[0] == last
    holder.close()
    assert write(shop, "PATCH", "/v1/products/prod-4", json={"fields": {"price": 4.0}}).status_code == 200


def test_metrics_and_readiness_show_the_live_catalogue(shop: Shop) -> None:
    seq = write(shop, "PATCH", "/v1/products/prod-5", json={"fields": {"price": 5.5}}).json()["seq"]
    wait_until(lambda: shop.b.app.state.runtime.holder.served.index.live_sequence >= seq)
    for server in (shop.a, shop.b):
        with server.client() as client:
            text = client.get("/metrics").text
            ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["change_logs"] is None
        prefix = 'ccrk_live_applied_sequence{index="shop"}'
        applied = [line for line in text.splitlines() if line.startswith(prefix)]
        assert applied and float(applied[0].split()[-1]) >= seq
        assert 'ccrk_live_apply_lag_seconds_count{index="shop"}' in text
    with shop.a.client() as client:  # the writer counted its writes
        text = client.get("/metrics").text
    assert 'ccrk_live_writes_total{index="shop",kind="patch",outcome="ok"}' in text


def test_compact_folds_the_writes_and_keeps_the_answers(shop: Shop) -> None:
    from indexer.live_compact import compact
    from store.live import SqliteChangeLog

    write(shop, "PATCH", "/v1/products/prod-7", json={"fields": {"price": 0.7, "colour": "green"}})
    settled(shop)
    before = {server.url: ids(server, BY_PRICE) for server in (shop.a, shop.b)}
    old = shop.a.app.state.runtime.holder.served.version
    report = compact("shop", settings=Settings(index_root=shop.root))
    assert report.published, report.notes
    for server in (shop.a, shop.b):
        holder = server.app.state.runtime.holder
        wait_until(lambda h=holder: h.served.version == report.version, timeout=10)
        assert holder.served.index.overlay.snapshot.empty  # the version holds every change itself
        assert ids(server, BY_PRICE) == before[server.url]
        assert ids(server, {**EVERY, "filters": {"colour": "green"}}) == ["prod-7"]
    assert old != report.version
    with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
        assert log.pending() == 0
    # A write after the fold shows over the new version.
    answer = write(shop, "PATCH", "/v1/products/prod-7", json={"fields": {"colour": "teal"}})
    assert answer.status_code == 200
    wait_until(lambda: ids(shop.b, {**EVERY, "filters": {"colour": "teal"}}) == ["prod-7"])


def ndjson(*lines: object) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def last_sequence(shop: Shop) -> int:
    with sqlite3.connect(changelog_path(shop.root, "shop")) as conn:
        return conn.execute("SELECT value FROM log_state WHERE key = 'last_sequence'").fetchone()[0]


def test_a_batch_is_written_in_one_transaction(shop: Shop) -> None:
    body = ndjson(
        {"op": "patch", "id": "prod-25", "fields": {"lot": "clearance", "price": 2.5}},
        "",
        {"op": "patch", "id": "prod-26", "fields": {"lot": "clearance"}},
        {"op": "delete", "id": "prod-28"},
    )
    headers = {"Content-Type": "application/x-ndjson"}
    answer = write(shop, "POST", "/v1/indexes/shop/products/batch", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    receipt = answer.json()
    assert receipt["count"] == 3 and receipt["last_seq"] == receipt["first_seq"] + 2 and receipt["visible"]
    settled(shop)  # a field new to the catalogue is a known filter field once a server shows the write
    assert sorted(ids(shop.b, {**EVERY, "filters": {"lot": "clearance"}})) == ["prod-25", "prod-26"]
    assert "prod-28" not in ids(shop.b, EVERY)


@pytest.mark.parametrize(
    ("lines", "status", "loc"),
    [
        (
            [{"op": "patch", "id": "prod-21", "fields": {"x": 1}}, {"op": "delete", "id": "no-such"}],
            404,
            ["body", 1, "id"],
        ),
        (
            [{"op": "patch", "id": "prod-21", "fields": {"price": "cheap"}}],
            422,
            ["body", 0, "fields", "price"],
        ),
        ([{"op": "patch", "id": "prod-21", "fields": {"x": 1}}, "{not json"], 422, ["body", 1]),
        ([{"op": "upsert", "id": "prod-21"}], 422, ["body", 0]),
        ([{"op": "delete", "id": "prod-21", "fields": {}}], 422, ["body", 0]),
        ([], 422, ["body"]),
    ],
)
def test_a_bad_batch_writes_nothing_and_names_the_line(
    shop: Shop, lines: list[object], status: int, loc: list[object]
) -> None:
    before = last_sequence(shop)
    headers = {"Content-Type": "application/x-ndjson"}
    answer = write(shop, "POST", "/v1/products/batch", content=ndjson(*lines), headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"][0]["loc"][: len(loc)] == loc
    assert last_sequence(shop) == before


def test_delete_by_filter_removes_every_match(shop: Shop) -> None:
    lot = {"lot": "discontinued"}
    body = ndjson(*({"op": "patch", "id": f"prod-{i}", "fields": lot} for i in (22, 23, 24)))
    assert write(shop, "POST", "/v1/products/batch", content=body).status_code == 200
    answer = write(shop, "POST", "/v1/indexes/shop/products/delete", json={"filters": lot})
    assert answer.status_code == 200 and answer.json()["count"] == 3, answer.text
    settled(shop)
    assert ids(shop.b, {**EVERY, "filters": lot}) == []
    assert not {"prod-22", "prod-23", "prod-24"} & set(ids(shop.a, EVERY))
    again = write(shop, "POST", "/v1/products/delete", json={"filters": lot})
    assert again.json() == {"count": 0, "first_seq": None, "last_seq": None, "visible": True}
    unknown = write(shop, "POST", "/v1/products/delete", json={"filters": {"nope": 1}})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"][:3] == [
        "body",
        "filters",
        "nope",
    ]
