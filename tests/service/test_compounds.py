"""Decompounding of queries (service.search.compounds): a compound query word the catalogue never writes
whole is searched by its parts too, in the compounding languages the query is read as. Real product
channels written by the store, and a product index built by the indexer and served by the app with the
shipped demo model."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from indexer.build import build
from service.app import create_app
from service.search.compounds import QueryCompounds
from service.search.dictionaries import QueryDictionaries
from store.lexical import analyze
from store.products import PhotoRows, ProductChannels, ProductInfo, TextRows, write_product_channels
from tests.fixtures import Catalogue, make_settings

TITLES = [
    ("sv", "Äpple Juice"),
    ("sv", "Apelsin Juice"),
    ("sv", "Äpple Röda"),
    ("sv", "Havre Mjölk"),
    ("sv", "Mjölk Standard"),
    ("en", "Chocolate biscuits"),
    ("en", "Tomato ketchup"),
    ("en", "Basmati rice"),
]


@pytest.fixture(scope="module")
def channels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("compound-channels")
    rng = np.random.default_rng(0)
    n = len(TITLES)
    owners = np.arange(n, dtype=np.int64)
    vectors = rng.normal(size=(n, 8)).astype(np.float32)
    info = ProductInfo(fields=["title"], text_languages=["en", "sv"], language_counts={}, photos=0, texts=0)
    write_product_channels(
        root,
        info,
        PhotoRows(owners, [f"p{i}.jpg" for i in range(n)], vectors),
        TextRows(
            owners,
            ["title"] * n,
            [lang for lang, _ in TITLES],
            [t for _, t in TITLES],
            [analyze(t, lang) for lang, t in TITLES],
            vectors,
        ),
    )
    opened = ProductChannels(root, n)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def compounds() -> QueryCompounds:
    return QueryCompounds(QueryDictionaries(["en", "sv", "de"]))


def test_a_compound_gets_a_reading_of_its_parts_in_each_compounding_language(
    channels: ProductChannels, compounds: QueryCompounds
) -> None:
    assert compounds.readings(channels, "Äppeljuice", ["sv"]) == [["äppl", "juic"]]
    assert compounds.readings(channels, "färsk havremjölk", ["sv"]) == [
        [*analyze("färsk", "sv"), "havr", "mjölk"]
    ]
    # Read as English (no compounding language) or as nothing: no split reading.
    assert compounds.readings(channels, "äppeljuice", ["en", None]) == []
    # Nothing to split: words the catalogue writes, a modifier no word.
    assert compounds.readings(channels, "äpple juice", ["sv"]) == []
    assert compounds.readings(channels, "bananjuice", ["sv"]) == [["banan", "juic"]]  # a word: split
    assert compounds.readings(channels, "kwxzjuice", ["sv"]) == []
    # "grapefrukt" is no word of the catalogue: wordfreq's Swedish list knows it.
    assert compounds.readings(channels, "grapefruktjuice", ["sv", "en"]) == [["grapefruk", "juic"]]
    assert QueryCompounds(None).readings(channels, "grapefruktjuice", ["sv"]) == []
    assert QueryCompounds(None).readings(channels, "äppeljuice", ["sv"]) == [["äppl", "juic"]]
    # One decompounder per version and language, kept.
    assert compounds.of(channels, "sv") is compounds.of(channels, "sv-SE")
    assert compounds.of(channels, "en") is None


def test_a_head_the_catalogue_does_not_write_is_not_split_off(
    channels: ProductChannels, compounds: QueryCompounds
) -> None:
    # German "Apfelsaft": "saft" is nowhere in the catalogue, so the modifier alone would find apples.
    assert compounds.readings(channels, "Apfelsaft", ["de"]) == []
    assert compounds.readings(channels, "vattenmelon", ["sv"]) == []


# -- through the service -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(catalogue: Catalogue, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("compounds")
    rows = [
        {"id": f"p{i}", "paths": [str(catalogue.records[i].image)], f"title@{lang}": title}
        for i, (lang, title) in enumerate(TITLES)
    ]
    manifest = root / "products.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    settings = make_settings(root / "indexes", index_name="compounds", text_fields=["title"], index_workers=1)
    report = build("compounds", [manifest], settings=settings)
    assert report.published
    with TestClient(create_app(settings.model_copy(update={"text_fields": []}))) as client:
        yield client


def _search(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/search", json={"mode": "text", "top_k": 8, "explain": True, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _lexical(body: dict[str, Any]) -> dict[str, tuple[int, list[str]]]:
    """{product: (its rank in the lexical channel, the query terms it matched)} of the products it found."""
    found = {
        h["id"]: (h["explain"]["channels"]["lexical"]["rank"], h["explain"]["terms"]) for h in body["results"]
    }
    return {k: v for k, v in found.items() if v[0] is not None}


@pytest.mark.parametrize(
    ("query", "apart", "product"),
    [
        ("äppeljuice", "äpple juice", "p0"),
        ("apelsinjuice", "apelsin juice", "p1"),
        ("havremjölk", "havre mjölk", "p3"),
    ],
)
def test_a_compound_query_finds_the_product_that_writes_its_parts_apart(
    served: Any, query: str, apart: str, product: str
) -> None:
    # The demo model's fusion is reciprocal rank over its (random) dense channel: the lexical channel's own
    # ranking is what decompounding changes, and it is the written-apart query's.
    found = _lexical(_search(served, query=query, lang="sv"))
    assert found[product] == (0, analyze(TITLES[int(product[1:])][1], "sv"))  # first, both parts matched
    assert found == _lexical(_search(served, query=apart, lang="sv"))
    assert len(found) > 1  # a product holding one part matches by it, below


def test_a_compound_read_as_a_language_that_does_not_compound_is_not_split(served: Any) -> None:
    # Certainly English: the query is one unknown English word, which no product's text holds.
    assert _lexical(_search(served, query="äppeljuice", lang="en")) == {}
    # Unsure of its language (no hint): read as the catalogue's languages too, Swedish among them.
    assert _lexical(_search(served, query="äppeljuice"))["p0"][0] == 0
