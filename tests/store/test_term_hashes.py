"""store.products.term_hashes: the coverage feature's term presence from hashed terms, against the stored
terms
(what a version written before them reads) and on the whole hybrid gather."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from store.errors import IndexFormatError
from store.products.channels import ProductChannels
from store.products.hybrid import HybridQuery, gather
from store.products.term_hashes import TERM_HASHES, TERM_OFFSETS, TermHashes, term_hash, write_term_hashes
from store.text.lexical import analyze
from tests.store.test_products import TEXTS, make_channels


def test_presence_equals_membership_in_the_stored_terms(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    vocab = [f"t{i}" for i in range(40)] + ["牛奶", "ö", "a b"]
    rows = [list(rng.choice(vocab, size=int(rng.integers(0, 9)))) for _ in range(300)]
    rows[7] = []  # a value with no term
    write_term_hashes(tmp_path, rows)
    hashes = TermHashes.open(tmp_path, len(rows))
    assert hashes is not None
    for _ in range(30):
        asked = rng.integers(0, len(rows), int(rng.integers(0, 60)))
        asked[: min(2, asked.size)] = 7
        terms = [*rng.choice(vocab, size=int(rng.integers(1, 6))).tolist(), "absent"]
        expected = [[t in set(rows[r]) for t in terms] for r in asked.tolist()]
        assert hashes.presence(asked, terms).tolist() == expected
    assert term_hash("milk") == term_hash("milk") != term_hash("milk ")


def test_a_version_without_hashes_reads_its_stored_terms_with_the_same_features(tmp_path: Path) -> None:
    channels, _, _, text_vecs, _ = make_channels(tmp_path)
    queries = [
        HybridQuery(text_vecs[i], analyze(text, lang), "en", [analyze(text, lang), analyze(text, None)])
        for i, (_, _, lang, text) in enumerate(TEXTS)
    ]
    with_hashes = [gather(channels, q, 10, None) for q in queries]
    channels.close()
    (tmp_path / TERM_HASHES).unlink()  # as a version written before them
    (tmp_path / TERM_OFFSETS).unlink()
    old = ProductChannels(tmp_path, 4)
    assert old._term_hashes is None
    for q, new in zip(queries, with_hashes, strict=True):
        before = gather(old, q, 10, None)
        np.testing.assert_array_equal(before.rows, new.rows)
        np.testing.assert_array_equal(before.features, new.features)
        assert [before.matched_terms(i) for i in range(len(before))] == [
            new.matched_terms(i) for i in range(len(new))
        ]
        assert any(new.matched_terms(i) for i in range(len(new)))
    old.close()


def test_offsets_that_do_not_cover_the_text_rows_are_a_format_error(tmp_path: Path) -> None:
    make_channels(tmp_path)[0].close()
    np.save(tmp_path / TERM_OFFSETS, np.zeros(3, np.int64))
    with pytest.raises(IndexFormatError, match=TERM_OFFSETS):
        ProductChannels(tmp_path, 4)
