"""Upserted products in the channels (``store.live.delta``, ``store.live.channels``), against the exact
reference: a version written with the same products in its own rows. Vector channels, features and
presence must agree exactly; BM25 of the new values must rank as the version's tantivy ranks them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from store.live.channels import LiveChannels
from store.live.delta import ROW_BLOCK, DeltaRows, EmbeddedProduct, TextValue
from store.products.channels import PhotoRows, ProductChannels, ProductInfo, TextRows, write_product_channels
from store.text.lexical import analyze

WORDS = [
    "red",
    "blue",
    "green",
    "mug",
    "chair",
    "lamp",
    "striped",
    "dotted",
    "wooden",
    "glass",
    "tall",
    "small",
]
PRODUCTS, KEPT, DIM = 60, 45, 16


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def catalogue(seed: int = 0) -> list[EmbeddedProduct]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(PRODUCTS):
        photos = unit(rng.normal(size=(int(rng.integers(0, 4)), DIM)))
        values = [
            " ".join(rng.choice(WORDS, size=int(rng.integers(1, 6))).tolist())
            for _ in range(int(rng.integers(0 if len(photos) else 1, 3)))
        ]
        texts = [TextValue("title", "en", v, tuple(analyze(v, "en"))) for v in values]
        embeds = unit(rng.normal(size=(len(texts), DIM))) if texts else np.zeros((0, DIM), np.float32)
        paths = [f"p{len(out)}-{i}.jpg" for i in range(len(photos))]
        out.append(EmbeddedProduct(photos, None, None, paths, texts, embeds))
    return out


def channels_of(root: Path, products: list[EmbeddedProduct]) -> ProductChannels:
    def owners(counts: list[int]) -> np.ndarray:
        return np.repeat(np.arange(len(counts)), counts).astype(np.int64)

    photos = PhotoRows(
        owners([len(p.photo_paths) for p in products]),
        [path for p in products for path in p.photo_paths],
        np.concatenate([p.photo_embeds.reshape(-1, DIM) for p in products]),
    )
    values = [v for p in products for v in p.texts]
    texts = TextRows(
        owners([len(p.texts) for p in products]),
        [v.field for v in values],
        [v.lang for v in values],
        [v.text for v in values],
        [list(v.terms) for v in values],
        np.concatenate([p.text_embeds.reshape(-1, DIM) for p in products]),
    )
    info = ProductInfo(
        fields=["title"], text_languages=["en"], language_counts={"en": len(values)}, photos=0, texts=0
    )
    root.mkdir(parents=True)
    write_product_channels(root, info, photos, texts)
    return ProductChannels(root, len(products))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProductChannels, LiveChannels]:
    tmp = tmp_path_factory.mktemp("channels")
    products = catalogue()
    whole = channels_of(tmp / "whole", products)
    part = channels_of(tmp / "part", products[:KEPT])
    rows = DeltaRows(KEPT, DIM, None, None)
    for n, product in enumerate(products[KEPT:]):
        assert rows.add(f"p{KEPT + n}", product) == KEPT + n
    delta = rows.delta()
    assert delta.capacity == ROW_BLOCK
    return whole, LiveChannels(part, delta, KEPT + delta.capacity)


def padded(mask: np.ndarray, live: LiveChannels) -> np.ndarray:
    """A mask over the whole version's rows as the live row space holds it (the block's unwritten rows
    not allowed)."""
    return np.concatenate([mask, np.zeros(live.photos.products - mask.size, bool)])


def same_hits(a: object, b: object) -> None:
    assert a.owners.tolist() == b.owners.tolist()  # type: ignore[attr-defined]
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-6)  # type: ignore[attr-defined]
    assert a.via.tolist() == b.via.tolist()  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(6))
def test_vector_channels_and_features_equal_the_version_holding_the_products(
    pair: tuple[ProductChannels, LiveChannels], seed: int
) -> None:
    whole, live = pair
    rng = np.random.default_rng(100 + seed)
    q = unit(rng.normal(size=DIM))
    allowed = None if seed % 2 == 0 else rng.random(PRODUCTS) < 0.6
    live_allowed = None if allowed is None else padded(allowed, live)
    for n in (1, 5, 50):
        same_hits(live.photos.search(q, n, live_allowed), whole.photos.search(q, n, allowed))
        same_hits(live.texts.search(q, n, live_allowed), whole.texts.search(q, n, allowed))
    rows = np.arange(PRODUCTS)
    got = live.texts.best_and_centroid_of(q, rows, None, live.text_sum_norms)
    want = whole.texts.best_and_centroid_of(q, rows, None, whole.text_sum_norms)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    got_p, want_p = live.photos.best_of(q, rows), whole.photos.best_of(q, rows)
    np.testing.assert_array_equal(got_p[1], want_p[1])
    np.testing.assert_allclose(got_p[0], want_p[0], rtol=1e-5)
    np.testing.assert_array_equal(live.texts.start[: PRODUCTS + 1], whole.texts.start)
    terms = ["red", "mug", "tall"]
    text_rows = np.arange(len(whole.texts))
    np.testing.assert_array_equal(live.presence(text_rows, terms), whole.presence(text_rows, terms))
    assert live.texts_of(text_rows.tolist()) == whole.texts_of(text_rows.tolist())
    assert live.photo_paths(rows.tolist()) == whole.photo_paths(rows.tolist())
    assert [live.photo_index_of(r) for r in range(len(whole.photos))] == [
        whole.photo_index_of(r) for r in range(len(whole.photos))
    ]
    assert live.info.photos == whole.info.photos and live.info.texts == whole.info.texts


def bm25(channels: ProductChannels, values: list[tuple[str, ...]], terms: list[str]) -> np.ndarray:
    """BM25 by hand (k1 1.2, b 0.75) of ``values`` over ``channels``' statistics: each distinct term once."""
    n, mean = channels.info.texts, channels.mean_terms()
    docs = channels.doc_freqs(list(dict.fromkeys(terms)))
    out = np.zeros(len(values))
    for i, value in enumerate(values):
        for t in dict.fromkeys(terms):
            tf = value.count(t)
            idf = np.log(1 + (n - docs[t] + 0.5) / (docs[t] + 0.5))
            out[i] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(value) / mean)) if tf else 0.0
    return out


@pytest.mark.parametrize("terms", [["red"], ["red", "mug"], ["striped", "glass", "lamp"], ["tall", "wooden"]])
def test_bm25_of_the_new_values_is_the_versions_own_formula_and_statistics(
    pair: tuple[ProductChannels, LiveChannels], terms: list[str]
) -> None:
    whole, live = pair
    part = live.base
    got, want = live.lexical(terms, 200, None), whole.lexical(terms, 200, None)
    assert sorted(got.owners.tolist()) == sorted(want.owners.tolist())  # the same products match
    # The version's own values: tantivy's scores, as without the delta.
    own = part.lexical(terms, 200, None)
    old = got.owners < KEPT
    assert dict(zip(got.owners[old].tolist(), got.scores[old].tolist(), strict=True)) == dict(
        zip(own.owners.tolist(), own.scores.tolist(), strict=True)
    )
    # The formula by hand reproduces tantivy's scores of the version's values (its field norms are exact
    # at these lengths), and gives the new values' scores.
    base_values = [tuple(part.terms_of([int(r)])[int(r)]) for r in own.via.tolist()]
    np.testing.assert_allclose(bm25(part, base_values, terms), own.scores, rtol=2e-3)
    new = ~old
    new_values = [tuple(live.terms_of([int(r)])[int(r)]) for r in got.via[new].tolist()]
    np.testing.assert_allclose(got.scores[new], bm25(part, new_values, terms), rtol=1e-4)
    assert got.scores.tolist() == sorted(got.scores.tolist(), reverse=True)
    allowed = np.zeros(PRODUCTS, bool)
    allowed[KEPT:] = True
    only_new = live.lexical(terms, 200, padded(allowed, live))
    assert set(only_new.owners.tolist()) == {o for o in want.owners.tolist() if o >= KEPT}
