"""Verification of an installed version: checksums, counts and shapes."""

from __future__ import annotations

from pathlib import Path

from store.layout import EMBEDDINGS_FILE
from store.verify import verify_version
from tests.store.writing import write_version


def test_verify_finds_corruption(tmp_path: Path) -> None:
    version = write_version(tmp_path, "shop", n=30)
    assert verify_version(tmp_path, "shop") == []
    emb_path = tmp_path / "shop" / version / EMBEDDINGS_FILE
    data = bytearray(emb_path.read_bytes())
    data[-1] ^= 0xFF
    emb_path.write_bytes(bytes(data))
    assert verify_version(tmp_path, "shop") == ["embeddings.npy: checksum mismatch"]
