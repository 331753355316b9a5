"""Synonyms served (``service.search.synonyms``, ``service.api.routes.synonyms``): a product titled
"sneakers" found for "trainers" by the lexical channel and by the dense ones (the query embedding the mean
of the query's and its variant's), one-way entries one way only, entries scoped to a language, the admin
route's keys and its 422s naming the field, and an edit taking effect at the next search. The shipped
demo model, a real product build, real uvicorn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from model.runtime import load_encoder
from service.search.synonyms import CompiledSynonyms, SynonymSource, combined_embedding
from store.layout import index_dir
from store.products.channels import PHOTO_EMBEDDINGS, PHOTO_OWNERS, TEXT_EMBEDDINGS, TEXT_OWNERS
from store.synonyms import SYNONYMS_FILE, parse
from store.version.reader import IndexVersion
from store.version.versions import current_version
from synthetic.synth import SynthConfig, generate_catalogue
from tests.fixtures import LiveServer, make_settings

ADMIN = {"X-API-Key": "test-admin-key"}
ROUTE = "/v1/admin/indexes/boutique/synonyms"
TITLES = ["white sneakers", "cotton t-shirt", "wooden chair", "glass vase", "leather wallet", "steel kettle"]


@pytest.fixture(scope="module")
def boutique(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An index root with a product index whose titles never say "trainers" or "tee", built with a one-way
    entry tee -> t-shirt (English)."""
    out = tmp_path_factory.mktemp("boutique")
    generate_catalogue(
        out, SynthConfig(seed=3, n_train=0, n_val=0, n_test=len(TITLES), image_size=64), workers=1
    )
    recs = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    rows = [
        {"id": f"p{i}", "path": str(out / r["image"]), "title": t}
        for i, (r, t) in enumerate(zip(recs, TITLES, strict=True))
    ]
    manifest = out / "products.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    synonyms = out / "synonyms.json"
    synonyms.write_text(json.dumps({"synonyms": [{"from": "tee", "to": ["t-shirt"], "lang": "en"}]}))
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=out / "indexes",
        index_workers=1,
        index_batch_size=8,
        shard_size=8,
        rerank_policy_queries=0,
        text_fields=["title"],
    )
    assert build("boutique", [manifest], settings=settings, synonyms=synonyms).published
    return out / "indexes"


@pytest.fixture(scope="module")
def live(boutique: Path) -> Iterator[LiveServer]:
    with LiveServer(make_settings(boutique, index_name="boutique")) as server:
        yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c
        c.delete(ROUTE, headers=ADMIN)  # each test starts without an index-level set


def _search(client: httpx.Client, query: str, lang: str = "en") -> dict[str, Any]:
    response = client.post("/v1/search", json={"query": query, "lang": lang, "explain": True, "top_k": 6})
    assert response.status_code == 200, response.text
    return response.json()


def _hit(body: dict[str, Any], item_id: str) -> dict[str, Any]:
    return next(h for h in body["results"] if h["id"] == item_id)


def test_trainers_finds_sneakers_by_lexical_and_dense_channels(client: httpx.Client, boutique: Path) -> None:
    before = _search(client, "trainers")
    assert before["expanded"] == [] and _hit(before, "p0")["explain"]["channels"]["lexical"]["rank"] is None
    put = client.put(
        ROUTE, headers=ADMIN, json={"synonyms": [{"terms": ["sneakers", "trainers"], "lang": "en"}]}
    )
    assert put.status_code == 200, put.text
    assert put.json()["stored"] and put.json()["version_synonyms"] == [
        {"from": "tee", "to": ["t-shirt"], "lang": "en"}
    ]
    after = _search(client, "trainers")  # the next search, no reload
    assert after["expanded"] == ["sneakers"]
    top = after["results"][0]
    assert top["id"] == "p0"
    channels = top["explain"]["channels"]
    assert channels["lexical"]["rank"] == 0 and top["explain"]["terms"] == ["sneaker"]
    # Dense channels: the query embedding is the normalised mean of "trainers" and "sneakers".
    encoder = load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=1)
    query = combined_embedding(list(encoder.encode_text(["trainers", "sneakers"]).embeds))
    vdir = index_dir(boutique, "boutique") / current_version(boutique, "boutique")
    with IndexVersion.open(boutique, "boutique") as opened:
        row = opened.row_of("p0")
    texts = np.load(vdir / TEXT_EMBEDDINGS)[np.load(vdir / TEXT_OWNERS) == row]
    photos = np.load(vdir / PHOTO_EMBEDDINGS)[np.load(vdir / PHOTO_OWNERS) == row]
    assert channels["text"]["score"] == pytest.approx(float((texts @ query).max()), abs=1e-4)
    assert channels["image"]["score"] == pytest.approx(float((photos @ query).max()), abs=1e-4)
    assert channels["text"]["score"] > _hit(before, "p0")["explain"]["channels"]["text"]["score"]
    # Scoped to English: a German query is not expanded.
    assert _search(client, "trainers", lang="de")["expanded"] == []
    # Removed: the next search is as before.
    assert client.delete(ROUTE, headers=ADMIN).json()["stored"] is False
    assert _search(client, "trainers")["expanded"] == []


def test_a_one_way_entry_of_the_build_works_one_way(client: httpx.Client) -> None:
    tee = _search(client, "tee")
    assert tee["expanded"] == ["t-shirt"]
    assert (
        tee["results"][0]["id"] == "p1" and tee["results"][0]["explain"]["channels"]["lexical"]["rank"] == 0
    )
    assert _search(client, "t-shirt")["expanded"] == []
    # The index-level set decides a term it defines: "tee" now means "vase" only.
    client.put(ROUTE, headers=ADMIN, json={"synonyms": [{"from": "tee", "to": ["vase"], "lang": "en"}]})
    assert _search(client, "tee")["expanded"] == ["vase"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"synonyms": [{"from": "a", "to": ["b"]}, {"from": "b", "to": ["a"]}]}, ["body", "synonyms", 1]),
        ({"synonyms": [{"terms": ["a", "!!"]}]}, ["body", "synonyms", 0, "terms", 1]),
        ({"synonyms": [{"terms": ["a"]}]}, ["body", "synonyms", 0]),
        ({"synonyms": [{"terms": ["a", "b" * 65]}]}, ["body", "synonyms", 0]),
        ({"synonyms": [{"from": "a", "to": ["b"], "lang": "english"}]}, ["body", "synonyms", 0]),
        ({"synonyms": [{"terms": ["a", "b"]}] * 1001}, ["body", "synonyms"]),
        ({"synonyms": "a"}, ["body", "synonyms"]),
        ({"synonym": []}, ["body", "synonym"]),
    ],
)
def test_bad_sets_are_422_naming_the_field(
    client: httpx.Client, body: dict[str, Any], loc: list[Any]
) -> None:
    response = client.put(ROUTE, headers=ADMIN, json=body)
    assert response.status_code == 422, response.text
    assert any(d["loc"][: len(loc)] == loc for d in response.json()["detail"]), response.json()
    assert client.get(ROUTE, headers=ADMIN).json()["stored"] is False  # nothing written


def test_hostile_bodies_are_4xx(client: httpx.Client) -> None:
    for raw in [b"{", b'{"synonyms": [{"terms": ["\\ud800", "a"]}]}', b"[" * 3000 + b"]" * 3000, b"\xff\xfe"]:
        response = client.put(ROUTE, headers={**ADMIN, "content-type": "application/json"}, content=raw)
        assert 400 <= response.status_code < 500, (raw[:40], response.status_code)


def test_the_route_needs_the_admin_key(client: httpx.Client, boutique: Path) -> None:
    body = {"synonyms": [{"terms": ["a", "b"]}]}
    assert client.put(ROUTE, json=body).status_code == 401
    assert client.get(ROUTE, headers={"X-API-Key": "wrong"}).status_code == 401
    assert client.get("/v1/admin/indexes/elsewhere/synonyms", headers=ADMIN).status_code == 404
    assert not (boutique / "boutique" / SYNONYMS_FILE).exists()
    disabled = make_settings(boutique, index_name="boutique", admin_api_key=None)
    with LiveServer(disabled) as other, other.client() as c:
        assert c.get(ROUTE, headers=ADMIN).status_code == 404  # admin disabled


def test_an_edit_is_not_hidden_by_the_result_cache_and_a_cached_answer_keeps_its_variants(
    client: httpx.Client,
) -> None:
    _search(client, "trainers")
    assert _search(client, "trainers")["cached"] is True
    put = client.put(ROUTE, headers=ADMIN, json={"synonyms": [{"terms": ["sneakers", "trainers"]}]})
    assert put.status_code == 200, put.text
    fresh = _search(client, "trainers")
    assert fresh["cached"] is False and fresh["expanded"] == ["sneakers"]
    cached = _search(client, "trainers")
    assert cached["cached"] is True and cached["expanded"] == ["sneakers"]
    assert [h["id"] for h in cached["results"]] == [h["id"] for h in fresh["results"]]


def test_a_write_the_file_system_refuses_is_a_503_and_searches_go_on(
    client: httpx.Client, boutique: Path
) -> None:
    """The index-level file's place taken by a folder (a botched restore): PUT and DELETE cannot replace or
    remove it, a 503 naming the index (not a 500), and searches go on without an index-level set."""
    blocked = boutique / "boutique" / SYNONYMS_FILE
    blocked.mkdir()
    (blocked / "keep").write_text("x")
    try:
        body = {"synonyms": [{"terms": ["sneakers", "trainers"], "lang": "en"}]}
        for answer in (client.put(ROUTE, headers=ADMIN, json=body), client.delete(ROUTE, headers=ADMIN)):
            assert answer.status_code == 503, answer.text
            assert "boutique" in answer.json()["detail"][0]["msg"]
        assert client.get(ROUTE, headers=ADMIN).json()["problem"]
        assert _search(client, "trainers")["expanded"] == []
    finally:
        (blocked / "keep").unlink()
        blocked.rmdir()


def test_expansion_is_one_step_longest_match_and_per_language() -> None:
    compiled = CompiledSynonyms(
        parse(
            {
                "synonyms": [
                    {"terms": ["sneakers", "trainers"], "lang": "en"},
                    {"from": "tee", "to": ["t-shirt"]},
                    {"from": "tee shirt", "to": ["polo"]},
                    {"from": "t-shirt", "to": ["top"]},
                    {"terms": ["运动鞋", "跑鞋"]},
                ]
            }
        )
    )
    red = compiled.expand("Red Trainer", "en")  # stemmed and case-folded as the query's language
    assert red is not None and red.variants == ("Red sneakers",) and red.used == ("Trainer -> sneakers",)
    assert compiled.expand("red trainers", "de") is None
    # One step: "tee" -> "t-shirt", not on to "top"; the longest source wins ("tee shirt" -> "polo").
    assert compiled.expand("tee", None).variants == ("t-shirt",)  # type: ignore[union-attr]
    assert compiled.expand("blue tee shirt", "en").variants == ("blue polo",)  # type: ignore[union-attr]
    assert compiled.expand("红色运动鞋", "zh").variants == ("红色跑鞋",)  # type: ignore[union-attr]


def test_the_source_reads_an_index_level_change(tmp_path: Path) -> None:
    version = tmp_path / "shop" / "20260101T000000Z-abcdef"
    version.mkdir(parents=True)
    (version / SYNONYMS_FILE).write_text(json.dumps({"synonyms": [{"terms": ["a", "b"]}]}))
    source = SynonymSource()
    first = source.of(version)
    assert first is not None and first.expand("a", None).variants == ("b",)  # type: ignore[union-attr]
    assert source.of(version) is first  # unchanged: not read again
    (tmp_path / "shop" / SYNONYMS_FILE).write_text(json.dumps({"synonyms": [{"from": "a", "to": ["c"]}]}))
    second = source.of(version)
    assert second is not first and second.expand("a", None).variants == ("c",)  # type: ignore[union-attr]
    (tmp_path / "shop" / SYNONYMS_FILE).write_text("{broken")  # damaged: the version's own set serves
    assert source.of(version).expand("a", None).variants == ("b",)  # type: ignore[union-attr]
    assert source.of(tmp_path / "shop" / "none") is None


def test_synonyms_false_searches_the_query_as_typed(client: httpx.Client) -> None:
    """What search analytics' link to action compares: the same query with and without the synonyms."""
    body = {"query": "tee", "lang": "en", "explain": True, "top_k": 6, "mode": "text"}
    with_synonyms = client.post("/v1/search", json=body).json()
    assert with_synonyms["expanded"] == ["t-shirt"]
    as_typed = client.post("/v1/search", json={**body, "synonyms": False})
    assert as_typed.status_code == 200, as_typed.text
    assert as_typed.json()["expanded"] == []
    # Not the answer cached for the expanded query, nor the other way round.
    assert client.post("/v1/search", json=body).json()["expanded"] == ["t-shirt"]
    texts = [h["explain"]["channels"]["text"]["score"] for h in as_typed.json()["results"]]
    expanded = {h["id"]: h["explain"]["channels"]["text"]["score"] for h in with_synonyms["results"]}
    assert texts != [expanded.get(h["id"]) for h in as_typed.json()["results"]]
