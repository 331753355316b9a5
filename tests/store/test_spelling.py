"""A version's vocabulary (store.text.spelling) and weighted lexical terms (store.text.lexical_index,
store.products.hybrid) on
small hand-made products, against exact references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from store.products.channels import ProductChannels
from store.products.hybrid import HybridQuery, gather
from store.text.lexical import analyze, words_of
from store.text.spelling import MAX_WORD, Nearest, Vocabulary
from tests.titled_products import write_title_channels

TEXTS = [
    ("en", "Hass avocado, ripe and ready"),
    ("en", "Avocado oil"),
    ("en", "Avocados from Peru"),
    ("en", "Bravado sauce"),
    ("sv", "Ekologisk havredryck"),
    ("zh", "新鲜牛奶"),
    ("en", "Green apples"),
    ("en", "Strawberry yoghurt"),
]


def channels_of(root: Path, texts: list[tuple[str, str]]) -> ProductChannels:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(len(texts), 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_title_channels(root, texts, vectors)
    return ProductChannels(root, len(texts))


def test_the_vocabulary_holds_words_their_frequencies_and_stems_but_no_spaceless_scripts() -> None:
    vocabulary = Vocabulary.of_texts([(t, lang) for lang, t in TEXTS])
    assert vocabulary.words["avocado"] == 2 and vocabulary.words["avocados"] == 1
    assert vocabulary.words["havredryck"] == 1 and "新鲜牛奶" not in vocabulary.words
    assert not any("牛" in w for w in vocabulary.words) and not any("牛" in s for s in vocabulary.stems)
    # A stem's word is its most frequent one: "avocado" (2 values) over "avocados" (1).
    assert vocabulary.stems["avocado"] == "avocado" and vocabulary.stems["appl"] == "apples"
    assert vocabulary.knows("avocado") and vocabulary.knows("avocadoes", ["avocado"])
    assert not vocabulary.knows("avocdo", analyze("avocdo", "en"))
    assert words_of("Ｈass 新鲜牛奶 x200") == ["hass", "x200"]  # NFKC, folded, no bigram words


def test_nearest_takes_fewest_edits_then_the_most_frequent_word() -> None:
    vocabulary = Vocabulary.of_texts([(t, lang) for lang, t in TEXTS])
    assert vocabulary.nearest("avocdo", [], 1) == Nearest("avocado", 1)  # a deletion
    assert vocabulary.nearest("avoacdo", [], 1) == Nearest("avocado", 1)  # a swap of neighbours is one edit
    assert vocabulary.nearest("havredrykc", [], 2) == Nearest("havredryck", 1)
    # Two edits only where allowed: "avacodo" is two from "avocado".
    assert vocabulary.nearest("avacodo", [], 1) is None
    assert vocabulary.nearest("avacodo", [], 2) == Nearest("avocado", 2)
    # A tie at one edit: "avocadoz" is one from "avocado" (2 values) and from "avocados" (1): the more
    # frequent wins.
    assert vocabulary.nearest("avocadoz", [], 1) == Nearest("avocado", 1)
    assert vocabulary.nearest("x" * (MAX_WORD + 1), [], 2) is None


def test_nearest_reaches_a_word_through_its_stem() -> None:
    vocabulary = Vocabulary.of_texts([("Fresh strawberries", "en"), ("Green apples", "en")])
    # "strawbery" is three edits from "strawberries" as written, but its stem "strawberi" one from the
    # indexed "strawberri": corrected to that stem's word.
    stems = analyze("strawbery", "en")
    assert stems == ["strawberi"]
    assert vocabulary.nearest("strawbery", [], 1) is None
    assert vocabulary.nearest("strawbery", stems, 1) == Nearest("strawberries", 1, via_stem=True)
    # Words before stems at the same distance: "applws" is one substitution from "apples".
    assert vocabulary.nearest("applws", analyze("applws", "en"), 1) == Nearest("apples", 1)


def test_a_version_derives_its_vocabulary_once_from_its_text_values(tmp_path: Path) -> None:
    channels = channels_of(tmp_path, TEXTS)
    try:
        first = channels.vocabulary()
        assert channels.vocabulary() is first and len(first) == len(
            {w for _, t in TEXTS for w in words_of(t)}
        )
    finally:
        channels.close()


@pytest.mark.parametrize("weight", [0.5, 0.25])
def test_a_weighted_term_scores_its_weight_of_bm25_and_of_the_coverage(tmp_path: Path, weight: float) -> None:
    channels = channels_of(tmp_path, TEXTS)
    try:
        plain = channels.lexical(["avocado"], 5, None)
        weighted = channels.lexical(["avocado"], 5, None, weights={"avocado": weight})
        assert weighted.owners.tolist() == plain.owners.tolist()
        np.testing.assert_allclose(weighted.scores, plain.scores * weight, rtol=1e-5)
        # "avocado" weighed down, "sauce" not: a product holding the typed term ranks above one holding the
        # corrected term, though alone each would score alike (BM25 of one term in a 2-word value: close).
        terms = analyze("sauce avocado", "en")
        assert terms == ["sauc", "avocado"]
        query = HybridQuery(np.zeros(8, np.float32), terms, weights={"avocado": weight})
        cands = gather(channels, query, 10, None, use_image=False)
        lexical = dict(zip(cands.rows.tolist(), cands.features[:, 2].tolist(), strict=True))
        idf = channels.term_idf(terms)
        share = idf["sauc"] / (idf["sauc"] + weight * idf["avocado"])
        assert lexical[3] == pytest.approx(share, rel=1e-5)  # "Bravado sauce": the typed term
        assert lexical[1] == pytest.approx(1 - share, rel=1e-5)  # "Avocado oil": the corrected term
        assert lexical[3] > lexical[1]
    finally:
        channels.close()


def test_a_short_stem_is_not_corrected_to_another_short_stem() -> None:
    vocabulary = Vocabulary.of_texts([("Oranges or lemons", "en")])
    # "oeras" (5 letters) is two edits from every word, and its Portuguese stem "oer" one from "or": a stem
    # of 3 letters may not move by an edit.
    stems = analyze("oeras", "pt")
    assert stems == ["oer"] and "or" in vocabulary.stems
    assert vocabulary.nearest("oeras", stems, 1) is None
