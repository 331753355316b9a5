"""Product channels (store.products.channels), lexical analysis (store.text.lexical) and hybrid candidates
(store.products.hybrid) on small hand-made products, checked against exact references."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from store.errors import IndexFormatError
from store.layout import LEXICAL_DIR, file_checksums
from store.products.channels import (
    TEXT_SUM_NORMS,
    PhotoRows,
    ProductChannels,
    ProductInfo,
    TextRows,
    write_product_channels,
)
from store.products.hybrid import (
    FEATURES,
    LEGACY_FEATURES,
    FusionModel,
    GroupParams,
    HybridQuery,
    fuse,
    gather,
    rrf,
)
from store.text.lexical import analyze, analyze_variants, match_expression

DIM = 8


def unit(rng: np.random.Generator, n: int, d: int = DIM) -> np.ndarray:
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


TEXTS = [
    (0, "title", "en", "Organic oat drink"),
    (0, "title@sv", "sv", "Ekologisk havredryck"),
    (1, "title", "en", "Apple juice, freshly pressed"),
    (2, "title", "zh", "新鲜牛奶"),
    (2, "title", "en", "Fresh milk"),
    (3, "title", "ja", "オーツミルク"),
]


def make_channels(
    root: Path, *, exact_max: int = 20_000, photos_per: tuple[int, ...] = (3, 1, 2, 1)
) -> tuple:
    rng = np.random.default_rng(0)
    owners = np.repeat(np.arange(len(photos_per)), photos_per).astype(np.int64)
    photo_vecs = unit(rng, owners.size)
    visual = unit(rng, owners.size, 5)
    text_vecs = unit(rng, len(TEXTS))
    photos = PhotoRows(owners, [f"p{i}.jpg" for i in range(owners.size)], photo_vecs, visual)
    texts = TextRows(
        owners=np.asarray([t[0] for t in TEXTS], np.int64),
        fields=[t[1].split("@")[0] for t in TEXTS],
        langs=[t[2] for t in TEXTS],
        texts=[t[3] for t in TEXTS],
        terms=[analyze(t[3], t[2]) for t in TEXTS],
        embeds=text_vecs,
    )
    info = ProductInfo(
        fields=["title"], text_languages=["en", "ja", "sv", "zh"], language_counts={}, photos=0, texts=0
    )
    write_product_channels(root, info, photos, texts, exact_max=exact_max)
    return ProductChannels(root, len(photos_per)), photo_vecs, visual, text_vecs, owners


def test_analysis_bigrams_spaceless_scripts_and_stems() -> None:
    assert analyze("牛奶", None) == ["牛奶"]  # a 2-character Chinese query is one term
    assert analyze("新鲜牛奶", "zh") == ["新鲜", "鲜牛", "牛奶"]
    assert analyze("オーツミルク", "ja") == ["オー", "ーツ", "ツミ", "ミル", "ルク"]
    assert analyze("Apples", "en") == ["appl"] and analyze("apple", "en") == ["appl"]
    assert analyze("havredrycker", "sv") == analyze("havredryck", "sv")
    # Unknown language: folded, not stemmed; mixed scripts split.
    assert analyze("iPhone手机", "xx") == ["iphone", "手机"]
    assert analyze_variants("Bol blancos", ["es", "fr"]) == ["bol", "blanc", "blancos"]
    assert match_expression(['a"b', "OR"]) == '"a""b" OR "OR"'


def test_photo_channel_best_photo_wins_and_matches_exact(tmp_path: Path) -> None:
    channels, photo_vecs, _, _, owners = make_channels(tmp_path)
    q = photo_vecs[3]  # product 1's only photo
    hits = channels.photos.search(q, 10, None)
    sims = photo_vecs @ q
    expected = {int(o): float(sims[owners == o].max()) for o in np.unique(owners)}
    assert hits.owners.tolist() == sorted(expected, key=lambda o: -expected[o])
    np.testing.assert_allclose(hits.scores, [expected[o] for o in hits.owners.tolist()], atol=1e-6)
    assert hits.owners[0] == 1 and hits.via[0] == 3
    # One hit per product, however many photos it has; allowed mask drops products.
    allowed = np.asarray([True, False, True, True])
    assert 1 not in channels.photos.search(q, 10, allowed).owners.tolist()
    scores, via = channels.photos.best_of(q, np.asarray([0, 2]))
    np.testing.assert_allclose(scores, [expected[0], expected[2]], atol=1e-6)
    assert channels.photo_index_of(int(via[1])) == int(via[1]) - 4 and channels.photo_paths([2])[2] == [
        "p4.jpg",
        "p5.jpg",
    ]
    # Visual vectors: their own set.
    assert channels.visual is not None and channels.visual_vectors.vectors.shape == (7, 5)
    channels.close()


def test_ann_path_equals_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    exact_dir, ann_dir = tmp_path / "exact", tmp_path / "ann"
    exact_dir.mkdir()
    ann_dir.mkdir()
    exact = make_channels(exact_dir)[0]
    ann = make_channels(ann_dir, exact_max=0)[0]  # HNSW over the photos and texts
    for q in unit(rng, 5):
        a, b = exact.photos.search(q, 4, None), ann.photos.search(q, 4, None)
        assert a.owners.tolist() == b.owners.tolist()
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)


def test_lexical_bm25_cjk_and_masks(tmp_path: Path) -> None:
    channels = make_channels(tmp_path)[0]
    hits = channels.lexical(analyze("牛奶", "zh"), 10, None)
    assert hits.owners.tolist() == [2]
    hits = channels.lexical(analyze("apple", "en"), 10, None)
    assert hits.owners.tolist() == [1]
    hits = channels.lexical(analyze("havredryck", "sv"), 10, None)
    assert hits.owners.tolist() == [0] and channels.texts_of([int(hits.via[0])])[1][0] == "title"
    # A row mask hides values (calibration hides a pseudo-query's own text).
    mask = np.ones(len(TEXTS), bool)
    mask[1] = False
    assert channels.lexical(analyze("havredryck", "sv"), 10, None, mask).owners.size == 0
    assert channels.lexical([], 10, None).owners.size == 0
    idf = channels.term_idf(["milk", "nothing"])
    assert idf["nothing"] > idf["milk"] > 0


def test_lexical_scores_are_bm25_and_the_index_is_checksummed(tmp_path: Path) -> None:
    """tantivy's scores equal BM25 computed here (k1 1.2, b 0.75, IDF ln(1 + (N - n + 0.5) / (n + 0.5)),
    document length in terms), diacritics fold, and the index folder's files are data files."""
    channels = make_channels(tmp_path)[0]
    docs = [analyze(t[3], t[2]) for t in TEXTS]
    avgdl = sum(map(len, docs)) / len(docs)

    def bm25(doc: list[str], terms: list[str]) -> float:
        total = 0.0
        for term in dict.fromkeys(terms):
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            if tf:
                idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                total += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / avgdl))
        return total

    terms = analyze("fresh apple milk", "en")
    hits = channels.lexical(terms, 10, None)
    want = {o: max(bm25(docs[r], terms) for r in range(len(TEXTS)) if TEXTS[r][0] == o) for o in (1, 2)}
    assert sorted(hits.owners.tolist()) == [1, 2]
    # tantivy quantises document lengths into 256 buckets (fieldnorms): exact for these short values.
    np.testing.assert_allclose(hits.scores, [want[o] for o in hits.owners.tolist()], rtol=1e-5)
    assert channels.lexical(["öat"], 10, None).owners.tolist() == [0]  # folded as the index folds
    assert channels.term_idf(["oat"])["oat"] == pytest.approx(np.log(1 + (6 - 1 + 0.5) / 1.5))
    # The reader writes nothing into the version (tantivy locks its private view of links instead).
    written = sorted(p.name for p in (tmp_path / LEXICAL_DIR).iterdir())
    assert not any(name.endswith(".lock") for name in written)
    view = channels._lexical._view  # the private view is what this checks
    assert view.is_dir()
    channels.close()
    assert not view.exists()
    names = file_checksums(tmp_path)
    nested = [n for n in names if n.startswith(f"{LEXICAL_DIR}/")]
    assert nested and not any(Path(n).name.startswith(".") for n in nested)
    target = tmp_path / nested[0]
    target.write_bytes(target.read_bytes() + b"x")
    assert file_checksums(tmp_path)[nested[0]] != names[nested[0]]


def test_gather_features_and_fusion(tmp_path: Path) -> None:
    channels, photo_vecs, _, text_vecs, _ = make_channels(tmp_path)
    query = HybridQuery(text_vecs[4], analyze("fresh milk", "en"), "en")
    cands = gather(channels, query, 10, None)
    assert sorted(cands.rows.tolist()) == [0, 1, 2, 3]
    i = cands.rows.tolist().index(2)
    np.testing.assert_allclose(cands.features[i, 1], 1.0, atol=1e-5)  # its own title's embedding
    assert cands.features[i, 2] == pytest.approx(1.0) and sorted(cands.matched_terms(i)) == ["fresh", "milk"]
    np.testing.assert_allclose(cands.features[i, 0], (photo_vecs[4:6] @ text_vecs[4]).max(), atol=1e-5)
    # RRF by hand: 1 / (60 + rank + 1) summed over the lists a product is in.
    expected = [sum(1 / (61 + r) for r in row if r >= 0) for row in cands.ranks.tolist()]
    np.testing.assert_allclose(rrf(cands, "hybrid"), expected, atol=1e-6)
    params = GroupParams(weights=[0.0, 0.0, 1.0, 0.0], bias=0.0)
    np.testing.assert_allclose(fuse("weighted", cands, params, "hybrid"), cands.features[:, 2], atol=1e-6)
    logistic = fuse("logistic", cands, GroupParams(weights=[1.0, 0, 0, 0], bias=-0.5), "hybrid")
    np.testing.assert_allclose(logistic, 1 / (1 + np.exp(-(cands.features[:, 0] - 0.5))), atol=1e-6)
    model = FusionModel("weighted", {"other": params}, {"other": GroupParams(weights=[0, 1.0, 0])}, ["en"])
    assert FusionModel.from_dict(model.to_dict()).to_dict() == model.to_dict()
    assert model.group_of(["de"]) == "other" and model.group_of(["de", "en"]) == "en"
    assert (*LEGACY_FEATURES, "centroid", "coverage") == FEATURES
    channels.close()


def test_coverage_feature_is_the_best_covered_value_of_a_product(tmp_path: Path) -> None:
    """The ``coverage`` feature against a plain reference: over every text value of a product (those a
    mask leaves in), the largest IDF-weighted share of the query's terms one value holds; ``lexical`` is
    that share at the product's best BM25 value only. Product 0's English title holds "oat" alone, its
    Swedish one "havredryck" alone: neither covers "oat havredryck", each half of it."""
    channels, _, _, text_vecs, _ = make_channels(tmp_path)
    terms = [*analyze("oat", "en"), *analyze("havredryck", "sv"), *analyze("juice", "en")]
    idf = channels.term_idf(terms)
    text_terms = [set(analyze(t, lang)) for _, _, lang, t in TEXTS]
    owners = np.asarray([t[0] for t in TEXTS])
    mask = np.ones(len(TEXTS), bool)
    mask[1] = False  # the Swedish title hidden (calibration's lexical mask)

    def reference(product: int, keep: np.ndarray) -> float:
        shares = [
            sum(idf[t] for t in terms if t in text_terms[r]) / sum(idf.values())
            for r in np.flatnonzero((owners == product) & keep)
        ]
        return max(shares, default=0.0)

    for keep, lexical_mask in ((np.ones(len(TEXTS), bool), None), (mask, mask)):
        cands = gather(channels, HybridQuery(text_vecs[0], terms, "en"), 10, None, lexical_mask=lexical_mask)
        expected = [reference(int(p), keep) for p in cands.rows]
        np.testing.assert_allclose(cands.features[:, 5], expected, atol=1e-6)
        found = cands.lexical >= 0
        rows = np.arange(len(TEXTS))
        at_best = [reference(int(p), rows == r) for p, r in zip(cands.rows, cands.lexical, strict=True)]
        np.testing.assert_allclose(cands.features[found, 2], np.asarray(at_best)[found], atol=1e-6)
    i = cands.rows.tolist().index(1)
    assert cands.features[i, 5] == pytest.approx(idf["juic"] / sum(idf.values()))
    assert 0 < cands.features[cands.rows.tolist().index(0), 5] < 1
    channels.close()


def test_centroid_feature_is_the_cosine_to_the_normalised_mean_of_a_products_texts(tmp_path: Path) -> None:
    """The ``centroid`` feature against a plain reference: the query against the normalised sum of the
    product's text embeddings, over every text row (stored norms) and over the rows a mask leaves in
    (calibration: computed from the rows); a product without text reads as the floor."""
    channels, _, _, text_vecs, _ = make_channels(tmp_path, photos_per=(3, 1, 2, 1, 1))  # product 4: no text
    text_owners = np.asarray([t[0] for t in TEXTS])
    q = unit(np.random.default_rng(5), 1)[0]
    mask = np.ones(len(TEXTS), bool)
    mask[[1, 3]] = False  # product 0 keeps its English title, product 2 its English one

    def reference(product: int, keep: np.ndarray) -> float:
        rows = np.flatnonzero((text_owners == product) & keep)
        if not rows.size:
            return -1.0
        total = text_vecs[rows].sum(axis=0)
        return float(total @ q / np.linalg.norm(total))

    for keep, text_mask in ((np.ones(len(TEXTS), bool), None), (mask, mask)):
        cands = gather(channels, HybridQuery(q, []), 10, None, text_mask=text_mask)
        expected = [reference(int(p), keep) for p in cands.rows]
        assert 4 in cands.rows.tolist() and -1.0 in expected
        np.testing.assert_allclose(cands.features[:, 4], expected, atol=1e-5)
    # One text value: its centroid is itself.
    single = cands.rows.tolist().index(1)
    assert cands.features[single, 4] == pytest.approx(cands.features[single, 1], abs=1e-6)
    channels.close()


GROUP = {"weights": [0.1, 0.2, 0.3, 0.4]}
TEXT_GROUP = {"weights": [0.2, 0.3, 0.4]}
# Stored fusions a search would fail on (damaged or hand-edited products.json), and what the refusal names.
MALFORMED_FUSIONS = [
    (["weighted"], "a list, not an object"),
    ({"hybrid": {"other": GROUP}, "text": {"other": TEXT_GROUP}}, "'method'"),
    ({"method": "weighted", "hybrid": [GROUP], "text": {"other": TEXT_GROUP}}, "unreadable fusion"),
    ({"method": "weighted", "hybrid": {"other": [0.1]}, "text": {"other": TEXT_GROUP}}, "unreadable fusion"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "scale": 2}}, "text": {}}, "unexpected keyword"),
    ({"method": "weighted", "hybrid": {"other": GROUP}, "text": {}}, "text has no 'other' group"),
    ({"method": "weighted", "hybrid": {"en": GROUP}, "text": {"other": TEXT_GROUP}}, "hybrid has no"),
    ({"method": "weighted", "languages": [["en"]], "hybrid": {"other": GROUP}}, "are not all names"),
    ({"method": "weighted", "hybrid": {"other": {"weights": [0.1] * 3}}}, "3 weights for 4 features"),
    ({"method": "weighted", "hybrid": {"other": {"weights": ["1", 0, 0, 0]}}}, "weights ['1', 0, 0, 0] is"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "weights": 0.5}}}, "weights 0.5 is not a list"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "bias": "0"}}}, "bias '0' is not a number"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "features": 5}}}, "features 5 is not a list"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "none_below": "low"}}}, "none_below 'low'"),
    ({"method": "weighted", "hybrid": {"other": {**GROUP, "match_over": ["any"]}}}, "match_over ['any']"),
]


@pytest.mark.parametrize(("stored", "problem"), MALFORMED_FUSIONS)
def test_a_stored_fusion_a_search_would_fail_on_is_refused_as_a_format_error(
    stored: object, problem: str
) -> None:
    """Every malformation a search would trip over (a TypeError or KeyError fusing, an AttributeError
    parsing) is refused when the model is parsed, as a format error naming it: the service then fuses
    that version by reciprocal rank (``service.search.hybrid.HybridRanker.fusion``), and ``ccrk index
    verify`` names it."""
    with pytest.raises(IndexFormatError, match=re.escape(problem)):
        FusionModel.from_dict(stored)  # type: ignore[arg-type]


def test_a_malformed_stored_fusion_still_opens(tmp_path: Path) -> None:
    """A fusion of another shape does not stop the version's channels from opening (the check for a centroid
    feature without its norms file read it as a dict of dicts: an AttributeError out of the open, which the
    index holder does not refuse as a broken version: a 500 at the admin reload, a failed start)."""
    make_channels(tmp_path)[0].close()
    (tmp_path / TEXT_SUM_NORMS).unlink()  # written before the centroid feature: the fusion is read for it
    for stored, _ in MALFORMED_FUSIONS:
        info = json.loads((tmp_path / "products.json").read_text(encoding="utf-8"))
        (tmp_path / "products.json").write_text(json.dumps({**info, "fusion": stored}), encoding="utf-8")
        channels = ProductChannels(tmp_path, 4)
        assert channels.info.fusion == stored
        channels.close()


def test_a_fusion_fitted_before_the_centroid_feature_reads_the_four_legacy_columns(tmp_path: Path) -> None:
    """Parameters stored without feature names (versions written before the centroid feature) weigh the
    four features they were fitted on, whatever comes after them."""
    channels, _, _, text_vecs, _ = make_channels(tmp_path)
    cands = gather(channels, HybridQuery(text_vecs[4], analyze("fresh milk", "en"), "en"), 10, None)
    stored = {
        "method": "weighted",
        "hybrid": {"other": {"weights": [0.1, 0.2, 0.3, 0.4]}},
        "text": {"other": {"weights": [0.2, 0.3, 0.4]}},
    }
    legacy = FusionModel.from_dict(stored).hybrid["other"]
    x = cands.features[:, :4].astype(np.float64)
    np.testing.assert_allclose(fuse("weighted", cands, legacy, "hybrid"), x @ [0.1, 0.2, 0.3, 0.4], atol=1e-6)
    named = GroupParams(weights=[0.0, 0.0, 0.0, 1.0], features=["text", "lexical", "bm25", "centroid"])
    np.testing.assert_allclose(fuse("weighted", cands, named, "text"), cands.features[:, 4], atol=1e-6)
    channels.close()


def test_lexical_coverage_of_several_readings_equals_a_plain_sum(tmp_path: Path) -> None:
    """The ``lexical`` feature: per candidate, the best reading's IDF-weighted share of its terms that the
    candidate's BM25 field holds (a term repeated in a reading counts twice), against a plain loop."""
    channels = make_channels(tmp_path)[0]
    readings = [["fresh", "milk"], ["organic", "oat", "oat"], ["havredryck", "nothing"]]
    terms = list(dict.fromkeys(t for r in readings for t in r))
    cands = gather(
        channels, HybridQuery(unit(np.random.default_rng(9), 1)[0], terms, readings=readings), 10, None
    )
    idf = channels.term_idf(terms)
    found = np.flatnonzero(cands.lexical >= 0)
    assert found.size >= 3  # fresh milk, oat drink, havredryck
    stored = channels.terms_of(cands.lexical[found].tolist())
    for i in found.tolist():
        held = set(stored[int(cands.lexical[i])])
        expected = max(sum(idf[t] for t in r if t in held) / sum(idf[t] for t in r) for r in readings)
        assert cands.features[i, 2] == pytest.approx(expected, abs=1e-6)
        assert cands.matched_terms(i) == [t for t in terms if t in held]
    channels.close()


def test_lexical_channel_equals_the_best_value_per_product_of_the_whole_bm25_list(tmp_path: Path) -> None:
    """The BM25 channel asks for few rows first and widens: its best products equal those of the complete
    BM25 list, with a filter that leaves few products and with products holding many matching values."""
    rng = np.random.default_rng(5)
    words = ["milk", "oat", "juice", "bread", "cheese", "apple"]
    counts = rng.integers(1, 7, 40)
    owners = np.repeat(np.arange(40), counts).astype(np.int64)
    values = [" ".join(rng.choice(words, size=int(rng.integers(1, 5)))) for _ in owners]
    photos = PhotoRows(np.arange(40, dtype=np.int64), [f"p{i}" for i in range(40)], unit(rng, 40))
    texts = TextRows(
        owners,
        ["title"] * owners.size,
        ["en"] * owners.size,
        values,
        [analyze(v, "en") for v in values],
        unit(rng, owners.size),
    )
    info = ProductInfo(fields=["title"], text_languages=["en"], language_counts={}, photos=0, texts=0)
    write_product_channels(tmp_path, info, photos, texts)
    channels = ProductChannels(tmp_path, 40)
    for terms in (["milk"], analyze("oat juice", "en"), analyze("apple cheese bread", "en")):
        rows, scores = channels._lexical.search(terms, 10_000)  # every matching value
        for allowed in (None, np.arange(40) % 7 == 0):
            keep = np.ones(rows.size, bool) if allowed is None else allowed[owners[rows]]
            best: dict[int, float] = {}
            for r, s in zip(rows[keep].tolist(), scores[keep].tolist(), strict=True):
                best.setdefault(int(owners[r]), s)  # best first: each product's first is its best
            for n in (1, 3, 8):
                hits = channels.lexical(terms, n, allowed)
                expected = sorted(best, key=lambda o: (-best[o], o))[:n]
                assert hits.owners.tolist() == expected
    channels.close()


def test_asking_a_channel_for_no_product_is_empty(tmp_path: Path) -> None:
    channels, _, _, text_vecs, _ = make_channels(tmp_path)
    assert channels.lexical(["milk"], 0, None).owners.size == 0  # tantivy refuses a limit of 0
    assert channels.photos.search(text_vecs[0], 0, None).owners.size == 0
    channels.close()


def test_a_fusion_reading_the_centroid_without_its_norms_is_refused(tmp_path: Path) -> None:
    """A version whose fusion names the centroid feature but lacks ``text_sum_norms.npy`` does not open
    (it would rank with every centroid at the floor); without such a fusion it opens as an old version."""
    make_channels(tmp_path)[0].close()
    (tmp_path / "text_sum_norms.npy").unlink()
    ProductChannels(tmp_path, 4).close()  # no fusion: as a version written before the file
    info = ProductInfo.load(tmp_path / "products.json")
    info.fusion = {
        "method": "weighted",
        "hybrid": {"other": {"weights": [0, 0, 0, 0, 1.0], "features": FEATURES}},
    }
    (tmp_path / "products.json").write_text(info.to_json())
    with pytest.raises(IndexFormatError, match=r"text_sum_norms\.npy is missing"):
        ProductChannels(tmp_path, 4)
