"""Typo tolerance (service.search.typos): mistyped query words corrected to the catalogue's words, the
corrected query searched and shown, exact matches above corrected ones, ``typos: 0`` off, spaceless
scripts never fuzzed, hostile ``typos`` values refused. Real product channels written by the store, and a
product index built by the indexer and served by the app with the shipped demo model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model.configs import get_preset
from service.language import LanguageDetector
from service.search.dictionaries import Dictionary, QueryDictionaries, nearest_in
from service.search.typos import FUZZY_WEIGHT, Correction, correct_query, edit_budget
from store.products.channels import ProductChannels
from tests.fixtures import Catalogue
from tests.titled_products import search_text, served_titles, write_title_channels

TITLES = [
    ("en", "Hass avocado"),
    ("en", "Apple juice"),
    ("en", "Strawberry yoghurt"),
    ("sv", "Ekologisk havredryck"),
    ("zh", "新鲜牛奶"),
    ("en", "Chocolate biscuits"),
    ("en", "Tomato ketchup"),
    ("en", "Basmati rice"),
]


@pytest.fixture
def channels(tmp_path: Path) -> Any:
    rng = np.random.default_rng(0)
    n = len(TITLES)
    vectors = rng.normal(size=(n, 8)).astype(np.float32)
    write_title_channels(tmp_path, TITLES, vectors)
    opened = ProductChannels(tmp_path, n)
    yield opened
    opened.close()


def test_the_edit_budget_is_one_from_five_letters_and_two_from_nine() -> None:
    assert [edit_budget("x" * n, 2) for n in (4, 5, 8, 9, 20)] == [0, 1, 1, 2, 2]
    assert [edit_budget("x" * n, 1) for n in (4, 5, 9)] == [0, 1, 1]
    assert edit_budget("x" * 9, 0) == 0


def test_a_mistyped_word_is_corrected_to_the_catalogues(channels: ProductChannels) -> None:
    got = correct_query(channels, "Avocdo", ["en"], None)
    assert got == Correction("avocado", {"avocdo": "avocado"}, {"avocado": "avocdo"})
    assert got.weights() == {"avocado": FUZZY_WEIGHT}
    # Known words stay as typed (case too); each mistyped one is corrected (9+ letters: two edits).
    got = correct_query(channels, "Basmati ricee with Strawbery yoghutr", ["en"], None)
    assert got is not None and got.text == "Basmati ricee with strawberry yoghurt"
    assert got.words == {"strawbery": "strawberry", "yoghutr": "yoghurt"}
    assert correct_query(channels, "havredyrck", ["sv"], None) == Correction(
        "havredryck", {"havredyrck": "havredryck"}, {"havredryck": "havredyrck"}
    )
    assert got.matched(["strawberri", "basmati"]) == {"strawbery": "strawberry"}


def test_nothing_is_corrected_when_off_known_too_short_or_of_a_spaceless_script(
    channels: ProductChannels,
) -> None:
    assert correct_query(channels, "avocdo", ["en"], 0) is None  # typos 0: off
    assert correct_query(channels, "avocado juices", ["en"], None) is None  # known, as stemmed too
    assert correct_query(channels, "jiuce", ["en"], None) is not None
    assert correct_query(channels, "rcie", ["en"], None) is None  # 4 letters: no edit
    assert correct_query(channels, "新鲜牛乃", ["zh"], None) is None  # bigrams: never fuzzed
    assert correct_query(channels, "ketchup2", ["en"], None) is None  # not letters only
    assert correct_query(channels, "chocolatte", ["en"], 1) is not None
    assert correct_query(channels, "chocolattte", ["en"], 1) is None  # two edits, one allowed
    assert correct_query(channels, "chocolattte", ["en"], 2) is not None
    assert correct_query(None, "avocdo", ["en"], None) is None  # no product channels


# -- through the service -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(catalogue: Catalogue, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with served_titles(catalogue, tmp_path_factory.mktemp("typos"), "typos", TITLES) as client:
        yield client


def test_a_mistyped_query_finds_the_product_by_its_words_and_says_what_it_searched(served: Any) -> None:
    body = search_text(served, query="avocdo")
    assert body["corrected_query"] == "avocado"
    top = body["results"][0]
    assert top["id"] == "p0" and top["explain"]["channels"]["lexical"]["rank"] == 0
    assert top["explain"]["terms"] == ["avocado"] and top["explain"]["typos"] == {"avocdo": "avocado"}
    assert sum(h["explain"]["channels"]["lexical"]["rank"] is not None for h in body["results"]) == 1
    # Off: nothing corrected, nothing found by its words.
    off = search_text(served, query="avocdo", typos=0)
    assert off["corrected_query"] is None
    assert all(h["explain"]["channels"]["lexical"]["rank"] is None for h in off["results"])
    # Spaceless scripts: never corrected.
    assert search_text(served, query="新鲜牛乃")["corrected_query"] is None


def test_the_served_catalogue_is_the_prior_of_a_querys_language(served: Any) -> None:
    """An unhinted query's language is read with the served version's languages and words as its prior
    (``service.language.CatalogueLanguages``): "laptop" is Indonesian to the detector alone (the demo
    model's languages), English in this shop, which writes mostly English; a hint still decides."""
    assert LanguageDetector(get_preset("demo").languages).detect("laptop").code == "id"
    assert search_text(served, query="laptop")["language"]["code"] == "en"
    assert search_text(served, query="laptop", lang="id")["language"]["code"] == "id"


def test_a_product_matching_as_typed_ranks_above_one_matching_as_corrected(served: Any) -> None:
    body = search_text(served, query="avocdo juice")
    assert body["corrected_query"] == "avocado juice"
    lexical = {h["id"]: h["explain"]["channels"]["lexical"] for h in body["results"]}
    # "Apple juice" (typed term) and "Hass avocado" (corrected term) score alike but for the weight.
    assert lexical["p1"]["rank"] == 0 and lexical["p0"]["rank"] == 1
    assert lexical["p0"]["score"] < lexical["p1"]["score"]
    by_id = {h["id"]: h["explain"] for h in body["results"]}
    assert by_id["p1"]["typos"] == {} and by_id["p0"]["typos"] == {"avocdo": "avocado"}


@pytest.mark.parametrize("value", [-1, 3, 10**30, 1.5, 1.0, "1", True, [1], {"n": 1}])
def test_hostile_typos_values_are_refused_naming_the_field(served: Any, value: object) -> None:
    response = served.post("/v1/search", json={"query": "avocdo", "typos": value})
    assert response.status_code == 422, response.text
    assert any(e["loc"][:2] == ["body", "typos"] for e in response.json()["detail"])


@pytest.mark.parametrize("value", [None, 0, 1, 2])
def test_each_typos_value_of_the_schema_is_answered(served: Any, value: int | None) -> None:
    body = search_text(served, query="chocolattte", typos=value)
    # Eleven letters, two edits from "chocolate": corrected with two edits allowed (the default) only.
    assert body["corrected_query"] == ("chocolate" if value in (None, 2) else None)


def test_a_query_certainly_in_a_language_the_catalogue_does_not_write_is_not_corrected(
    channels: ProductChannels,
) -> None:
    # "tomaco" is one edit from "tomato": corrected unless the
    # query is known to be in a language the shop never writes, whose words are not typos of the shop's.
    assert correct_query(channels, "tomaco", ["es"], None) is not None
    assert correct_query(channels, "tomaco", ["es"], None, certain=True) is None
    assert correct_query(channels, "tomaco", ["en"], None, certain=True) is not None


# -- the query language's dictionary -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dictionaries() -> QueryDictionaries:
    return QueryDictionaries(["en", "de", "es"])  # the model's languages; each built on first use


def test_a_word_the_catalogue_cannot_correct_is_corrected_from_the_query_languages_dictionary(
    channels: ProductChannels, dictionaries: QueryDictionaries
) -> None:
    # A German query in a shop that writes English and Swedish: no catalogue word is near "äpcel".
    assert correct_query(channels, "Äpcel", ["de"], None, certain=True) is None
    got = correct_query(channels, "Äpcel", ["de"], None, certain=True, dictionaries=dictionaries)
    assert got is not None and got.text == "äpfel" and got.words == {"äpcel": "äpfel"}
    assert got.dictionary == {"äpcel": "de"}
    # The catalogue holds no "äpfel": the lexical channel reads the query as typed, no term weighted.
    assert got.lexical_text == "Äpcel" and got.terms == {} and got.weights() == {}
    assert got.matched([]) == {"äpcel": "äpfel"}  # what every hit's dense channels were scored with
    # Several words: the known ones kept as typed, the catalogue's correction beside the dictionary's.
    got = correct_query(channels, "frische Äpcel Avocdo", ["de"], None, dictionaries=dictionaries)
    assert got is not None and got.text == "frische äpfel avocado"
    assert got.lexical_text == "frische Äpcel avocado" and got.dictionary == {"äpcel": "de"}
    assert got.weights() == {"avocado": FUZZY_WEIGHT}


def test_an_uncertain_query_is_looked_up_in_every_language_of_the_model(
    channels: ProductChannels, dictionaries: QueryDictionaries
) -> None:
    # "Milfh" (German "Milch" mistyped) is detected as anything; German is one of the model's languages.
    got = correct_query(channels, "Milfh", ["nl"], None, dictionaries=dictionaries)
    assert got is not None and got.words == {"milfh": "milch"} and got.dictionary == {"milfh": "de"}
    # Certain of another language: only that one's dictionary (English has no word one edit away).
    assert correct_query(channels, "Milfh", ["en"], None, certain=True, dictionaries=dictionaries) is None


def test_a_word_of_a_dictionary_is_left_alone_and_the_catalogues_correction_comes_first(
    channels: ProductChannels, dictionaries: QueryDictionaries
) -> None:
    for clean in ("Milch", "frische Milch", "leche", "manzanas"):  # German and Spanish words, clean
        assert correct_query(channels, clean, ["de"], None, dictionaries=dictionaries) is None
        assert correct_query(channels, clean, ["es"], None, certain=True, dictionaries=dictionaries) is None
    got = correct_query(channels, "avocdo", ["en"], None, dictionaries=dictionaries)
    assert got == Correction("avocado", {"avocdo": "avocado"}, {"avocado": "avocdo"})
    assert correct_query(channels, "Äpcel", ["de"], 0, dictionaries=dictionaries) is None  # typos 0: off
    assert correct_query(channels, "新鲜牛乃", ["zh"], None, dictionaries=dictionaries) is None  # bigrams
    assert correct_query(channels, "Äpc", ["de"], None, dictionaries=dictionaries) is None  # 3 letters


def test_a_dictionary_knows_its_words_and_is_asked_only_for_words_of_its_script(
    dictionaries: QueryDictionaries,
) -> None:
    german = dictionaries.of("de")
    assert german is not None and german.knows("äpfel") and german.knows("fruchtsaft")  # large list
    assert not german.knows("äpcel")
    assert [d.lang for d in dictionaries.for_word("milfh", ["de", "ru", "en"])] == ["de", "en"]
    assert dictionaries.for_word("молоко", ["de", "en"]) == []
    assert dictionaries.of("xx") is None  # no word list
    near = nearest_in("manzznas", dictionaries.for_word("manzznas", ["en", "es"]), 1)
    assert near is not None and (near.word, near.lang, near.edits) == ("manzanas", "es", 1)
    # Two edits from nine letters only when asked; a word of one of them is never corrected.
    assert nearest_in("manzzznas", dictionaries.for_word("manzzznas", ["es"]), 1) is None
    assert nearest_in("manzzznas", dictionaries.for_word("manzzznas", ["es"]), 2) is not None
    assert nearest_in("manzanas", dictionaries.for_word("manzanas", ["es"]), 2) is None


def test_a_mistyped_german_query_is_searched_as_corrected_and_says_so(served: Any) -> None:
    body = search_text(served, query="Äpcel", lang="de")
    assert body["corrected_query"] == "äpfel"
    assert all(h["explain"]["typos"] == {"äpcel": "äpfel"} for h in body["results"])
    assert all(h["explain"]["channels"]["lexical"]["rank"] is None for h in body["results"])
    assert search_text(served, query="Äpcel", lang="de", typos=0)["corrected_query"] is None
    assert search_text(served, query="Äpfel", lang="de")["corrected_query"] is None  # clean: left alone


def test_a_cached_answer_says_what_it_searched_and_typos_are_in_its_key(served: Any) -> None:
    first = search_text(served, query="avocdo", top_k=3)
    again = search_text(served, query="avocdo", top_k=3)
    assert again["cached"] is True and again["corrected_query"] == first["corrected_query"] == "avocado"
    assert [h["id"] for h in again["results"]] == [h["id"] for h in first["results"]]
    off = search_text(served, query="avocdo", top_k=3, typos=0)  # another key: not the corrected answer
    assert off["cached"] is False and off["corrected_query"] is None


def test_a_long_word_no_common_word_is_near_is_corrected_to_a_rarer_word_of_the_large_list(
    channels: ProductChannels, dictionaries: QueryDictionaries
) -> None:
    # "Zitronensaft" is under the small list's cut (as most compounds are): only the large list holds it.
    german = dictionaries.of("de")
    assert german is not None and german.within("zitronemsaft", 1) == [] == german.within("zitronemsaft", 2)
    got = correct_query(channels, "Zitronemsaft", ["de"], None, certain=True, dictionaries=dictionaries)
    assert got is not None and got.words == {"zitronemsaft": "zitronensaft"}
    assert got.dictionary == {"zitronemsaft": "de"}
    # Uncertain: looked up in every language of the model alike.
    got = correct_query(channels, "himbeersaff", ["nl"], None, dictionaries=dictionaries)
    assert got is not None and got.words == {"himbeersaff": "himbeersaft"}
    assert correct_query(channels, "Zitronensaft", ["de"], None, dictionaries=dictionaries) is None  # known


def test_rarer_words_are_asked_for_only_where_no_common_one_is_one_edit_away() -> None:
    asked: list[int] = []

    def rare() -> dict[str, int]:
        asked.append(1)
        return {"orangensaft": 700, "tomatenmark": 720, "saftig": 650}

    common = {"orangenbaum": 550, "tomatenmarkt": 560, "tomatenmus": 590}
    lexicon = Dictionary("xx", [*common, *rare()], common, rare)
    asked.clear()
    # A common word one edit away: the rarer ones are never read.
    near = nearest_in("tomatenmus", [lexicon], 2)
    assert near is None and asked == []  # a word of the dictionary
    near = nearest_in("tomatenmis", [lexicon], 2)
    assert near is not None and near.word == "tomatenmus" and asked == []
    # None one edit away: a rarer word one edit away comes before a common one two edits away.
    near = nearest_in("orangensaff", [lexicon], 2)
    assert near is not None and (near.word, near.edits, near.centibels) == ("orangensaft", 1, 700)
    assert asked == [1]
    near = nearest_in("tomatenmzrk", [lexicon], 2)  # "tomatenmark" one edit, "tomatenmarkt" two
    assert near is not None and near.word == "tomatenmark" and asked == [1]  # read once
    # Rarer words have seven letters or more: a word of five, one edit from none, never reads them.
    asked.clear()
    fresh = Dictionary("xx", common, common, rare)
    assert nearest_in("safte", [fresh], 1) is None and asked == []
    assert nearest_in("orangensaff", [fresh], 1) is not None and asked == [1]
