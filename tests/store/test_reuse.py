"""``store.version.reuse``: the digests a version keeps so that a rebuild can reuse its rows, read back
through
``StoredVectors``: the row of an image by content, the stored bytes, the checksum check that catches a
changed row, and versions that hold nothing reusable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import faiss
import numpy as np

from store.layout import (
    EMBEDDINGS_FILE,
    FORMAT_VERSION,
    IMAGE_DIGESTS_FILE,
    MANIFEST_FILE,
    RERANK_FILE,
    index_dir,
)
from store.verify import verify_version
from store.version.manifest import IndexManifest
from store.version.reuse import REUSE_KEY, StoredVectors, image_digest, row_digests, write_reuse_digests
from store.version.writer import VersionWriter
from tests.store.writing import D, T, W, vectors


def _write(root: Path, images: list[Path], *, int8: bool = False, key: str = "k1") -> Path:
    n = len(images)
    embeds = vectors(n, 0)
    tokens = np.random.default_rng(1).normal(size=(n, T, W)).astype(np.float32)
    scales = None
    if int8:
        scales = (np.abs(tokens).max(axis=2) / 127.0).astype(np.float32)
        stored_tokens = np.round(tokens / scales[..., None]).astype(np.int8)
    else:
        stored_tokens = tokens.astype(np.float16)
    digests = np.stack([np.frombuffer(image_digest(p) or b"", np.uint8) for p in images])
    with VersionWriter(root, "shop") as writer:
        writer.save_arrays(embeds, stored_tokens, scales)
        write_reuse_digests(writer.stage, digests, row_digests(embeds, stored_tokens, scales))
        writer.write_metadata((i, f"id{i}", str(p), {}, False) for i, p in enumerate(images))
        index = faiss.IndexFlatIP(D)
        index.add(embeds)
        writer.write_index(index)
        manifest = IndexManifest(
            format_version=FORMAT_VERSION, name="shop", version=writer.version, created_at="",
            model_name="test-model", model_fingerprint="f" * 64, embed_dim=D, preprocessing={}, count=n,
            index_factory="Flat", search_params={}, measured_recall_at_10=None, language_recall_at_10={},
            build_seconds=0.0, skipped=[], checksums={}, parent_version=None, total_rows=n,
            rerank={"dtype": "int8" if int8 else "fp16", "tokens": T, "width": W, "bytes_per_image": 0},
            build_params={REUSE_KEY: key},
        )  # fmt: skip
        writer.finish(manifest)
    return index_dir(root, "shop") / writer.version


def _images(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"{i}.bin"
        path.write_bytes(f"image {i}".encode() * 100)
        paths.append(path)
    return paths


def test_rows_by_content_their_bytes_and_the_checksum_check(tmp_path: Path) -> None:
    for int8 in (False, True):
        root = tmp_path / f"int8-{int8}"
        images = _images(tmp_path / "img", 12)
        path = _write(root, images, int8=int8)
        manifest = IndexManifest.load(path / MANIFEST_FILE)
        assert verify_version(root, "shop") == []  # the digest files are checksummed like the rest
        stored = StoredVectors.open(path, manifest, "k1")
        assert stored is not None and stored.rows == 12
        moved = tmp_path / "elsewhere.bin"
        moved.write_bytes(images[7].read_bytes())  # same bytes under another name: the same row
        assert stored.row_of_image(image_digest(moved) or b"") == 7
        assert stored.row_of_image(b"\0" * 16) == -1
        embeds, tokens, scales = stored.read(np.array([3, 7]))
        np.testing.assert_array_equal(embeds, np.load(path / EMBEDDINGS_FILE)[[3, 7]])
        assert tokens is not None and tokens.dtype == (np.int8 if int8 else np.float16)
        assert (scales is not None) == int8
        assert stored.check(np.arange(12)).all()
        stored.close()
        # One token of row 5 changed on disk: that row, and only that one, fails its check.
        tok = np.load(path / RERANK_FILE)
        offset = (path / RERANK_FILE).stat().st_size - tok.nbytes + 5 * tok[0].nbytes
        with open(path / RERANK_FILE, "r+b") as fh:
            fh.seek(offset)
            fh.write(b"\x11\x22")
        again = StoredVectors.open(path, manifest, "k1")
        assert again is not None
        assert np.flatnonzero(~again.check(np.arange(12))).tolist() == [5]


def test_versions_without_digests_or_with_another_key_hold_nothing_reusable(tmp_path: Path) -> None:
    images = _images(tmp_path / "img", 4)
    path = _write(tmp_path / "idx", images, key="model-a")
    manifest = IndexManifest.load(path / MANIFEST_FILE)
    assert StoredVectors.open(path, manifest, "model-b") is None  # another model or storage options
    assert StoredVectors.open(path, dataclasses.replace(manifest, build_params={}), "model-a") is None
    (path / IMAGE_DIGESTS_FILE).unlink()  # e.g. a version written before the digests existed
    assert StoredVectors.open(path, manifest, "model-a") is None


def test_row_digests_cover_every_stored_byte_of_a_row() -> None:
    embeds = vectors(3, 0)
    tokens = np.ones((3, T, W), np.float16)
    base = row_digests(embeds, tokens, None)
    assert len({bytes(r) for r in base}) == 3
    changed = tokens.copy()
    changed[1, T - 1, W - 1] = 2  # the last byte of row 1
    after = row_digests(embeds, changed, None)
    assert [bool((a == b).all()) for a, b in zip(base, after, strict=True)] == [True, False, True]
    scales = np.ones((3, T), np.float32)
    assert not (row_digests(embeds, tokens, scales) == base).all()
