"""``service.live.embedder``: an upsert's photos are encoded once per machine. A second embedder over the
same index (another process's stand-in, or this one after a restart) reads them from the photo embedding
cache (``store.live.embed_cache``), encodes none, and makes exactly the arrays the first made; a photo the
cache lacks is encoded beside the cached ones; another model key reads nothing. The shipped demo model."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from model.runtime import Encoder
from service.live.embedder import CatalogueEmbedder
from store.live.embed_cache import PhotoEmbeddingCache
from store.live.photos import PhotoStore
from store.live.records import Upsert


class Counting:
    """The encoder, counting the images it encodes."""

    def __init__(self, encoder: Encoder) -> None:
        self.inner = encoder
        self.images = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode_images(self, images: Any) -> Any:
        self.images += len(images)
        return self.inner.encode_images(images)


def _photo(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), colour).save(out, format="PNG")
    return out.getvalue()


def _embedder(encoder: Counting, root: Path, key: str = "demo/onnx/float") -> CatalogueEmbedder:
    cache = PhotoEmbeddingCache.for_index(root, "shop")
    return CatalogueEmbedder(encoder, PhotoStore(root, "shop"), max_pixels=10**7, cache=cache, model_key=key)  # type: ignore[arg-type]


def test_a_photo_is_encoded_once_and_read_back_exactly(tmp_path: Path, encoder: Encoder) -> None:
    (tmp_path / "shop").mkdir()
    store = PhotoStore(tmp_path, "shop")
    red, blue = store.put(_photo((200, 20, 20)), "PNG"), store.put(_photo((20, 20, 200)), "PNG")
    upsert = Upsert("new-1", {"title": "a red cup"}, {"title": "a red cup"}, (red, blue))
    first_encoder = Counting(encoder)
    first = _embedder(first_encoder, tmp_path).embed(upsert)
    assert first_encoder.images == 2 and first.photo_embeds.shape[0] == 2

    again_encoder = Counting(encoder)
    again = _embedder(again_encoder, tmp_path).embed(upsert)
    assert again_encoder.images == 0
    np.testing.assert_array_equal(again.photo_embeds, first.photo_embeds)
    for a, b in ((again.photo_visual, first.photo_visual), (again.tokens, first.tokens)):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again.text_embeds, first.text_embeds)
    assert again.photo_paths == first.photo_paths

    # One new photo: only it is encoded, in its place among the cached ones.
    green = store.put(_photo((20, 200, 20)), "PNG")
    mixed_encoder = Counting(encoder)
    mixed = _embedder(mixed_encoder, tmp_path).embed(Upsert("new-2", {}, {}, (blue, green, red)))
    assert mixed_encoder.images == 1
    np.testing.assert_array_equal(mixed.photo_embeds[[0, 2]], first.photo_embeds[[1, 0]])

    other_encoder = Counting(encoder)
    _embedder(other_encoder, tmp_path, key="another-model/onnx/float").embed(upsert)
    assert other_encoder.images == 2
