"""The manifest (JSON round trip, format versions) and model compatibility (fingerprints, mismatches naming
both models)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from store.errors import IndexFormatError, ModelMismatchError
from store.layout import FORMAT_VERSION, MANIFEST_FILE, MAX_FORMAT_VERSION
from store.version import versions
from store.version.manifest import IndexManifest, model_fingerprint
from store.version.reader import IndexVersion
from tests.store.writing import write_version


def test_model_mismatch_names_both_models(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", fingerprint="a" * 64)
    with IndexVersion.open(tmp_path, "shop", expect_fingerprint="a" * 64, expect_model_name="other-name"):
        pass  # same weights under another folder name are compatible
    with pytest.raises(ModelMismatchError) as err:
        IndexVersion.open(tmp_path, "shop", expect_fingerprint="b" * 64, expect_model_name="ccrk-big")
    assert (
        "test-model" in str(err.value) and "ccrk-big" in str(err.value) and "bbbbbbbbbbbb" in str(err.value)
    )
    with pytest.raises(ModelMismatchError, match=r"'test-model'.*ccrk-big"):
        IndexVersion.open(tmp_path, "shop", expect_model_name="ccrk-big")


def test_model_fingerprint_tracks_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights-1")
    first = model_fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights-2")
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
    assert model_fingerprint(tmp_path) != first and len(first) == 64


def test_manifest_round_trip_and_future_format(tmp_path: Path) -> None:
    write_version(tmp_path, "shop")
    version = versions.current_version(tmp_path, "shop")
    path = tmp_path / "shop" / version / MANIFEST_FILE
    manifest = IndexManifest.load(path)
    assert IndexManifest.from_json(manifest.to_json()) == manifest
    data = json.loads(path.read_text())
    data["format_version"] = MAX_FORMAT_VERSION + 1
    with pytest.raises(IndexFormatError, match="not supported"):
        IndexManifest.from_json(json.dumps(data))
    del data["embed_dim"]
    data["format_version"] = FORMAT_VERSION
    with pytest.raises(IndexFormatError, match="embed_dim"):
        IndexManifest.from_json(json.dumps(data))


def test_a_current_or_manifest_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    """A binary CURRENT reads as an unreadable file (OSError, EILSEQ), a binary manifest as a format error:
    what their callers handle, where a UnicodeDecodeError (a ValueError) escaped them (the Ray driver's poll
    loop ended and deleted the app)."""
    write_version(tmp_path, "shop")
    version = versions.current_version(tmp_path, "shop")
    manifest = tmp_path / "shop" / version / MANIFEST_FILE
    manifest.write_bytes(b"\xff\xfe{")
    with pytest.raises(IndexFormatError, match="not UTF-8"):
        IndexManifest.load(manifest)
    (tmp_path / "shop" / "CURRENT").write_bytes(b"\xff\xfe2026")
    with pytest.raises(OSError, match="not UTF-8") as caught:
        versions.current_version(tmp_path, "shop")
    assert caught.value.errno == errno.EILSEQ
