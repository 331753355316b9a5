"""Sharded versions in the store: the hash rule, the merge, exact search over S shards merged equal to exact
search over one index (a property test), the global row space, the format-2 manifest and its refusal by
format-1 readers, verification, and the writer's staging, linking and single publish."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store.version.manifest
from store.errors import FilterError, IndexFormatError, VersionWriteError
from store.layout import EMBEDDINGS_FILE, INDEX_FILE, MANIFEST_FILE, METADATA_FILE, SHARDED_FORMAT_VERSION
from store.opening import open_version
from store.shards.merge import merge_topk
from store.shards.sharded import ShardedIndex
from store.shards.sharded_writer import ShardedVersionWriter
from store.verify import verify_version
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion, SearchableIndex
from store.version.sharding import Sharding, partition, shard_of
from store.version.versions import current_version, list_versions, prune_versions
from tests.store.writing import grid_vectors, sharded_order, write_rows

NAME = "shop"


def _ids(n: int, prefix: str = "sku") -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def test_the_hash_rule_is_stable_and_stated() -> None:
    # Pinned values: the rule may never change, or every sharded version would be read wrongly.
    assert [shard_of("sku-0", s) for s in (2, 3, 8)] == [0, 0, 2]
    assert [shard_of("test-000005", s) for s in (2, 3, 8)] == [1, 1, 3]
    assert [shard_of("é/ü.jpg", s) for s in (2, 3, 8)] == [0, 1, 6]
    assert shard_of("anything", 1) == 0
    assert partition(["sku-0", "test-000005"], 8).tolist() == [2, 3]


def test_merge_orders_by_score_then_global_row_and_pads() -> None:
    scores = [np.array([[0.9, 0.5, -np.inf]], np.float32), np.array([[0.9, 0.7]], np.float32)]
    rows = [np.array([[4, 1, -1]]), np.array([[0, 2]])]
    s, r = merge_topk(scores, rows, [0, 10], 6)
    # The tie at 0.9: global row 4 (shard 0) before 10 (shard 1); padding last.
    assert r.tolist() == [[4, 10, 12, 1, -1, -1]]
    np.testing.assert_allclose(s[0, :4], [0.9, 0.9, 0.7, 0.5])
    assert np.isneginf(s[0, 4:]).all()
    s, r = merge_topk([np.zeros((2, 0), np.float32)], [np.zeros((2, 0), np.int64)], [0], 3)
    assert r.tolist() == [[-1] * 3] * 2
    with pytest.raises(ValueError):
        merge_topk(scores, rows, [0], 3)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n=st.integers(1, 300),
    d=st.integers(8, 32),
    k=st.integers(1, 20),
    shard_count=st.sampled_from([1, 2, 3, 8]),
    seed=st.integers(0, 2**32 - 1),
    delete_share=st.sampled_from([0.0, 0.1, 0.5]),
    filtered=st.booleans(),
)
def test_merged_exact_search_equals_exact_search_over_one_index(
    n: int, d: int, k: int, shard_count: int, seed: int, delete_share: float, filtered: bool
) -> None:
    rng = np.random.default_rng(seed)
    embeds = grid_vectors(n, d, rng)
    twins = rng.integers(0, n, size=(n // 4, 2))
    embeds[twins[:, 1]] = embeds[twins[:, 0]]  # duplicated vectors: exact ties across and within shards
    ids = _ids(n, f"i{seed % 1000}")
    deleted = {ids[i] for i in np.flatnonzero(rng.random(n) < delete_share)}
    queries = np.concatenate([grid_vectors(4, d, rng), embeds[rng.integers(0, n, size=2)]])
    allowed = np.flatnonzero(rng.random(n) < 0.3) if filtered else None
    order = sharded_order(ids, shard_count)  # the one index holds the rows in the sharded global order
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_rows(root, "sharded", embeds, ids, deleted=deleted, shard_count=shard_count)
        write_rows(root, "one", embeds[order], [ids[i] for i in order], deleted=deleted)
        with open_version(root, "sharded") as sharded, open_version(root, "one") as one:
            assert isinstance(sharded, ShardedIndex) and isinstance(one, IndexVersion)
            assert (len(sharded), sharded.total_rows) == (len(one), one.total_rows)
            s_scores, s_rows = sharded.search_exact(queries, k, allowed)
            o_scores, o_rows = one.search_exact(queries, k, allowed)
            np.testing.assert_array_equal(s_rows, o_rows)  # same rows, same tie order
            np.testing.assert_allclose(s_scores, o_scores, atol=1e-6)
            found = sorted({int(r) for r in s_rows.ravel() if r >= 0})
            assert sharded.items(found) == one.items(found)
            np.testing.assert_array_equal(
                sharded.rerank_tokens(np.array(found)), one.rerank_tokens(np.array(found))
            )
            for item_id in ids[:5]:
                assert sharded.row_of(item_id) == one.row_of(item_id)
            np.testing.assert_array_equal(
                sharded.filter_rows({"category": "shoe"}), one.filter_rows({"category": "shoe"})
            )
            # Flat shards: ANN search is exact too (faiss orders its own ties: compare the scores).
            np.testing.assert_allclose(sharded.search(queries, k, allowed)[0], s_scores, atol=1e-6)


def test_a_sharded_version_is_a_searchable_index_of_ordinary_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    embeds = grid_vectors(60, 16, rng)
    version = write_rows(tmp_path, NAME, embeds, _ids(60), shard_count=3, factory="HNSW16,Flat")
    folder = tmp_path / NAME / version
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_FILE, "shard-000", "shard-001", "shard-002"]
    data = json.loads((folder / MANIFEST_FILE).read_text())
    assert data["format_version"] == SHARDED_FORMAT_VERSION and data["checksums"] == {}
    block = data["sharding"]
    assert block["shard_count"] == 3 and block["rule"] == "blake2b-first8-be-mod"
    assert [s["dir"] for s in block["shards"]] == ["shard-000", "shard-001", "shard-002"]
    assert sum(s["count"] for s in block["shards"]) == data["count"] == 60
    with open_version(tmp_path, NAME) as index:
        assert isinstance(index, SearchableIndex) and isinstance(index, ShardedIndex)
        assert index.offsets == (0, block["shards"][0]["total_rows"], 60 - block["shards"][2]["total_rows"])
        # Each item is where the rule says, and each shard opens alone as an ordinary version.
        for item in index.items(range(60)):
            shard = shard_of(item["id"], 3)
            assert index.row_of(item["id"]) - index.offsets[shard] < block["shards"][shard]["total_rows"]
        for s in range(3):
            shard_dir = folder / f"shard-{s:03d}"
            manifest = IndexManifest.load(shard_dir / MANIFEST_FILE)
            assert manifest.format_version == 1 and "sharding" not in (shard_dir / MANIFEST_FILE).read_text()
            with IndexVersion(shard_dir, manifest) as alone:
                assert len(alone) == block["shards"][s]["count"]
        with pytest.raises(IndexFormatError, match="rows out of range"):
            index.items([60])
        with pytest.raises(FilterError, match="unknown filter field"):
            index.filter_rows({"colour": "red"})
        assert index.search(embeds[:3], 5)[1][:, 0].tolist() == [index.row_of(i) for i in _ids(3)]
    assert verify_version(tmp_path, NAME) == []


def test_format_1_readers_refuse_a_sharded_version_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = write_rows(
        tmp_path, NAME, grid_vectors(20, 8, np.random.default_rng(1)), _ids(20), shard_count=2
    )
    path = tmp_path / NAME / version / MANIFEST_FILE
    manifest = IndexManifest.load(path)
    assert manifest.is_sharded
    with pytest.raises(IndexFormatError, match=r"sharded version.*open_version"):
        IndexVersion.open(tmp_path, NAME)
    with pytest.raises(IndexFormatError, match="sharded version"):
        IndexVersion(tmp_path / NAME / version, manifest)
    # The code before sharding read format 1 only, with this very check: it refuses, naming the format.
    monkeypatch.setattr(store.version.manifest, "MAX_FORMAT_VERSION", 1)
    with pytest.raises(
        IndexFormatError, match=r"format_version 2 is not supported \(this code reads up to 1\)"
    ):
        IndexManifest.load(path)


def test_unsharded_manifests_are_written_as_before(tmp_path: Path) -> None:
    version = write_rows(tmp_path, NAME, grid_vectors(10, 8, np.random.default_rng(2)), _ids(10))
    text = (tmp_path / NAME / version / MANIFEST_FILE).read_text()
    assert '"format_version": 1' in text and "sharding" not in text
    data = json.loads(text)
    data["sharding"] = {"shards": []}
    with pytest.raises(IndexFormatError, match="needs version 2"):
        IndexManifest.from_json(json.dumps(data))
    data["format_version"], data["sharding"] = 2, {}
    with pytest.raises(IndexFormatError, match="lacks its sharding block"):
        IndexManifest.from_json(json.dumps(data))


def test_verify_checks_every_shard_and_the_hash_rule(tmp_path: Path) -> None:
    embeds = grid_vectors(40, 8, np.random.default_rng(3))
    version = write_rows(tmp_path, NAME, embeds, _ids(40), shard_count=3)
    folder = tmp_path / NAME / version
    assert verify_version(tmp_path, NAME) == []
    emb = folder / "shard-001" / EMBEDDINGS_FILE
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0xFF
    emb.write_bytes(bytes(data))
    assert verify_version(tmp_path, NAME) == ["shard-001/embeddings.npy: checksum mismatch"]
    shard_manifest = folder / "shard-002" / MANIFEST_FILE
    shard_manifest.write_text(shard_manifest.read_text().replace('"count"', '"count" ', 1))
    assert "shard-002/manifest.json: checksum mismatch" in verify_version(tmp_path, NAME)
    # Items placed against the rule (a writer's bug) are found.
    wrong = np.zeros(40, dtype=np.int64)
    write_rows(tmp_path, "wrong", embeds, _ids(40), shard_count=2, owners=wrong)
    problems = verify_version(tmp_path, "wrong")
    assert len(problems) == 1 and "the hash rule puts elsewhere" in problems[0]


def test_the_writer_stages_links_and_publishes_once(tmp_path: Path) -> None:
    embeds = grid_vectors(30, 8, np.random.default_rng(4))
    first = write_rows(tmp_path, NAME, embeds, _ids(30), shard_count=2)
    parent = tmp_path / NAME / first
    with ShardedVersionWriter(tmp_path, NAME, 2) as writer:
        with pytest.raises(VersionWriteError, match="leaves the version folder"):
            writer.link_own_files(parent, {"../CURRENT": "0" * 64})  # a writer's caller's mistake
        writer.link_shard(0, parent / "shard-000")
        writer.link_shard(1, parent / "shard-001")
        sharding = writer.sharding()
        manifest = IndexManifest.load(parent / MANIFEST_FILE)
        # Linked shards are the parent's, manifests included: the parent's block describes them.
        assert Sharding.from_dict(manifest.sharding).shards == sharding.shards
        manifest.version, manifest.sharding = writer.version, sharding.to_dict()
        manifest.count += 1
        with pytest.raises(VersionWriteError, match="items"):
            writer.finish(manifest)
        manifest.count -= 1
        assert current_version(tmp_path, NAME) == first
        done = writer.finish(manifest, keep=1)
    assert current_version(tmp_path, NAME) == done.version and done.pruned == [first]
    assert list_versions(tmp_path, NAME) == [done.version]
    for name in (INDEX_FILE, EMBEDDINGS_FILE, METADATA_FILE, MANIFEST_FILE):
        assert os.stat(done.path / "shard-001" / name).st_nlink == 1  # the parent's links went with it
    assert verify_version(tmp_path, NAME) == []
    assert not any((tmp_path / NAME / ".builds").iterdir())
    # A failure before finishing leaves nothing staged and CURRENT untouched.
    with pytest.raises(RuntimeError, match="boom"), ShardedVersionWriter(tmp_path, NAME, 2) as writer:
        writer.shard(0)
        raise RuntimeError("boom")
    assert (
        not any((tmp_path / NAME / ".builds").iterdir()) and current_version(tmp_path, NAME) == done.version
    )
    assert prune_versions(tmp_path, NAME, 1) == []


def test_a_shard_copied_across_filesystems_is_checked_against_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed_files: list[str]
) -> None:
    """``link_shard`` across filesystems copies: a copy whose bytes are not those the shard's manifest
    records (the parent's file rotted) raises VersionWriteError naming the file, and nothing of the shard
    is left staged (it may be written afresh); a good copy is taken over. Hard links are not hashed."""
    embeds = grid_vectors(30, 8, np.random.default_rng(4))
    first = write_rows(tmp_path, NAME, embeds, _ids(30), shard_count=2)
    parent = tmp_path / NAME / first
    rotted = parent / "shard-001" / INDEX_FILE
    data = bytearray(rotted.read_bytes())
    data[-1] ^= 0xFF
    rotted.write_bytes(bytes(data))
    hashed = hashed_files
    hashed.clear()  # the parent's own writing
    with ShardedVersionWriter(tmp_path, NAME, 2) as writer:
        writer.link_shard(1, parent / "shard-001")  # hard links: the inode is the parent's, not hashed
        assert hashed == []

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", cross_device)
    with ShardedVersionWriter(tmp_path, NAME, 2) as writer:
        writer.link_shard(0, parent / "shard-000")
        assert MANIFEST_FILE in hashed and INDEX_FILE in hashed  # each copy checked
        assert (writer.stage / "shard-000" / INDEX_FILE).stat().st_ino != (
            parent / "shard-000" / INDEX_FILE
        ).stat().st_ino
        with pytest.raises(VersionWriteError, match="checksum mismatch") as caught:
            writer.link_shard(1, parent / "shard-001")
        assert str(rotted) in str(caught.value)
        assert not (writer.stage / "shard-001").exists()
        writer.shard(1)  # the caller may write it afresh


def test_a_shard_changed_since_its_version_was_published_is_not_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``link_shard`` checks the shard's manifest against the sha256 the parent version's manifest records
    for it, not against the bytes it read: a shard rewritten and sealed afresh since the parent was
    published (its files and its manifest agreeing, so each copy checked out) was taken over, and the new
    version recorded the changed shard as good. Hard-linked or copied, it raises VersionWriteError naming
    the manifest, nothing of the shard is left staged, and nothing is published."""
    from tests.fixtures import reseal_changed_shard

    embeds = grid_vectors(30, 8, np.random.default_rng(4))
    first = write_rows(tmp_path, NAME, embeds, _ids(30), shard_count=2)
    parent = tmp_path / NAME / first
    shard = parent / "shard-001"
    reseal_changed_shard(shard)
    assert "shard-001/manifest.json: checksum mismatch" in verify_version(tmp_path, NAME)  # the parent's

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    for copies in (False, True):
        if copies:
            monkeypatch.setattr(os, "link", cross_device)
        changed_error = pytest.raises(VersionWriteError, match="changed since that version was published")
        with changed_error as caught, ShardedVersionWriter(tmp_path, NAME, 2) as writer:
            writer.link_shard(0, parent / "shard-000")
            try:
                writer.link_shard(1, shard)
            finally:
                assert not (writer.stage / "shard-001").exists()
        assert str(shard / MANIFEST_FILE) in str(caught.value)
        assert list_versions(tmp_path, NAME) == [first] and current_version(tmp_path, NAME) == first
        assert not any((tmp_path / NAME / ".builds").iterdir())


def test_a_field_only_some_shards_carry_filters_the_others_out(tmp_path: Path) -> None:
    embeds = grid_vectors(24, 8, np.random.default_rng(5))
    ids = _ids(24)
    write_rows(tmp_path, NAME, embeds, ids, shard_count=8, deleted={ids[0], ids[5]})
    with open_version(tmp_path, NAME) as index:
        assert isinstance(index, ShardedIndex)
        assert index.fields == {"category", "price", "sale"}
        assert any("sale" not in shard.fields for shard in index.shards)
        on_sale = index.filter_rows({"sale": True})
        assert sorted(item["id"] for item in index.items(on_sale)) == sorted([ids[7], ids[14], ids[21]])
        rows = index.filter_rows({"price": {"gte": 10.0}})
        assert sorted(item["id"] for item in index.items(rows)) == sorted(ids[10:])
        assert index.row_of(ids[0]) is None and len(index) == 22
        _, found = index.search(embeds[[0, 5]], 24)
        hits = {item["id"] for item in index.items([int(r) for r in found.ravel() if r >= 0])}
        assert hits == set(ids) - {ids[0], ids[5]}  # deleted items never come back


def test_a_whole_unsharded_version_is_linked_as_a_first_segment(tmp_path: Path) -> None:
    """A rebuild of an unsharded CURRENT into segments takes the whole version folder over as its first
    segment: nothing records that folder's manifest digest (no sharded manifest holds it), so it is linked
    on its own checksums. Checking it against a recorded one read ``shop/manifest.json``, which does not
    exist, and every such rebuild failed."""
    from tests.store.writing import write_version

    version = write_version(tmp_path, NAME, n=40)
    with ShardedVersionWriter(tmp_path, NAME, 2) as writer:
        writer.link_shard(0, tmp_path / NAME / version)
        staged = next(p for p in writer.stage.iterdir() if p.is_dir())
        assert sorted(p.name for p in staged.iterdir()) == sorted(
            p.name
            for p in (tmp_path / NAME / version).iterdir()
            if p.is_file() and not p.name.startswith(".")
        )
