"""Text and image search through a real uvicorn: languages, exact references, re-ranking, filters, paging,
images, cache hits."""

from __future__ import annotations

import io
import os

import httpx
import numpy as np
import pytest
from PIL import Image
from threadpoolctl import threadpool_info

from model.runtime import Encoder
from tests.fixtures import REDIS_URL, Catalogue, LiveServer

LANGS = ("en", "de", "fr", "ja", "zh", "ru", "es", "cs")
PROBES = (0, 7, 19, 33, 48)  # catalogue rows queried by their own captions


def cache_events(server: LiveServer, cache: str, outcome: str) -> float:
    """The server's own count of cache lookups of one kind (``ccrk_cache_total``)."""
    return server.app.state.runtime.metrics.cache_events.labels(cache, outcome)._value.get()


def embedding_hits(server: LiveServer) -> float:
    return cache_events(server, "embedding", "hit")


def exact_ids(catalogue: Catalogue, encoder: Encoder, text: str, rows: list[int] | None = None) -> list[str]:
    """Reference ranking: the query embedding against every item's embedding (numpy brute force)."""
    q = encoder.encode_text([text]).embeds[0]
    rows = list(range(len(catalogue.records))) if rows is None else rows
    scores = catalogue.encoded.embeds[rows] @ q
    order = sorted(range(len(rows)), key=lambda i: (-scores[i], rows[i]))
    return [catalogue.records[rows[i]].id for i in order]


@pytest.mark.parametrize("lang", LANGS)
def test_search_finds_the_item_in_each_language(
    client: httpx.Client, catalogue: Catalogue, encoder: Encoder, lang: str
) -> None:
    found_first = 0
    for row in PROBES:
        record = catalogue.records[row]
        caption = record.captions[lang][0]
        body = client.post("/v1/search", json={"query": caption, "top_k": 10, "rerank": False}).json()
        ids = [hit["id"] for hit in body["results"]]
        assert record.id in ids[:5], (lang, caption, ids)
        found_first += ids[0] == record.id
        # Same ranking as exact search, scores are the cosine similarities.
        assert ids == exact_ids(catalogue, encoder, caption)[:10]
        q = encoder.encode_text([caption]).embeds[0]
        by_id = {r.id: n for n, r in enumerate(catalogue.records)}
        np.testing.assert_allclose(
            [hit["score"] for hit in body["results"]],
            [float(catalogue.encoded.embeds[by_id[i]] @ q) for i in ids],
            rtol=1e-4,
            atol=1e-5,
        )
        assert [hit["rank"] for hit in body["results"]] == list(range(10))
        assert body["language"] == {**body["language"], "code": lang, "source": "detected", "supported": True}
        assert 0.5 < body["language"]["confidence"] <= 1.0
        assert body["results"][0]["metadata"] == record.attributes
        assert body["model"] == "ccrk-demo" and body["reranked"] is False
        assert set(body["timings_ms"]) == {"encode", "search", "rerank", "total"}
    assert found_first >= 3, lang


def test_lang_hint_overrides_detection_and_unsupported_is_labelled(client: httpx.Client) -> None:
    body = client.post("/v1/search", json={"query": "three yellow umbrellas", "lang": "de-AT"}).json()
    assert body["language"] == {
        "code": "de",
        "confidence": 1.0,
        "source": "hint",
        "supported": True,
        "mixed": False,
    }
    body = client.post("/v1/search", json={"query": "czerwona torba w paski", "top_k": 3}).json()
    assert body["language"]["code"] == "pl" and body["language"]["supported"] is False
    assert len(body["results"]) == 3  # still served
    body = client.post("/v1/search", json={"query": "red mug 红色杯子"}).json()
    assert body["language"]["mixed"] is True


def test_rerank_orders_by_dual_logit_plus_match_log_odds(
    client: httpx.Client, catalogue: Catalogue, encoder: Encoder
) -> None:
    caption = catalogue.records[19].captions["fr"][1]
    body = client.post(
        "/v1/search", json={"query": caption, "top_k": 15, "rerank": True, "rerank_k": 128}
    ).json()
    assert body["reranked"] is True
    # Reference: every item (60 <= rerank_k) scored as similarity / temperature + fusion match margin on the
    # stored fp16 tokens (model.reranking's definition, written out here).
    query = encoder.encode_text([caption]).row(0)
    similarity = catalogue.encoded.embeds @ query.embeds[0]
    tokens = catalogue.encoded.tokens.astype(np.float16).astype(np.float32)
    combined = similarity / encoder.temperature + encoder.score_pairs(query, tokens)
    order = np.argsort(-combined, kind="stable")[:15]
    assert [hit["id"] for hit in body["results"]] == [catalogue.records[i].id for i in order]
    np.testing.assert_allclose(
        [hit["rerank_score"] for hit in body["results"]], combined[order], rtol=1e-3, atol=1e-3
    )
    # Only the head is re-ranked: with rerank_k 5 ranks 5.. keep the dual-encoder order and have no logit.
    body = client.post(
        "/v1/search", json={"query": caption, "top_k": 10, "rerank": True, "rerank_k": 5}
    ).json()
    exact = exact_ids(catalogue, encoder, caption)
    assert sorted(h["id"] for h in body["results"][:5]) == sorted(exact[:5])
    assert [h["id"] for h in body["results"][5:]] == exact[5:10]
    assert all(h["rerank_score"] is None for h in body["results"][5:])


def test_filters_return_top_k_matching_items(
    client: httpx.Client, catalogue: Catalogue, encoder: Encoder
) -> None:
    caption = catalogue.records[0].captions["en"][0]
    cases = [
        {"colour": ["red", "blue", "green"]},
        {"count": {"gte": 2, "lte": 3}},
        {"category": catalogue.records[5].attributes["category"]},
        {"count": {"gt": 1}, "background": ["grey", "white", "beige"]},
    ]
    for filters in cases:

        def matches(attrs: dict, filters: dict = filters) -> bool:
            for name, cond in filters.items():
                value = attrs[name]
                if isinstance(cond, list):
                    ok = value in cond
                elif isinstance(cond, dict):
                    ok = all(
                        {"gte": value >= b, "gt": value > b, "lte": value <= b, "lt": value < b}[op]
                        for op, b in cond.items()
                    )
                else:
                    ok = value == cond
                if not ok:
                    return False
            return True

        rows = [n for n, r in enumerate(catalogue.records) if matches(r.attributes)]
        assert rows, filters
        top_k = 8
        body = client.post("/v1/search", json={"query": caption, "top_k": top_k, "filters": filters}).json()
        ids = [hit["id"] for hit in body["results"]]
        assert len(ids) == min(top_k, len(rows)), (filters, len(rows))
        assert ids == exact_ids(catalogue, encoder, caption, rows)[:top_k]
        assert all(matches(hit["metadata"]) for hit in body["results"])


def test_offset_pages_through_the_same_ranking(client: httpx.Client) -> None:
    query = {"query": "a blue striped mug on a white background", "rerank": False}
    full = client.post("/v1/search", json={**query, "top_k": 12}).json()["results"]
    page = client.post("/v1/search", json={**query, "top_k": 4, "offset": 8}).json()["results"]
    assert [h["id"] for h in page] == [h["id"] for h in full[8:12]]
    assert [h["rank"] for h in page] == [8, 9, 10, 11]


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_image_search_finds_the_same_image(
    client: httpx.Client, catalogue: Catalogue, fmt: str, mime: str
) -> None:
    for row in (3, 41):
        record = catalogue.records[row]
        buffer = io.BytesIO()
        with Image.open(record.image) as image:
            image.convert("RGB").save(buffer, format=fmt, quality=95)
        response = client.post(
            "/v1/search/image",
            files={"file": (f"q.{fmt.lower()}", buffer.getvalue(), mime)},
            data={"top_k": "5"},
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert results[0]["id"] == record.id and len(results) == 5
        if fmt == "PNG":  # lossless: the same pixels give the stored embedding
            assert results[0]["score"] == pytest.approx(1.0, abs=1e-4)


def test_photo_queries_carry_no_match_label_and_the_schema_says_why(
    client: httpx.Client, catalogue: Catalogue
) -> None:
    """Text hits are labelled by the version's calibration of text queries; a photo query's hits (image
    search, similar items) carry null, which the schema explains (it read as a missing feature)."""
    record = catalogue.records[3]
    with open(record.image, "rb") as fh:
        files = {"file": ("q.png", fh.read(), "image/png")}
    photo = client.post("/v1/search/image", files=files, data={"top_k": "5"}).json()["results"]
    similar = client.post(f"/v1/items/{record.id}/similar", json={"top_k": 5}).json()["results"]
    text = client.post("/v1/search", json={"query": "a red mug", "top_k": 5}).json()["results"]
    assert {h["match"] for h in photo + similar} == {None}
    assert {h["match"] for h in text} <= {"strong", "weak", "none"} and text
    described = client.get("/openapi.json").json()["components"]["schemas"]["SearchHit"]
    description = described["properties"]["match"]["description"]
    assert "Null on image-search and similar-items hits" in description and "another scale" in description


def test_image_search_with_filters(client: httpx.Client, catalogue: Catalogue) -> None:
    record = catalogue.records[3]
    category = record.attributes["category"]
    with open(record.image, "rb") as fh:
        data = fh.read()
    response = client.post(
        "/v1/search/image",
        files={"file": ("q.png", data, "image/png")},
        data={"top_k": "50", "filters": f'{{"category": "{category}"}}'},
    )
    results = response.json()["results"]
    assert results[0]["id"] == record.id
    assert {h["metadata"]["category"] for h in results} == {category}
    assert len(results) == sum(r.attributes["category"] == category for r in catalogue.records)


def test_images_route_serves_files_and_thumbnails(client: httpx.Client, catalogue: Catalogue) -> None:
    record = catalogue.records[2]
    hit = client.post("/v1/search", json={"query": record.captions["en"][0], "top_k": 1}).json()["results"][0]
    response = client.get(hit["image_url"])
    assert response.status_code == 200
    assert response.content == record.image.read_bytes()
    assert response.headers["content-type"] == "image/png"
    thumb = client.get(f"/v1/images/{record.id}", params={"size": 32})
    assert thumb.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(thumb.content)) as image:
        assert max(image.size) == 32
    assert client.get("/v1/images/no-such-item").status_code == 404


def test_results_and_embeddings_are_cached_in_redis(redis_server: LiveServer, redis_prefix: str) -> None:
    import redis

    server = redis_server
    query = {"query": "two green hats with dots at the top, grey background", "top_k": 7}
    with server.client() as client:
        first = client.post("/v1/search", json=query).json()
        second = client.post("/v1/search", json=query).json()
        # Another page of the same query: a result miss, but the query embedding comes from the cache.
        before = embedding_hits(server)
        third = client.post("/v1/search", json={**query, "top_k": 3}).json()
    assert server.app.state.runtime.cache.backend == "redis"
    assert first["cached"] is False and second["cached"] is True
    assert second["results"] == first["results"] and second["language"] == first["language"]
    assert second["match_score"] == first["match_score"] is not None
    assert third["cached"] is False
    assert [h["id"] for h in third["results"]] == [h["id"] for h in first["results"][:3]]
    assert embedding_hits(server) == before + 1
    keys = redis.Redis.from_url(REDIS_URL).keys(redis_prefix + "*")
    assert any(k.startswith((redis_prefix + "result:").encode()) for k in keys)
    assert any(k.startswith((redis_prefix + "embedding:").encode()) for k in keys)


def test_index_languages_health_metrics(
    server: LiveServer, client: httpx.Client, catalogue: Catalogue
) -> None:
    info = client.get("/v1/index").json()
    assert (
        info["name"] == "shop"
        and info["count"] == len(catalogue.records)
        and info["model_name"] == "ccrk-demo"
    )
    langs = client.get("/v1/languages").json()
    codes = [entry["code"] for entry in langs["languages"]]
    assert codes == ["en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id"]
    assert langs["languages"][0]["recall_at_10"] == 0.99 and langs["languages"][2]["recall_at_10"] is None
    assert client.get("/healthz").json() == {
        "status": "ok",
        "index_version": None,
        "detail": None,
        "pid": os.getpid(),  # this test's server runs in this process
    }
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["index_version"] == info["version"]
    client.post("/v1/search", json={"query": "drei gelbe Regenschirme", "rerank": True})
    # A result-cache hit of this test's own (the in-process cache): a query no other test sends, twice.
    query = {"query": "vier beige Bälle auf weißem Grund, nur für den Metriktest", "top_k": 3}
    hits = cache_events(server, "result", "hit")
    assert client.post("/v1/search", json=query).json()["cached"] is False
    assert client.post("/v1/search", json=query).json()["cached"] is True
    assert cache_events(server, "result", "hit") == hits + 1
    text = client.get("/metrics").text
    assert 'ccrk_request_seconds_count{lang="de",method="POST",route="/v1/search",status="2xx"}' in text
    assert 'ccrk_rerank_total{used="yes"}' in text
    assert f"ccrk_index_items {float(len(catalogue.records))}" in text
    assert f'ccrk_cache_total{{cache="result",outcome="hit"}} {hits + 1}' in text


def test_blas_pool_limited(server: LiveServer) -> None:
    """The lifespan limits numpy's OpenBLAS (pthreads, process-wide) to CCRK_BLAS_THREADS: its idle threads
    spin-wait on the cores the next queries need."""
    pools = [p for p in threadpool_info() if p["user_api"] == "blas" and p["threading_layer"] == "pthreads"]
    assert pools and [p["num_threads"] for p in pools] == [1] * len(pools)
    assert server.app.state.runtime.settings.blas_threads == 1
