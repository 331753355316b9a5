"""Indexing with the starter model (no fusion encoder): the version keeps no re-rank store, verifies, takes
additions, and its embeddings are the encoder's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.build import add, build
from model.preprocessing import ImagePreprocessor
from model.runtime import load_encoder
from store.errors import IndexFormatError
from store.layout import EMBEDDINGS_FILE, RERANK_FILE
from store.verify import verify_version
from store.version.reader import IndexVersion
from tests.indexer.files import write_photo


def test_build_and_add_without_a_rerank_store(
    settings: Settings, photo_folder: Path, starter_model: Path
) -> None:
    settings = settings.model_copy(update={"model_dir": starter_model})
    report = build("starter", [photo_folder], settings=settings)
    assert report.published and report.count == 12
    with IndexVersion.open(settings.index_root, "starter") as idx:
        m = idx.manifest
        assert m.embed_dim == 512 and m.preprocessing["image_size"] == 224
        assert m.rerank["tokens"] == 0 and m.rerank["bytes_per_image"] == 0
        assert set(m.checksums) == {
            "index.faiss", "embeddings.npy", "metadata.sqlite", "image_digests.npy", "row_digests.npy",
            "image_stats.npy",
        }  # fmt: skip
        assert not (idx.path / RERANK_FILE).exists()
        assert verify_version(settings.index_root, "starter", m.version, model_dir=starter_model) == []
        with pytest.raises(IndexFormatError, match="no re-rank store"):
            idx.rerank_tokens(np.array([0]))
        # The stored embeddings are the encoder's for the same files.
        items = idx.items(list(range(len(idx))))
        encoder = load_encoder(starter_model, threads=1)
        pre = ImagePreprocessor(encoder.config.vision)
        direct = encoder.encode_images(np.stack([pre.load_uint8(it["path"]) for it in items])).embeds
        stored = np.load(idx.path / EMBEDDINGS_FILE)
        np.testing.assert_allclose(stored, direct, atol=2e-2)  # JPEG draft decoding in the indexer
        assert float(np.min(np.sum(stored * direct, axis=1))) > 0.99

    more = photo_folder / "more"
    for i in range(3):
        write_photo(more / f"n{i}.jpg", 40 + i)
    added = add("starter", [photo_folder], settings=settings)
    assert added.published and added.count == 15
    with IndexVersion.open(settings.index_root, "starter") as idx:
        assert len(idx) == 15 and not (idx.path / RERANK_FILE).exists()
        assert (
            verify_version(settings.index_root, "starter", idx.manifest.version, model_dir=starter_model)
            == []
        )
    # A full build of the same folder afterwards encodes nothing: rows without re-rank tokens are reused
    # by their embeddings' checksums alone.
    rebuilt = build("starter", [photo_folder], settings=settings)
    assert rebuilt.published and (rebuilt.items_encoded, rebuilt.items_reused) == (0, 15)
