"""Facets and per-value diversity in /v1/search: counts over every relevant result equal a brute-force count
of the hits a deep page returns, across filters (disjunctive on the faceted field), sort, a sharded version
of the same catalogue and a photo index without text fields; ranges, min/max; ``max_per`` caps each page and
loses nothing; hostile facet bodies get a 422 naming the field. The shipped demo model, a synthetic
catalogue built by the real indexer, real uvicorn."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from synthetic.synth import SynthConfig, generate_catalogue
from tests.fixtures import LiveServer, make_settings

PRODUCTS = 30
BRANDS = ["Oatly", "Arla", "Valio", "Alpro"]
QUERIES = ["a red umbrella", "gelbe Tasse", "a blue chair with stripes", "lamp"]


def _products(catalogue: Path, out: Path) -> Path:
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
    rows = []
    for i in range(PRODUCTS):
        rec = recs[i]
        rows.append(
            {
                "id": f"prod-{i}",
                "path": str(catalogue / rec["image"]),
                "title": rec["captions"]["en"][0],
                "category": rec["attributes"]["category"],
                "brand": BRANDS[i % len(BRANDS)],
                "price": float(3 * i % 41) + 0.5,
                "tags": ["sale", "new"][: i % 3],  # a list field: none, one or two tags
                "organic": i % 2 == 0,
                "notes": "x" * 300,  # longer than a facet counts
            }
        )
    path = out / "products.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("facets")
    generate_catalogue(tmp / "cat", SynthConfig(seed=3, n_train=0, n_val=0, n_test=PRODUCTS, image_size=64))
    manifest = _products(tmp / "cat", tmp)
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=tmp / "indexes",
        index_workers=1,
        index_batch_size=8,
        rerank_policy_queries=0,
        text_fields=["title"],
    )
    build("shop", [manifest], settings=settings)
    build("shards", [manifest], settings=settings.model_copy(update={"index_shards": 2}))
    build("photos", [manifest], settings=settings.model_copy(update={"text_fields": []}))
    serve = make_settings(settings.index_root, index_name="shop", extra_indexes=["shards", "photos"])
    with LiveServer(serve) as server:
        yield server


@pytest.fixture()
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c


FACETS: list[Any] = [
    {"field": "category", "size": 100},
    "brand",
    "tags",
    "organic",
    {"field": "price", "size": 100, "ranges": [[None, 10], [10, 25], [25, None]]},
]


def _brute(hits: list[dict[str, Any]], field: str) -> Counter[Any]:
    counts: Counter[Any] = Counter()
    for hit in hits:
        value = hit["metadata"].get(field)
        for v in set(value) if isinstance(value, list) else [value]:
            if v is not None:
                counts[(type(v) is bool, v)] += 1
    return counts


def _relevant(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every relevant result by brute force: the deepest page, labelled none dropped (as 'auto' counts)."""
    deep = client.post(path, json={**body, "top_k": 200, "offset": 0}).json()
    assert len(deep["results"]) < 200  # the page holds every candidate: nothing beyond it
    return [h for h in deep["results"] if h["match"] != "none"]


def _check(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    answer = client.post(path, json={**body, "facets": FACETS, "top_k": 200})
    assert answer.status_code == 200, answer.text
    facets = {f["field"]: f for f in answer.json()["facets"]}
    assert list(facets) == ["category", "brand", "tags", "organic", "price"]
    filters = body.get("filters") or {}
    for field, facet in facets.items():
        # Disjunctive: a field's own filter does not narrow its counts.
        scope = {**body, "filters": {k: v for k, v in filters.items() if k != field} or None}
        relevant = _relevant(client, path, scope)
        expected = _brute(relevant, field)
        got = Counter({(type(v["value"]) is bool, v["value"]): v["count"] for v in facet["values"]})
        assert got == expected, (field, body)
        assert facet["relevant"] == len(relevant) and facet["distinct"] == len(expected)
        assert facet["missing"] == sum(1 for h in relevant if not _brute([h], field))
        if field == "price":
            prices = [h["metadata"]["price"] for h in relevant]
            assert facet["min"] == (min(prices) if prices else None)
            assert facet["max"] == (max(prices) if prices else None)
            spans = [(r["gte"], r["lt"], r["count"]) for r in facet["ranges"]]
            assert spans == [
                (lo, hi, sum(1 for p in prices if (lo is None or p >= lo) and (hi is None or p < hi)))
                for lo, hi in [(None, 10.0), (10.0, 25.0), (25.0, None)]
            ]


@pytest.mark.parametrize("path", ["/v1/search", "/v1/indexes/shards/search", "/v1/indexes/photos/search"])
def test_facet_counts_equal_a_brute_force_count_of_the_relevant_results(
    client: httpx.Client, path: str
) -> None:
    for query in QUERIES:
        _check(client, path, {"query": query})
        _check(client, path, {"query": query, "filters": {"brand": ["Oatly", "Arla"]}})
        _check(client, path, {"query": query, "filters": {"brand": "Valio", "price": {"lt": 30}}})
        _check(client, path, {"query": query, "min_score": "strong"})
        _check(client, path, {"query": query, "min_score": "weak", "filters": {"tags": "sale"}})
    _check(client, "/v1/search", {"query": QUERIES[0], "sort": {"field": "price", "order": "desc"}})
    _check(client, "/v1/search", {"query": QUERIES[1], "mode": "text"})


def test_sharded_and_unsharded_versions_count_alike(client: httpx.Client) -> None:
    for query in QUERIES:
        body = {"query": query, "facets": FACETS, "filters": {"organic": True}}
        one = client.post("/v1/search", json=body).json()["facets"]
        two = client.post("/v1/indexes/shards/search", json=body).json()["facets"]
        assert one == two


def test_a_filter_narrows_the_other_fields_counts(client: httpx.Client) -> None:
    base = client.post("/v1/search", json={"query": "lamp", "facets": ["brand", "category"]}).json()
    narrowed = client.post(
        "/v1/search", json={"query": "lamp", "facets": ["brand", "category"], "filters": {"brand": "Oatly"}}
    ).json()
    assert narrowed["facets"][0] == base["facets"][0]  # brand: disjunctive
    assert sum(v["count"] for v in narrowed["facets"][1]["values"]) <= sum(
        v["count"] for v in base["facets"][1]["values"]
    )
    assert {h["metadata"]["brand"] for h in narrowed["results"]} <= {"Oatly"}


def test_facets_do_not_change_the_hits_and_come_back_from_the_cache(client: httpx.Client) -> None:
    plain = client.post("/v1/search", json={"query": "gelbe Tasse", "top_k": 10}).json()
    faceted = client.post(
        "/v1/search", json={"query": "gelbe Tasse", "top_k": 10, "facets": ["brand"]}
    ).json()
    assert [h["id"] for h in plain["results"]] == [h["id"] for h in faceted["results"]]
    again = client.post("/v1/search", json={"query": "gelbe Tasse", "top_k": 10, "facets": ["brand"]}).json()
    assert again["cached"] and again["facets"] == faceted["facets"]
    assert plain["facets"] is None


@pytest.mark.parametrize("path", ["/v1/search", "/v1/indexes/photos/search"])
def test_max_per_caps_each_page_and_loses_nothing(client: httpx.Client, path: str) -> None:
    body = {"query": "a red umbrella", "top_k": 6}
    everything = [h["id"] for h in client.post(path, json={**body, "top_k": 36}).json()["results"]]
    pages = []
    for offset in range(0, 36, 6):
        page = client.post(
            path, json={**body, "offset": offset, "max_per": {"field": "brand", "n": 2}}
        ).json()
        hits = page["results"]
        assert [h["rank"] for h in hits] == list(range(offset, offset + len(hits)))
        if offset + 6 <= 24:  # four brands: enough of each for the first four pages
            assert max(Counter(h["metadata"]["brand"] for h in hits).values()) <= 2, (offset, hits)
        pages.extend(h["id"] for h in hits)
    assert sorted(pages) == sorted(everything)
    assert pages[:2] == everything[:2]  # the best stays first


@pytest.mark.parametrize(
    ("facets", "where"),
    [
        ([{"field": "price", "ranges": [[0, 10], [5, 20]]}], ["body", "facets", 0]),
        ([{"field": "price", "ranges": [[0, 1]] * 10_000}], ["body", "facets", 0, "ranges"]),
        ([{"field": "price", "ranges": [[None, None]]}], ["body", "facets", 0]),
        ([{"field": "price", "ranges": [[5, 5]]}], ["body", "facets", 0]),
        ([{"field": "price", "ranges": [[0, "x"]]}], ["body", "facets", 0, "ranges", 0, 1]),
        (["brand", "brand"], ["body", "facets"]),
        (["brand"] * 11, ["body", "facets"]),
        ([{"field": "brand", "size": 0}], ["body", "facets", 0, "size"]),
        ([{"field": "brand", "extra": 1}], ["body", "facets", 0, "extra"]),
        (["no such field"], ["body", "facets", 0, "field"]),
        ([7], ["body", "facets", 0]),
        (["colour"], ["body", "facets", "colour"]),
        (["notes"], ["body", "facets", "notes"]),
    ],
)
def test_bad_facets_get_a_422_naming_the_field(client: httpx.Client, facets: Any, where: list[Any]) -> None:
    answer = client.post("/v1/search", json={"query": "lamp", "facets": facets})
    assert answer.status_code == 422, answer.text
    assert any(d["loc"][: len(where)] == where for d in answer.json()["detail"]), answer.json()


@pytest.mark.parametrize(
    "max_per", [{"field": "brand", "n": 0}, {"field": "brand"}, {"n": 2}, {"field": "colour", "n": 1}]
)
def test_bad_max_per_gets_a_422(client: httpx.Client, max_per: Any) -> None:
    answer = client.post("/v1/search", json={"query": "lamp", "max_per": max_per})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"][:2] == ["body", "max_per"]


@pytest.mark.parametrize("prefix", ["/v1", "/v1/indexes/shards"])
def test_an_unknown_sort_field_gets_a_422_naming_the_known_ones(client: httpx.Client, prefix: str) -> None:
    """As filters and facets: a mistyped sort field was answered 200, unsorted, without a word."""
    answer = client.post(f"{prefix}/search", json={"query": "lamp", "sort": {"field": "prize"}})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "sort", "field"]
    assert "'prize'" in detail["msg"] and "price" in detail["msg"] and "brand" in detail["msg"]
    sorted_ok = client.post(f"{prefix}/search", json={"query": "lamp", "sort": {"field": "price"}})
    assert sorted_ok.status_code == 200, sorted_ok.text


@pytest.mark.parametrize("prefix", ["/v1", "/v1/indexes/shards", "/v1/indexes/photos"])
def test_similar_and_photo_searches_count_their_first_fifty(
    client: httpx.Client, live: LiveServer, prefix: str
) -> None:
    deep = client.post(f"{prefix}/items/prod-3/similar", json={"top_k": 50}).json()["results"]
    assert len(deep) == PRODUCTS - 1  # every other product: all of them are counted
    body = {"top_k": 5, "facets": ["brand", "tags"], "filters": {"brand": "Arla"}}
    answer = client.post(f"{prefix}/items/prod-3/similar", json=body).json()
    assert {h["metadata"]["brand"] for h in answer["results"]} == {"Arla"}
    brand, tags = answer["facets"]
    assert {(v["value"], v["count"]) for v in brand["values"]} == {
        (k[1], n) for k, n in _brute(deep, "brand").items()
    }  # disjunctive: the brand filter leaves its own counts whole
    arla = [h for h in deep if h["metadata"]["brand"] == "Arla"]
    assert {(v["value"], v["count"]) for v in tags["values"]} == {
        (k[1], n) for k, n in _brute(arla, "tags").items()
    }
    capped = client.post(
        f"{prefix}/items/prod-3/similar", json={"top_k": 8, "max_per": {"field": "brand", "n": 2}}
    ).json()["results"]
    assert max(Counter(h["metadata"]["brand"] for h in capped).values()) <= 2

    photo = client.get(f"{prefix}/images/prod-3").content
    search = f"{prefix}/search/image"
    plain = client.post(search, files={"file": ("p.png", photo, "image/png")}, data={"top_k": "50"}).json()
    faceted = client.post(
        search,
        files={"file": ("p.png", photo, "image/png")},
        data={"top_k": "3", "facets": '[{"field": "category", "size": 100}]'},
    ).json()
    (category,) = faceted["facets"]
    assert {(v["value"], v["count"]) for v in category["values"]} == {
        (k[1], n) for k, n in _brute(plain["results"], "category").items()
    }
    for bad in ("[", '[{"field": "price", "ranges": [[0, 5], [1, 2]]}]', '["colour"]'):
        refused = client.post(search, files={"file": ("p.png", photo, "image/png")}, data={"facets": bad})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"][:2] == ["body", "facets"]
