"""The service's query language (``service.language``: ``store.text.language_id``'s detector, a hint, the
served
catalogue's prior): accuracy on short queries of held-out catalogue captions and of real captions (Multi30K,
when ../shared/data is there), queries in languages the model lacks, close relatives, hints, mixed and
letterless queries, the cache, and the catalogue prior on issue 45's short shop queries.

The held-out captions use seed 2026: the detector's constants were tuned on seed 7 (train split) and
Multi30K train lines, and bench/language_id.py reports seed 123 (see store/text/language_id.py). The core's
own
evidence (word table, compounds, halves) is tested in tests/store/test_language_id.py.
"""

from __future__ import annotations

import gc
import gzip
import re
import weakref
from pathlib import Path

import pytest

from model.configs import get_preset
from model.starter.config import USE_M3_LANGUAGES
from service.language import (
    SHARE_BONUS,
    WORD_BONUS,
    CatalogueLanguages,
    LanguageDetector,
    catalogue_languages,
)
from store.text.language_id import normalise_code
from store.text.spelling import Vocabulary
from synthetic.synth import SynthConfig, iter_items
from tests.store.test_language_id import SHOP_QUERIES as DETECTED_ALONE

DEMO = tuple(get_preset("demo").languages)
MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(DEMO)  # the shipped model's ten


def first_words(text: str, lang: str, n: int) -> str:
    """The first n words; Chinese and Japanese have no spaces: their first 2n letters."""
    if lang in ("ja", "zh"):
        return "".join([char for char in text if char.isalnum()][: 2 * n])
    return _EDGE.sub("", " ".join(text.split()[:n]))


def held_out_captions(n_items: int = 300) -> dict[str, list[str]]:
    captions: dict[str, list[str]] = {}
    for item in iter_items("test", SynthConfig(seed=2026, n_train=0, n_val=0, n_test=n_items)):
        for lang, texts in item.captions.items():
            captions.setdefault(lang, []).append(texts[0])
    return captions


def accuracy(detector: LanguageDetector, lang: str, queries: list[str]) -> float:
    return sum(detector.detect(q).code == lang for q in queries) / len(queries)


@pytest.mark.parametrize("n_words", [2, 3])
def test_short_queries_of_held_out_captions_in_every_language(
    detector: LanguageDetector, n_words: int
) -> None:
    captions = held_out_captions()
    assert set(captions) == set(DEMO)
    for lang, texts in captions.items():
        queries = [first_words(text, lang, n_words) for text in texts]
        got = accuracy(detector, lang, queries)
        wrong = [(q, detector.detect(q).code) for q in queries if detector.detect(q).code != lang][:5]
        assert got >= 0.95, (lang, got, wrong)


def test_whole_captions_are_confident(detector: LanguageDetector) -> None:
    """The search tests expect a whole caption's language with confidence > 0.5."""
    for lang, texts in held_out_captions(60).items():
        for text in texts:
            info = detector.detect(text)
            assert (info.code, info.supported, info.source) == (lang, True, "detected"), text
            assert 0.5 < info.confidence <= 1.0, (text, info)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent (shared data not checked out here)")
@pytest.mark.parametrize("n_words", [2, 3])
def test_short_cuts_of_real_captions(detector: LanguageDetector, n_words: int) -> None:
    """Multi30K test_2016_flickr (real Flickr30K captions in en/de/fr/cs): >= 95 % at 2 and 3 words."""
    for lang in ("en", "de", "fr", "cs"):
        with gzip.open(MULTI30K / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as fh:
            queries = [first_words(line, lang, n_words) for line in fh if line.strip()]
        assert len(queries) == 1000
        got = accuracy(detector, lang, queries)
        assert got >= 0.95, (lang, n_words, got)


def test_the_reported_examples(detector: LanguageDetector) -> None:
    info = detector.detect("tiga payung kuning")  # Indonesian was labelled tl, unsupported, 0.42
    assert (info.code, info.supported) == ("id", True) and info.confidence >= 0.9
    for query in ("लाल धारीदार मग", "नीली कार", "मुझे लाल जूते चाहिए"):  # Hindi was labelled cs / es
        info = detector.detect(query)
        assert (info.code, info.supported) == ("hi", False), (query, info)


@pytest.mark.parametrize(
    ("lang", "queries"),
    [
        ("hi", ["सफ़ेद जूते", "बच्चों के कपड़े", "पीला बैग"]),
        ("ko", ["검은 가방", "아이 신발", "노란색 컵"]),
        ("ar", ["حقيبة سوداء", "أحذية أطفال", "كوب أصفر"]),
        ("el", ["μαύρη τσάντα", "παιδικά παπούτσια", "κίτρινο φλιτζάνι"]),
        ("th", ["กระเป๋าสีดำ", "รองเท้าเด็ก", "แก้วสีเหลือง"]),
        ("he", ["תיק שחור", "נעלי ילדים", "כוס צהובה"]),
    ],
)
def test_a_script_of_one_language_decides(detector: LanguageDetector, lang: str, queries: list[str]) -> None:
    for query in queries:
        info = detector.detect(query)
        assert (info.code, info.supported) == (lang, False) and info.confidence > 0.9, (query, info)


def test_unsupported_languages_in_shared_scripts_are_not_confidently_supported(
    detector: LanguageDetector,
) -> None:
    """Latin and Cyrillic queries in languages the demo model lacks: labelled unsupported, or a supported
    language at confidence < 0.5 (a few short queries are valid text in a supported language too)."""
    queries = {
        "pl": ["czarna torba", "buty dziecięce", "żółty kubek w kropki"],
        "it": ["borsa nera", "scarpe per bambini", "tazza gialla"],
        "pt": ["bolsa preta", "sapatos infantis", "caneca amarela"],
        "nl": ["zwarte tas", "kinderschoenen", "gele beker met stippen"],
        "sv": ["svart väska", "barnskor", "gul kopp"],
        "hu": ["fekete táska", "gyerekcipő", "sárga csésze"],
        "ro": ["geantă neagră", "pantofi pentru copii", "cană galbenă"],
        "vi": ["túi xách màu đen", "giày trẻ em", "cốc màu vàng"],
        "fi": ["musta laukku", "lasten kengät", "keltainen kuppi"],
        "uk": ["чорна сумка", "дитяче взуття", "жовта чашка"],
        "bg": ["черна чанта", "детски обувки", "жълта чаша"],
    }
    bad = []
    for lang, texts in queries.items():
        for query in texts:
            info = detector.detect(query)
            if info.supported and info.confidence >= 0.5:
                bad.append((lang, query, info.code, info.confidence))
    assert len(bad) <= 1, bad  # at most one of 33


@pytest.mark.parametrize("left_out", ["de", "fr", "es", "tr"])
def test_a_language_the_model_lacks_is_not_given_a_confident_supported_label(left_out: str) -> None:
    """Captions in a language outside the supported set: a detector built without that language gives
    their 2- and 3-word queries a supported language at confidence >= 0.5 at most 2 % of the time."""
    supported = [c for c in DEMO if c != left_out]
    detector = LanguageDetector(supported)
    texts = held_out_captions(150)[left_out]
    queries = [first_words(t, left_out, n) for t in texts for n in (2, 3)]
    wrong = [q for q in queries if (i := detector.detect(q)).supported and i.confidence >= 0.5]
    assert len(wrong) <= 0.02 * len(queries), wrong[:10]


def test_close_relatives_count_for_the_supported_language() -> None:
    """Malay counts for Indonesian while Indonesian is supported; without it, Malay is its own label."""
    demo, starter = LanguageDetector(DEMO), LanguageDetector(USE_M3_LANGUAGES)  # starter: no id
    info = demo.detect("kereta merah")  # Malay for "red car" (Indonesian: mobil merah)
    assert (info.code, info.supported) == ("id", True)
    info = starter.detect("kereta merah")
    assert (info.code, info.supported) == ("ms", False)


def test_the_starter_models_languages_are_supported() -> None:
    starter = LanguageDetector(USE_M3_LANGUAGES)
    for query, code in [
        ("빨간 우산", "ko"),
        ("مظلة حمراء", "ar"),
        ("ร่มสีแดง", "th"),
        ("ombrello rosso", "it"),
        ("guarda-chuva vermelho", "pt"),
        ("czerwona torba w paski", "pl"),
        ("紅色雨傘", "zh"),  # traditional characters: labelled zh like simplified
        ("赤い傘", "ja"),
    ]:
        info = starter.detect(query)
        assert (info.code, info.supported) == (code, True), (query, info)


def test_a_supported_language_without_a_word_list_is_still_a_candidate() -> None:
    """A model trained for Swahili or Kyrgyz (no wordfreq list): py3langid's characters alone label them."""
    detector = LanguageDetector(["en", "sw", "ky"])
    for query, code in [("mwavuli mwekundu", "sw"), ("viatu vya watoto", "sw"), ("кызыл кол чатыр", "ky")]:
        info = detector.detect(query)
        assert (info.code, info.supported) == (code, True), (query, info)


def test_hint_letterless_and_mixed(detector: LanguageDetector) -> None:
    hinted = detector.resolve("three yellow umbrellas", "de-AT")
    assert (hinted.code, hinted.confidence, hinted.source, hinted.supported) == ("de", 1.0, "hint", True)
    assert detector.resolve("x", "pl").supported is False
    for text in ("12345 !!", "…", "Ⅻ"):
        info = detector.resolve(text, None)
        assert (info.code, info.confidence, info.supported) == ("und", 0.0, False), text
    assert detector.detect("red mug 红色杯子").mixed is True  # two scripts
    assert detector.detect("roter gestreifter Becher red striped mug").mixed is True  # two halves
    assert detector.detect("roter gestreifter Becher mit Punkten").mixed is False
    assert detector.detect("赤い傘と青い靴").mixed is False  # Han with kana is one script


def test_normalise_code() -> None:
    assert [normalise_code(c) for c in ("EN", "en-US", "zh_Hans", " pt-BR ")] == ["en", "en", "zh", "pt"]


@pytest.mark.parametrize(
    "query", ["size 42 44 46", "red cup 2 3", "42 44 red cup", "1 2 3 4", "... !!! ?? --", "12 34 56 mug"]
)
def test_queries_with_letterless_halves(query: str) -> None:
    """A 4-word query whose half has no letters is not "mixed" (a half of digits crashed the mixing check)."""
    info = LanguageDetector(DEMO).resolve(query, None)
    assert not info.mixed and 0.0 <= info.confidence <= 1.0


def test_detected_languages_are_cached_by_text() -> None:
    """With ``cache_size`` a repeated query is answered from the cache (the same answer, a copy of it);
    without, every query is classified."""
    cached, plain = LanguageDetector(DEMO, cache_size=4), LanguageDetector(DEMO)
    first = cached.resolve("drei gelbe Regenschirme", None)
    calls = []
    cached.detect = lambda text, catalogue=None: calls.append(text)  # type: ignore[method-assign,assignment,return-value]
    again = cached.resolve("drei gelbe Regenschirme", None)
    assert again == first == plain.resolve("drei gelbe Regenschirme", None) and again is not first
    assert calls == []
    assert cached.resolve("three yellow umbrellas", "en").source == "hint"  # a hint is never cached


# -- the catalogue prior (issue 45) ------------------------------------------------------------------------

# A shop writing English and Swedish, as a grocery does (English titles, Swedish retailer titles and
# descriptions); written here, not taken from a data set.
SHOP = [
    ("en", "Alpro Soy Yoghurt Blueberry"),
    ("en", "Soy based yoghurt with a mild blueberry taste"),
    ("en", "Oat drink, organic"),
    ("sv", "Havredryck ekologisk"),
    ("en", "Apple juice from concentrate"),
    ("sv", "Äpple juice med fruktkött"),
    ("en", "Orange juice"),
    ("sv", "Apelsinjuice från koncentrat"),
    ("en", "Water melon class 1"),
    ("en", "Pear Conference class 1"),
    ("sv", "Saftiga päron från Belgien"),
    ("en", "Yellow onion class 1"),
    ("en", "Medium fat milk"),
    ("sv", "Mellanmjölk ekologisk 1,5%"),
    ("en", "Carrots"),
    ("sv", "Morötter i påse"),
]
# Issue 45's reported queries with what they are in: with the shop's prior, every one.
SHOP_QUERIES = {**DETECTED_ALONE, "soy yoghurt": "en", "laptop": "en"}


def shop() -> CatalogueLanguages:
    values = [(text, lang) for lang, text in SHOP]
    counts: dict[str, int] = {}
    for _, lang in values:
        counts[lang] = counts.get(lang, 0) + 1
    return CatalogueLanguages(counts, Vocabulary.of_texts(values))


def test_the_catalogue_prior_reads_the_shops_languages_and_words() -> None:
    """Languages of >= 5 % of the text values gain the share bonus; each query word the shop writes in a
    language gains that language the word bonus."""
    values = [(text, lang) for lang, text in SHOP] + [("Apfelsaft", "de")]
    catalogue = CatalogueLanguages({"en": 60, "sv": 36, "de": 4}, Vocabulary.of_texts(values))  # de: 4 %
    assert catalogue.languages == {"en": SHARE_BONUS, "sv": SHARE_BONUS}
    assert catalogue.bias(["soy", "yoghurt"]) == {"en": SHARE_BONUS + 2 * WORD_BONUS, "sv": SHARE_BONUS}
    assert catalogue.bias(["juice"]) == {"en": SHARE_BONUS + WORD_BONUS, "sv": SHARE_BONUS + WORD_BONUS}
    assert catalogue.bias(["apfelsaft"]) == {**catalogue.languages, "de": WORD_BONUS}
    assert CatalogueLanguages({"und": 4}, None).bias(["milk"]) == {}
    assert shop().key != shop().key  # each catalogue its own cache key


def test_short_shop_queries_with_the_catalogue_prior() -> None:
    """The starter model's languages (no Swedish): 11 of the 13 without the prior ("soy yoghurt" is
    Spanish, "laptop" Dutch), all 13 with it; the shop's prior keeps German and French queries in their
    language."""
    detector = LanguageDetector(USE_M3_LANGUAGES)
    catalogue = shop()
    got = {query: detector.detect(query, catalogue).code for query in SHOP_QUERIES}
    assert got == SHOP_QUERIES
    without = {query: detector.detect(query).code for query in SHOP_QUERIES}
    assert {q for q, code in without.items() if code != SHOP_QUERIES[q]} == {"soy yoghurt", "laptop"}
    info = detector.detect("Apfelsaft", catalogue)
    assert (info.code, info.supported, info.source) == ("de", True, "detected")


def test_the_cache_keeps_each_catalogues_answer() -> None:
    """The same text on two catalogues (or none) is two cache entries: a search reads its own version's."""
    detector = LanguageDetector(USE_M3_LANGUAGES, cache_size=8)
    catalogue = shop()
    assert detector.resolve("soy yoghurt", None).code == "es"
    assert detector.resolve("soy yoghurt", None, catalogue).code == "en"
    assert detector.resolve("soy yoghurt", None).code == "es"
    assert detector.resolve("soy yoghurt", "es", catalogue).source == "hint"


class FakeChannels:
    """What ``catalogue_languages`` reads of a version's product channels."""

    def __init__(self, texts: int) -> None:
        self.info = type("Info", (), {"texts": texts, "language_counts": {"en": 12, "sv": 4}})()
        self.built = 0

    def vocabulary(self) -> Vocabulary:
        self.built += 1
        return Vocabulary.of_texts([("Oat drink", "en"), ("Havredryck", "sv")])


def test_a_versions_catalogue_prior_is_made_once_and_held_weakly() -> None:
    channels = FakeChannels(texts=16)
    first = catalogue_languages(channels)  # type: ignore[arg-type]
    assert first is not None and catalogue_languages(channels) is first  # type: ignore[arg-type]
    assert channels.built == 1 and first.bias(["havredryck"]) == {"en": SHARE_BONUS, "sv": 3.0}
    assert catalogue_languages(None) is None
    assert catalogue_languages(FakeChannels(texts=0)) is None  # type: ignore[arg-type]  # no product text
    ref = weakref.ref(first)
    del channels, first
    gc.collect()
    assert ref() is None  # gone with its version
