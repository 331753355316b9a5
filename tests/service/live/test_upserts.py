"""Products added through the API (``PUT /v1/indexes/{name}/products/{id}``, ``service.live``): a new product
with photos and text is found by its title in another language and by its photo, in the writing server at
once and in a second server within a poll; a replacement and a delete apply to it like to a built product;
it survives a restart; bad photos and fields get the 4xx naming the field. The shipped demo model, a
synthetic catalogue built by the real indexer, real uvicorn."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ccrk_settings import Settings
from indexer.live_compact import compact
from service.keys import KeyStore
from store.live import SqliteChangeLog, changelog_path
from tests.fixtures import LiveServer, make_settings
from tests.service.live.shop import PRODUCTS, build_shop
from tests.service.live.test_writes import wait_until

EXTRA = 10


@dataclass
class Shop:
    root: Path
    settings: Settings
    a: LiveServer
    b: LiveServer
    write_key: str
    search_key: str
    records: list[dict[str, Any]]  # the synthetic catalogue's records (the index holds the first PRODUCTS)
    catalogue: Path


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    tmp = tmp_path_factory.mktemp("upserts")
    build_settings = build_shop(tmp, "shop", extra=EXTRA)
    keys = KeyStore(build_settings.index_root)
    _, write_key = keys.create("write", ["shop"])
    _, search_key = keys.create("search", ["shop"])
    records = [json.loads(line) for line in (tmp / "cat" / "test.jsonl").read_text().splitlines()]
    settings = make_settings(build_settings.index_root, index_name="shop")
    with LiveServer(settings) as a, LiveServer(settings) as b:
        yield Shop(build_settings.index_root, settings, a, b, write_key, search_key, records, tmp / "cat")


def new_record(shop: Shop) -> tuple[int, dict[str, Any]]:
    """A record beyond the index whose category and colour no indexed product has (its query is its own)."""
    held = {(r["attributes"]["category"], r["attributes"]["colour"]) for r in shop.records[:PRODUCTS]}
    for n in range(PRODUCTS, PRODUCTS + EXTRA):
        rec = shop.records[n]
        if (rec["attributes"]["category"], rec["attributes"]["colour"]) not in held:
            return n, rec
    raise AssertionError("every extra record repeats an indexed one's category and colour")


def photo_of(shop: Shop, rec: dict[str, Any]) -> bytes:
    return (shop.catalogue / rec["image"]).read_bytes()


def put(shop: Shop, item_id: str, body: Any, key: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key if key is not None else shop.write_key}"}
    with shop.a.client() as client:
        return client.put(f"/v1/indexes/shop/products/{item_id}", json=body, headers=headers, **kwargs)


def upsert_body(shop: Shop, rec: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "fields": {"title": rec["captions"]["en"][0], "price": 9.25, "in_stock": True, **fields},
        "photos": [{"data": base64.b64encode(photo_of(shop, rec)).decode()}],
    }


def search_ids(server: LiveServer, body: dict[str, Any]) -> list[str]:
    with server.client() as client:
        answer = client.post("/v1/search", json=body)
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def image_ids(server: LiveServer, photo: bytes) -> list[str]:
    with server.client() as client:
        answer = client.post("/v1/search/image", files={"file": ("p.png", photo, "image/png")})
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def test_a_new_product_is_found_by_its_title_in_another_language_and_by_its_photo(shop: Shop) -> None:
    n, rec = new_record(shop)
    german = {"query": rec["captions"]["de"][1], "top_k": 5, "mode": "hybrid"}
    assert "new-1" not in search_ids(shop.a, german)
    answer = put(shop, "new-1", upsert_body(shop, rec, **{"title@fr": rec["captions"]["fr"][0]}))
    assert answer.status_code == 200, answer.text
    receipt = answer.json()
    assert receipt["kind"] == "upsert" and receipt["visible"] is True and receipt["id"] == "new-1"
    assert search_ids(shop.a, german)[0] == "new-1"  # the writer shows it as it answers
    wait_until(lambda: search_ids(shop.b, german)[:1] == ["new-1"], timeout=10)
    for server in (shop.a, shop.b):
        assert image_ids(server, photo_of(shop, rec))[0] == "new-1"
        with server.client() as client:
            hit = client.post("/v1/search", json=german).json()["results"][0]
            assert (
                hit["metadata"]["price"] == 9.25 and hit["metadata"]["title@fr"] == rec["captions"]["fr"][0]
            )
            # Its image is served from the photo store; filters and facets count it like a built product.
            image = client.get(hit["image_url"])
            assert image.status_code == 200 and image.content == photo_of(shop, rec)
            in_range = {"price": {"gte": 9.2, "lte": 9.3}}
            cheap = client.post("/v1/search", json={**german, "filters": in_range})
            assert [h["id"] for h in cheap.json()["results"]] == ["new-1"]
            counted = client.post("/v1/search", json={**german, "top_k": 50, "facets": ["in_stock"]}).json()
            stock = {v["value"]: v["count"] for v in counted["facets"][0]["values"]}
            assert "new-1" in [h["id"] for h in counted["results"]] and stock.get(True, 0) >= 1
            by_price = {**german, "top_k": 50, "sort": {"field": "price", "order": "asc"}}
            prices = [
                h["metadata"]["price"] for h in client.post("/v1/search", json=by_price).json()["results"]
            ]
            assert prices == sorted(prices) and 9.25 in prices
            similar = client.post("/v1/items/new-1/similar", json={"top_k": 3})
            assert similar.status_code == 200, similar.text
    del n


def test_a_replaced_or_deleted_upsert_shows_only_its_last_state(shop: Shop) -> None:
    _, rec = new_record(shop)
    first = put(shop, "new-2", upsert_body(shop, rec, price=3.0))
    assert first.status_code == 200, first.text
    again = put(shop, "new-2", upsert_body(shop, rec, price=4.0, colour="odd"))
    assert again.status_code == 200 and again.json()["seq"] > first.json()["seq"]
    every = {"query": rec["captions"]["en"][0], "top_k": 60, "mode": "hybrid", "min_score": -1.0}
    hits = [h for h in search_ids(shop.a, every) if h == "new-2"]
    assert hits == ["new-2"]  # one row, not two
    assert search_ids(shop.a, {**every, "filters": {"colour": "odd"}}) == ["new-2"]
    # A built product replaced whole: its old text no longer finds it, and it has no built fields left.
    built = "prod-5"
    replaced = put(shop, built, upsert_body(shop, rec, price=1.25))
    assert replaced.status_code == 200, replaced.text
    with shop.a.client() as client:
        hits = client.post("/v1/search", json={**every, "filters": {"price": 1.25}}).json()["results"]
    assert [h["id"] for h in hits] == [built] and "category" not in hits[0]["metadata"]
    headers = {"Authorization": f"Bearer {shop.write_key}"}
    with shop.a.client() as client:
        assert client.delete("/v1/indexes/shop/products/new-2", headers=headers).status_code == 200
        patched = client.patch("/v1/products/new-1", json={"fields": {"price": 8.0}}, headers=headers)
        assert patched.status_code == 200, patched.text
    assert "new-2" not in search_ids(shop.a, every)
    wait_until(lambda: "new-2" not in search_ids(shop.b, every), timeout=10)
    with shop.b.client() as client:
        hits = client.post("/v1/search", json={**every, "filters": {"price": 8.0}}).json()["results"]
    assert [h["id"] for h in hits] == ["new-1"]


def test_upserts_survive_a_restart_and_a_compaction(shop: Shop) -> None:
    _, rec = new_record(shop)
    german = {"query": rec["captions"]["de"][1], "top_k": 5, "mode": "hybrid"}
    assert put(shop, "new-3", upsert_body(shop, rec, sku="kept")).status_code == 200
    with LiveServer(shop.settings) as fresh:
        assert "new-3" in search_ids(fresh, german)
        assert search_ids(fresh, {**german, "filters": {"sku": "kept"}}) == ["new-3"]
    every = {"query": "a red umbrella", "top_k": 60, "mode": "hybrid", "min_score": -1.0}
    by_photo = photo_of(shop, rec)
    before = [(search(server, every), image_ids(server, by_photo)) for server in (shop.a, shop.b)]
    # A compaction folds the upserts too (a build of the catalogue, CURRENT's vectors reused): the log is
    # empty, and the answers are those of before it.
    report = compact("shop", settings=Settings(index_root=shop.root))
    assert report.published, report.notes
    assert any("by a build of the catalogue" in note for note in report.notes), report.notes
    assert report.items_reused > 0 and report.items_encoded < report.items_reused, report
    with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
        assert log.pending() == 0
        assert log.last_sequence() > 0
    for server, (hits, photo_hits) in zip((shop.a, shop.b), before, strict=True):
        holder = server.app.state.runtime.holder
        wait_until(lambda h=holder: h.served.version == report.version, timeout=10)
        after = search(server, every)
        # The same products, fields and leader; the scores move a little only, as the lexical channel's
        # statistics now count the upserted products in and the deleted ones out (a delta beside the
        # version cannot change the version's own), which may swap near-ties.
        assert {i: m for i, m, _ in after} == {i: m for i, m, _ in hits}
        assert after[0][0] == hits[0][0]
        scores = {i: score for i, _, score in hits}
        assert max(abs(score - scores[i]) for i, _, score in after) < 0.02, (after, hits)
        assert image_ids(server, by_photo) == photo_hits
        assert search_ids(server, {**german, "filters": {"sku": "kept"}}) == ["new-3"]


def search(server: LiveServer, body: dict[str, Any]) -> list[tuple[str, dict[str, Any], float]]:
    with server.client() as client:
        answer = client.post("/v1/search", json=body)
    assert answer.status_code == 200, answer.text
    return [(h["id"], h["metadata"], round(h["score"], 4)) for h in answer.json()["results"]]


@pytest.mark.parametrize(
    ("body", "status", "loc"),
    [
        ({"fields": {"title": 5}}, 422, ["body", "fields", "title"]),
        ({"fields": {"price": "cheap", "title": "x"}}, 422, ["body", "fields", "price"]),
        ({"fields": {"colour@de": "rot", "title": "x"}}, 422, ["body", "fields", "colour@de"]),
        ({"fields": {"price": 1.0}}, 422, ["body", "photos"]),
        ({"fields": {"path": "/etc/passwd", "title": "x"}}, 422, ["body", "fields", "path"]),
        ({"photos": [{"data": "not base64!"}]}, 422, ["body", "photos", 0, "data"]),
        ({"photos": [{"data": base64.b64encode(b"plain").decode()}]}, 415, ["body", "photos", 0, "data"]),
        ({"photos": [{"data": "x"}] * 9}, 422, ["body", "photos"]),
        ({"fields": {"title": "x"}, "text": {}}, 422, ["body", "text"]),
    ],
)
def test_bad_upserts_get_a_4xx_naming_the_field_and_write_nothing(
    shop: Shop, body: dict[str, Any], status: int, loc: list[Any]
) -> None:
    with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
        before = log.last_sequence()
    answer = put(shop, "bad-1", body)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"][0]["loc"][: len(loc)] == loc
    with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
        assert log.last_sequence() == before


def test_upserts_need_a_write_key(shop: Shop) -> None:
    _, rec = new_record(shop)
    assert put(shop, "new-4", upsert_body(shop, rec), key=shop.search_key).status_code == 403
    with shop.a.client() as client:
        assert client.put("/v1/products/new-4", json=upsert_body(shop, rec)).status_code == 401


def test_a_batch_upserts_patches_and_deletes_in_one_transaction(shop: Shop) -> None:
    _, rec = new_record(shop)
    line = {"op": "upsert", "id": "new-5", **upsert_body(shop, rec, sku="batch")}
    body = "\n".join(
        json.dumps(x)
        for x in (
            line,
            {"op": "patch", "id": "new-5", "fields": {"price": 2.5}},
            {"op": "delete", "id": "prod-9"},
        )
    ).encode()
    headers = {"Authorization": f"Bearer {shop.write_key}", "Content-Type": "application/x-ndjson"}
    with shop.a.client() as client:
        answer = client.post("/v1/indexes/shop/products/batch", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["count"] == 3
        hits = client.post("/v1/search", json={"query": "x", "top_k": 5, "filters": {"sku": "batch"}})
        assert [(h["id"], h["metadata"]["price"]) for h in hits.json()["results"]] == [("new-5", 2.5)]
        # A bad photo in a later line: nothing of the batch is written, the line and field are named.
        with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
            before = log.last_sequence()
        bad = {"op": "upsert", "id": "new-6", "photos": [{"data": "??"}]}
        refused = client.post(
            "/v1/products/batch",
            content=(json.dumps(line) + "\n" + json.dumps(bad)).encode(),
            headers=headers,
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == ["body", 1, "photos", 0, "data"]
        with SqliteChangeLog(changelog_path(shop.root, "shop")) as log:
            assert log.last_sequence() == before
