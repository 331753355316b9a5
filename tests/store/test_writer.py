"""VersionWriter: the files it writes are those ``np.save`` / sqlite / faiss write; a failure before
publishing leaves nothing staged and CURRENT untouched; a failed publish removes the version it installed;
a refused version is kept unpublished; pruning, hard links and sparse placeholder stores."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import faiss
import numpy as np
import pytest

from store.errors import IndexFormatError, VersionWriteError
from store.layout import (
    BUILDS_DIR,
    EMBEDDINGS_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    METADATA_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    file_checksums,
)
from store.verify import verify_version
from store.version import versions
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.versions import GateRecord, current_version, list_versions, record_gate, refused_by_gate
from store.version.writer import VersionWriter
from tests.store.writing import D, T, W, vectors, write_version


def _staged(root: Path, name: str = "shop") -> list[str]:
    builds = root / name / BUILDS_DIR
    return sorted(p.name for p in builds.iterdir()) if builds.is_dir() else []


def _manifest(root: Path, version: str) -> IndexManifest:
    return IndexManifest.load(root / "shop" / version / MANIFEST_FILE)


@pytest.mark.parametrize("int8", [False, True])
def test_arrays_are_what_np_save_writes(tmp_path: Path, int8: bool) -> None:
    """Plain preallocated writes, byte for byte the files ``np.save`` gives (the format is numpy's)."""
    version = write_version(tmp_path, "shop", n=40, int8=int8, seed=5)
    folder = tmp_path / "shop" / version
    names = [EMBEDDINGS_FILE, RERANK_FILE] + ([RERANK_SCALES_FILE] if int8 else [])
    for fname in names:
        array = np.load(folder / fname)
        np.save(tmp_path / "expected.npy", array)
        assert (folder / fname).read_bytes() == (tmp_path / "expected.npy").read_bytes(), fname
    assert _manifest(tmp_path, version).checksums == file_checksums(folder)
    assert verify_version(tmp_path, "shop") == [] and _staged(tmp_path) == []


def test_a_failure_before_publishing_leaves_nothing_and_current_untouched(tmp_path: Path) -> None:
    first = write_version(tmp_path, "shop", n=20)
    with pytest.raises(RuntimeError, match="boom"), VersionWriter(tmp_path, "shop") as writer:
        writer.save_arrays(vectors(20, 1))
        assert _staged(tmp_path) == [writer.version]
        raise RuntimeError("boom")
    assert _staged(tmp_path) == [] and list_versions(tmp_path, "shop") == [first]
    assert current_version(tmp_path, "shop") == first
    # Leaving without finishing (an early return) removes the staged version too.
    with VersionWriter(tmp_path, "shop") as writer:
        writer.save_arrays(vectors(20, 1))
    assert _staged(tmp_path) == []


def test_a_failed_publish_removes_the_version_it_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_version(tmp_path, "shop", n=20)

    def full(root: Path, name: str, version: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as from a write(): no file name

    monkeypatch.setattr(versions, "publish_version", full)
    with pytest.raises(OSError) as caught:
        write_version(tmp_path, "shop", n=20, seed=1)
    # The disk-full error names the file being written.
    assert caught.value.filename == str(tmp_path / "shop" / "CURRENT")
    assert list_versions(tmp_path, "shop") == [first] and current_version(tmp_path, "shop") == first
    assert [p for p in _staged(tmp_path) if not p.startswith("trash-")] == []


def test_a_refused_version_is_kept_unpublished_and_pruning_is_asked_for(tmp_path: Path) -> None:
    good = write_version(tmp_path, "shop", n=20)
    refused = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    assert current_version(tmp_path, "shop") == good and list_versions(tmp_path, "shop") == [good, refused]
    gate = GateRecord.of(_manifest(tmp_path, refused))
    assert gate == GateRecord(False, ("test verdict",)) and gate.refused
    assert GateRecord.of(_manifest(tmp_path, good)) is None

    # keep=1 on the next writer: the older good version goes, the refused one is counted apart.
    with VersionWriter(tmp_path, "shop") as writer:
        writer.link_from(tmp_path / "shop" / good, [EMBEDDINGS_FILE, RERANK_FILE, INDEX_FILE, METADATA_FILE])
        manifest = dataclasses.replace(_manifest(tmp_path, good), version=writer.version, parent_version=good)
        record_gate(manifest, {"passed": True, "reasons": []})
        done = writer.finish(manifest, keep=1)
    assert done.published and done.pruned == [good] and done.path == tmp_path / "shop" / writer.version
    assert list_versions(tmp_path, "shop") == [refused, writer.version]
    assert not refused_by_gate(manifest) and GateRecord.of(manifest) == GateRecord(True, ())
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert len(idx) == 20 and idx.version == writer.version  # the parent's files outlive its pruning


def test_hard_links_share_the_parents_files(tmp_path: Path) -> None:
    parent = write_version(tmp_path, "shop", n=20)
    with VersionWriter(tmp_path, "shop") as writer:
        writer.link_from(tmp_path / "shop" / parent, [EMBEDDINGS_FILE])
        linked = writer.stage / EMBEDDINGS_FILE
        assert linked.stat().st_ino == (tmp_path / "shop" / parent / EMBEDDINGS_FILE).stat().st_ino
        # A linked file's checksum is the parent manifest's, not read again.
        theirs = _manifest(tmp_path, parent).checksums
        assert writer.linked_checksums == {EMBEDDINGS_FILE: theirs[EMBEDDINGS_FILE]}
        # A name that leaves the version folder is a bad manifest to the writer: IndexFormatError.
        with pytest.raises(IndexFormatError, match="leaves the version folder") as caught:
            writer.link_from(tmp_path / "shop" / parent, ["../CURRENT"])
        assert caught.type is IndexFormatError


def _copies_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links as on another filesystem: every file taken over is a copy."""
    import shutil

    from store.version import writer as writer_module

    def copy(src: Path, dst: Path) -> bool:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return False

    monkeypatch.setattr(writer_module, "link_or_copy", copy)


def test_a_copy_of_a_rotted_file_is_not_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed_files: list[str]
) -> None:
    """A file taken over as a copy (no hard link) must hold the bytes its version recorded: a copy of a
    rotted one raises the caller's error type naming the file, and nothing this call took over is left (nor
    recorded); a copy that matches keeps the recorded checksum, not hashed again."""
    from store.shards.sharded_writer import ShardedVersionWriter

    parent = write_version(tmp_path, "shop", n=20)
    folder = tmp_path / "shop" / parent
    theirs = _manifest(tmp_path, parent).checksums
    _copies_only(monkeypatch)
    hashed = hashed_files
    hashed.clear()  # the parent's own writing
    with VersionWriter(tmp_path, "shop") as writer:
        writer.link_from(folder, [EMBEDDINGS_FILE])
        assert writer.linked_checksums == {EMBEDDINGS_FILE: theirs[EMBEDDINGS_FILE]}
        assert hashed == [EMBEDDINGS_FILE]  # the copy, checked once
        assert (writer.stage / EMBEDDINGS_FILE).stat().st_ino != (folder / EMBEDDINGS_FILE).stat().st_ino
    data = bytearray((folder / INDEX_FILE).read_bytes())
    data[-1] ^= 0xFF
    (folder / INDEX_FILE).write_bytes(bytes(data))
    with VersionWriter(tmp_path, "shop") as writer:
        with pytest.raises(IndexFormatError, match=rf"{INDEX_FILE}: checksum mismatch") as caught:
            writer.link_from(folder, [RERANK_FILE, INDEX_FILE])
        assert caught.type is IndexFormatError and str(folder / INDEX_FILE) in str(caught.value)
        assert not (writer.stage / RERANK_FILE).exists() and not (writer.stage / INDEX_FILE).exists()
        assert writer.linked_checksums == {}
    with ShardedVersionWriter(tmp_path, "shop", 2) as sharded:  # its callers' type: VersionWriteError
        with pytest.raises(VersionWriteError, match="checksum mismatch"):
            sharded.link_own_files(folder, {INDEX_FILE: theirs[INDEX_FILE]})
        assert sharded.linked_checksums == {}


def test_taking_files_over_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure part-way (here a full disk while copying the 3rd of 4 files) removes what the call took
    over, the partial copy too, and leaves ``linked_checksums`` as they were; the stage's own files and
    the files linked before stay (a name staged already is refused, not copied over): the caller may go on
    writing the stage and verify finds it sound."""
    import shutil

    from store.version import writer as writer_module

    parent = write_version(tmp_path, "shop", n=20)
    folder = tmp_path / "shop" / parent
    names = [RERANK_FILE, "lexical.tantivy/meta.json", INDEX_FILE, METADATA_FILE]
    (folder / "lexical.tantivy").mkdir()
    (folder / "lexical.tantivy" / "meta.json").write_text("{}")

    def copy(src: Path, dst: Path) -> bool:  # another filesystem, whose disk fills at index.faiss
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.name == INDEX_FILE:
            dst.write_bytes(src.read_bytes()[:10])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        shutil.copy2(src, dst)
        return False

    with VersionWriter(tmp_path, "shop") as writer:
        writer.link_from(folder, [EMBEDDINGS_FILE])  # a hard link, before the failing call
        before = dict(writer.linked_checksums)
        monkeypatch.setattr(writer_module, "link_or_copy", copy)
        with pytest.raises(OSError, match="No space left") as caught:
            writer.link_from(folder, names)
        assert caught.value.filename == str(writer.stage / INDEX_FILE)
        assert sorted(p.name for p in writer.stage.iterdir()) == [EMBEDDINGS_FILE]
        assert writer.linked_checksums == before
        # A file staged already is not overwritten by a copy (a link cannot replace it): refused, kept.
        with pytest.raises(IndexFormatError, match="is staged already"):
            writer.link_from(folder, [EMBEDDINGS_FILE])
        assert (writer.stage / EMBEDDINGS_FILE).stat().st_ino == (folder / EMBEDDINGS_FILE).stat().st_ino
        monkeypatch.undo()
        # The caller goes on: the rest written afresh, and the version verifies.
        writer.link_from(folder, [RERANK_FILE, INDEX_FILE])
        writer.write_metadata([(i, f"sku-{i}", f"{i}.jpg", {}, False) for i in range(20)])
        writer.finish(dataclasses.replace(_manifest(tmp_path, parent), version=writer.version))
    assert verify_version(tmp_path, "shop") == []


def _write_rows(root: Path, rows: int, tokens: int = 0, width: int = 0) -> None:
    """20 rows announced, ``rows`` embeddings (and no tokens) appended."""
    with VersionWriter(root, "shop") as writer, writer.arrays(20, D, tokens=tokens, width=width) as arrays:
        arrays.append(vectors(rows, 0))


def test_writer_misuse_is_refused_before_anything_is_installed(tmp_path: Path) -> None:
    first = write_version(tmp_path, "shop", n=20)
    with pytest.raises(VersionWriteError, match=r"wrote 10 rows of embeddings\.npy, expected 20"):
        _write_rows(tmp_path, 10)
    with pytest.raises(VersionWriteError, match="append needs tokens"):
        _write_rows(tmp_path, 20, tokens=T, width=W)
    other = dataclasses.replace(_manifest(tmp_path, first), version="20000101T000000Z-000000")
    with (
        pytest.raises(VersionWriteError, match="the manifest names version"),
        VersionWriter(tmp_path, "shop") as w3,
    ):
        w3.finish(other)
    assert list_versions(tmp_path, "shop") == [first] and _staged(tmp_path) == []


def test_a_placeholder_store_is_sparse_zeros_and_checksums_can_be_left_out(tmp_path: Path) -> None:
    """Benchmarks: a re-rank store of the real shape that takes no space, and no hashing of it."""
    n, tokens, width = 2000, 65, 128
    embeds = vectors(n, 0)
    with VersionWriter(tmp_path, "shop") as writer:
        with writer.arrays(n, D, tokens=tokens, width=width, zero_rerank=True) as arrays:
            arrays.append(embeds[:1500])
            arrays.append(embeds[1500:])
        index = faiss.IndexFlatIP(D)
        index.add(writer.embeddings())
        writer.write_index(index)
        writer.write_metadata((i, f"item-{i}", None, {}, False) for i in range(n))
        manifest = dataclasses.replace(
            IndexManifest.from_json(_template_manifest()),
            version=writer.version,
            count=n,
            total_rows=n,
            rerank={"dtype": "fp16", "tokens": tokens, "width": width, "bytes_per_image": 0},
        )
        done = writer.finish(manifest, checksums=False)
    store = done.path / RERANK_FILE
    assert store.stat().st_size == 128 + n * tokens * width * 2
    assert store.stat().st_blocks * 512 < 64 * 1024  # a hole, not 33 MB of zeros
    assert _manifest(tmp_path, done.version).checksums == {}
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert not idx.rerank_tokens(np.array([0, n - 1])).any()
        np.testing.assert_array_equal(np.load(done.path / EMBEDDINGS_FILE), embeds)


def _template_manifest() -> str:
    return IndexManifest(
        format_version=1,
        name="shop",
        version="-",
        created_at="2026-11-22T00:00:00Z",
        model_name="test-model",
        model_fingerprint="f" * 64,
        embed_dim=D,
        preprocessing={},
        count=0,
        index_factory="Flat",
        search_params={},
        measured_recall_at_10=None,
        language_recall_at_10={},
        build_seconds=0.0,
        skipped=[],
        checksums={},
        rerank={},
        parent_version=None,
    ).to_json()
