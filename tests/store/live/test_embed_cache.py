"""``store.live.embed_cache``: photo embeddings kept per model and digest, read back exactly; another model
reads none of them; a damaged row is a miss; the oldest rows go beyond the bound; a file that cannot be
opened turns the cache off without an error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from store.live.embed_cache import PhotoEmbedding, PhotoEmbeddingCache


def _item(seed: int, visual: bool = True, tokens: bool = True) -> PhotoEmbedding:
    rng = np.random.default_rng(seed)
    return PhotoEmbedding(
        rng.standard_normal(8).astype(np.float32),
        rng.standard_normal(4).astype(np.float32) if visual else None,
        rng.standard_normal((3, 5)).astype(np.float32) if tokens else None,
    )


def _same(a: PhotoEmbedding, b: PhotoEmbedding) -> None:
    np.testing.assert_array_equal(a.embeds, b.embeds)
    for x, y in ((a.visual, b.visual), (a.tokens, b.tokens)):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype


def test_rows_read_back_exactly_and_only_for_their_model(tmp_path: Path) -> None:
    cache = PhotoEmbeddingCache(tmp_path / "c.sqlite")
    items = {"aa": _item(0), "bb": _item(1, visual=False, tokens=False)}
    cache.put("model-1", items)
    got = cache.get("model-1", ["bb", "aa", "cc", "aa"])
    assert set(got) == {"aa", "bb"}
    for digest, item in items.items():
        _same(got[digest], item)
    assert cache.get("model-2", ["aa", "bb"]) == {}
    # A second process's view of the same file (another connection).
    _same(PhotoEmbeddingCache(tmp_path / "c.sqlite").get("model-1", ["aa"])["aa"], items["aa"])
    cache.close()


def test_a_damaged_row_is_a_miss(tmp_path: Path) -> None:
    cache = PhotoEmbeddingCache(tmp_path / "c.sqlite")
    cache.put("m", {"aa": _item(0), "bb": _item(1)})
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        conn.execute("UPDATE photos SET embeds = ? WHERE digest = 'aa'", (b"\x93NUMPY broken",))
    assert set(cache.get("m", ["aa", "bb"])) == {"bb"}


def test_the_oldest_rows_go_beyond_the_bound(tmp_path: Path) -> None:
    cache = PhotoEmbeddingCache(tmp_path / "c.sqlite", max_rows=20)
    for i in range(60):
        cache.put("m", {f"d{i:03d}": _item(i)})
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        (count,) = conn.execute("SELECT count(*) FROM photos").fetchone()
    assert count <= 20 + 1  # counted every max_rows // 20 puts
    assert set(cache.get("m", ["d059", "d058"])) == {"d059", "d058"}
    assert cache.get("m", ["d000"]) == {}


def test_a_file_it_cannot_open_turns_it_off_without_an_error(tmp_path: Path) -> None:
    taken = tmp_path / "c.sqlite"
    taken.mkdir()  # as a read-only volume would (the tests run as root, which writes into any folder)
    cache = PhotoEmbeddingCache(taken)
    assert cache.get("m", ["aa"]) == {}
    cache.put("m", {"aa": _item(0)})
    assert cache.off is not None and "c.sqlite" in cache.off
    assert cache.get("m", ["aa"]) == {}
