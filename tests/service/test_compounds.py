"""Decompounding of queries (service.search.compounds): a compound query word the catalogue never writes
whole is searched by its parts too, in the compounding languages the query is read as. Real product
channels written by the store, and a product index built by the indexer and served by the app with the
shipped demo model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.search.compounds import QueryCompounds
from service.search.dictionaries import QueryDictionaries
from store.products.channels import ProductChannels
from store.text.lexical import analyze
from tests.fixtures import Catalogue
from tests.titled_products import search_text, served_titles, write_title_channels

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
    vectors = np.random.default_rng(0).normal(size=(len(TITLES), 8)).astype(np.float32)
    write_title_channels(root, TITLES, vectors)
    opened = ProductChannels(root, len(TITLES))
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
    with served_titles(catalogue, tmp_path_factory.mktemp("compounds"), "compounds", TITLES) as client:
        yield client


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
    found = _lexical(search_text(served, query=query, lang="sv"))
    assert found[product] == (0, analyze(TITLES[int(product[1:])][1], "sv"))  # first, both parts matched
    assert found == _lexical(search_text(served, query=apart, lang="sv"))
    assert len(found) > 1  # a product holding one part matches by it, below


def test_a_compound_read_as_a_language_that_does_not_compound_is_not_split(served: Any) -> None:
    # Certainly English: the query is one unknown English word, which no product's text holds.
    assert _lexical(search_text(served, query="äppeljuice", lang="en")) == {}
    # Unsure of its language (no hint): read as the catalogue's languages too, Swedish among them.
    assert _lexical(search_text(served, query="äppeljuice"))["p0"][0] == 0
