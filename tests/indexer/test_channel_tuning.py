"""indexer.channel_tuning: the product channels' graph walks tuned for a target recall against exact
search, and the tuned width read back when the version is opened."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from indexer.channel_tuning import channel_recall, tune_channels
from store.products.channels import (
    HNSW_EF_SEARCH,
    PHOTO_INDEX,
    PRODUCTS_FILE,
    TEXT_INDEX,
    PhotoRows,
    ProductChannels,
    ProductInfo,
    TextRows,
    write_product_channels,
)

PRODUCTS, DIM = 1500, 24


def _clustered(rng: np.random.Generator, centres: np.ndarray, n: int, spread: float) -> np.ndarray:
    x = centres + rng.normal(0, spread, (n, centres.shape[1])).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _channels(root: Path) -> ProductChannels:
    rng = np.random.default_rng(0)
    product_vecs = _clustered(rng, rng.normal(size=(PRODUCTS, DIM)).astype(np.float32), PRODUCTS, 0.3)
    owners = np.repeat(np.arange(PRODUCTS), 2).astype(np.int64)
    photos = PhotoRows(
        owners, [f"p{i}" for i in range(owners.size)], _clustered(rng, product_vecs[owners], owners.size, 0.1)
    )
    texts = TextRows(
        owners=np.arange(PRODUCTS, dtype=np.int64),
        fields=["title"] * PRODUCTS,
        langs=["en"] * PRODUCTS,
        texts=[f"product {i}" for i in range(PRODUCTS)],
        terms=[["product", str(i)] for i in range(PRODUCTS)],
        embeds=_clustered(rng, product_vecs, PRODUCTS, 0.1),
    )
    info = ProductInfo(
        fields=["title"], text_languages=["en"], language_counts={"en": PRODUCTS}, photos=0, texts=0
    )
    write_product_channels(root, info, photos, texts, exact_max=0)  # graphs over both sets
    return ProductChannels(root, PRODUCTS)


def test_the_cheapest_width_reaching_the_target_is_chosen_and_read_back(tmp_path: Path) -> None:
    channels = _channels(tmp_path)
    assert channels.photos.walks_a_graph and channels.texts.walks_a_graph
    easy = tune_channels(channels, target=0.0)  # any width reaches it: the first of the grid
    assert {v["efSearch"] for v in easy.values()} == {16}
    tuned = tune_channels(channels, target=0.99)
    queries = np.asarray(channels.texts.vectors[:50], np.float32)
    for name, grouped in ((PHOTO_INDEX, channels.photos), (TEXT_INDEX, channels.texts)):
        ef = tuned[name]["efSearch"]
        assert grouped.index.hnsw.efSearch == ef
        assert tuned[name]["recall"] >= 0.99 or ef == 1024
        assert channel_recall(grouped, queries) >= 0.95  # the measure holds on other queries too
    channels.close()
    # Stored in products.json, the widths are what a later open walks with.
    info = json.loads((tmp_path / PRODUCTS_FILE).read_text())
    info["search_params"] = tuned
    (tmp_path / PRODUCTS_FILE).write_text(json.dumps(info))
    reopened = ProductChannels(tmp_path, PRODUCTS)
    assert reopened.photos.index.hnsw.efSearch == tuned[PHOTO_INDEX]["efSearch"]
    assert reopened.texts.index.hnsw.efSearch == tuned[TEXT_INDEX]["efSearch"]
    reopened.close()


def test_a_version_without_tuned_widths_walks_at_the_default(tmp_path: Path) -> None:
    channels = _channels(tmp_path)
    assert channels.photos.index.hnsw.efSearch == HNSW_EF_SEARCH
    # Exact search's own recall is 1 by definition: the reference the walks are measured against.
    assert channel_recall(channels.photos, np.asarray(channels.photos.vectors[:20], np.float32)) > 0.5
    channels.close()
