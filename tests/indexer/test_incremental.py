"""A full build reuses the stored vectors of CURRENT for every image whose bytes did not change
(``indexer.incremental``): unchanged, touched, moved, metadata-only and corrupted cases, equality with a
``--force`` build, ``add`` in between, and a real ``kill -9`` mid-way through an incremental build. A small
change writes a segmented version (``indexer.segments``): the parent's files shared, one new segment;
compaction, ``add`` / ``delete`` on segments, pruning and ``verify``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.build import add, build
from indexer.errors import BuildError
from model.runtime import Encoder
from store.files import disk_bytes
from store.layout import EMBEDDINGS_FILE, INDEX_FILE, RERANK_FILE, index_dir
from store.opening import OpenedIndex, open_version
from store.verify import verify_version
from store.version.reader import IndexVersion
from store.version.versions import current_version, prune_versions
from tests.conftest import REPO_ROOT
from tests.indexer.files import write_photo
from tests.indexer.killing import kill_after_shards


def _shop(catalogue: Path, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A private copy of the synthetic catalogue (its manifest and images), and the manifest's rows."""
    shop = tmp_path / "shop"
    shutil.copytree(catalogue / "images", shop / "images")
    rows = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line]
    return _write(shop, rows), rows


def _write(shop: Path, rows: list[dict[str, Any]]) -> Path:
    path = shop / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _open(settings: Settings, version: str | None) -> IndexVersion:
    return IndexVersion.open(settings.index_root, "shop", version)


def _embeds(settings: Settings, version: str | None) -> np.ndarray:
    with _open(settings, version) as idx:
        return idx.embeddings(np.arange(idx.total_rows))


def _any(settings: Settings, version: str | None) -> OpenedIndex:
    return open_version(settings.index_root, "shop", version)


def _by_id(settings: Settings, version: str | None) -> dict[str, np.ndarray]:
    """{id: stored embedding} of the live items, whatever the layout (one version or segments)."""
    with _any(settings, version) as idx:
        rows = [idx.row_of(it["id"]) for it in _live_items(idx)]
        ids = [it["id"] for it in _live_items(idx)]
        embeds = idx.embeddings(np.array(rows, dtype=np.int64))
    return dict(zip(ids, embeds, strict=True))


def _live_items(idx: OpenedIndex) -> list[dict[str, Any]]:
    live = [r for r in range(idx.total_rows) if idx.row_of(idx.items([r])[0]["id"]) == r]
    return idx.items(live)


def _inode(settings: Settings, version: str, name: str) -> int:
    return (index_dir(settings.index_root, "shop") / version / name).stat().st_ino


def test_unchanged_rebuild_encodes_nothing(settings: Settings, catalogue: Path, tmp_path: Path) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert (first.items_encoded, first.items_reused, first.items_new) == (40, 0, 40)
    again = build("shop", [manifest], settings=settings)  # same files, same times: already CURRENT
    assert again.already_current and again.items_encoded == 0 and not again.published
    for r in rows:  # the same bytes with new modification times: a real build, encoding nothing
        os.utime(manifest.parent / r["image"], ns=(1, 1))
    touched = build("shop", [manifest], settings=settings)
    assert touched.published and touched.version != first.version
    assert (touched.items_encoded, touched.items_reused) == (0, 40)
    assert (touched.items_new, touched.items_changed, touched.items_removed) == (0, 0, 0)
    assert first.version is not None and touched.version is not None
    for name in (EMBEDDINGS_FILE, RERANK_FILE, INDEX_FILE):  # the same rows: shared, not copied
        assert _inode(settings, touched.version, name) == _inode(settings, first.version, name)
    assert touched.ann_index.startswith(f"linked from {first.version}")
    np.testing.assert_array_equal(_embeds(settings, touched.version), _embeds(settings, first.version))
    assert verify_version(settings.index_root, "shop", touched.version) == []


def test_a_copy_of_the_parents_rotted_ann_index_is_built_anew(
    settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows across filesystems (links are copies): the parent's index.faiss rotted, so its copy
    does not match the recorded checksum and is not taken over (it would be recorded as good); the ANN index
    is built anew from the stored vectors and the new version holds no rotted bytes."""
    from store.version import writer as writer_module

    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert first.version is not None
    path = index_dir(settings.index_root, "shop") / first.version / INDEX_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_version(settings.index_root, "shop", first.version) == [f"{INDEX_FILE}: checksum mismatch"]

    def copy(src: Path, dst: Path) -> bool:  # another filesystem: no hard links
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return False

    monkeypatch.setattr(writer_module, "link_or_copy", copy)
    for r in rows:
        os.utime(manifest.parent / r["image"], ns=(1, 1))
    again = build("shop", [manifest], settings=settings)
    assert again.published and again.version is not None and again.items_encoded == 0
    assert again.ann_index.startswith("rebuilt from stored vectors") and INDEX_FILE in again.ann_index
    new = index_dir(settings.index_root, "shop") / again.version / INDEX_FILE
    assert new.read_bytes() != bytes(data)
    assert verify_version(settings.index_root, "shop", again.version) == []


def test_changed_image_under_same_path_and_same_image_under_new_path(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    shop = manifest.parent
    write_photo(shop / rows[3]["image"], 12345, (64, 64), fmt="PNG")  # other bytes, same path
    moved = "images/moved/renamed.png"
    (shop / moved).parent.mkdir()
    os.rename(shop / rows[5]["image"], shop / moved)  # same bytes, new path
    rows[5]["image"] = moved
    again = build("shop", [_write(shop, rows)], settings=settings)
    assert (again.items_encoded, again.items_reused) == (1, 39)
    assert (again.items_new, again.items_changed, again.items_removed) == (0, 1, 0)
    old, new = _by_id(settings, first.version), _by_id(settings, again.version)
    assert not np.allclose(old[rows[3]["id"]], new[rows[3]["id"]], atol=1e-3)  # encoded again
    for r in rows[:3] + rows[4:]:  # the rest reused
        np.testing.assert_array_equal(old[r["id"]], new[r["id"]])
    with _any(settings, again.version) as idx:
        assert idx.items([idx.row_of(rows[5]["id"])])[0]["path"] == str(shop / moved)
    assert again.ann_index.startswith("segments: 0 linked whole, 1 with rows deleted")
    forced = build("shop", [manifest], settings=settings, force=True)
    assert (forced.items_encoded, forced.items_reused) == (40, 0)
    for item_id, vec in _by_id(settings, forced.version).items():
        np.testing.assert_allclose(vec, new[item_id], atol=1e-6)


def test_metadata_only_change_encodes_nothing_and_filters_see_it(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    for i, r in enumerate(rows):
        r["price"] = float(i)
        r["stock"] = i % 3
    again = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert again.published and (again.items_encoded, again.items_reused) == (0, 40)
    assert first.version is not None and again.version is not None
    assert _inode(settings, again.version, EMBEDDINGS_FILE) == _inode(
        settings, first.version, EMBEDDINGS_FILE
    )
    with _open(settings, None) as idx:
        assert idx.version == again.version
        assert idx.filter_rows({"price": {"gte": 35}}).tolist() == [35, 36, 37, 38, 39]
        assert idx.filter_rows({"stock": 0}).tolist() == list(range(0, 40, 3))
    assert verify_version(settings.index_root, "shop") == []


def test_a_rebuild_that_encodes_nothing_loads_no_encoder(
    settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loading the model's graphs is most of a small rebuild's fixed cost: a metadata-only change (rows
    # kept, measurements taken over, no gate) must not pay it.
    import indexer.encoding

    manifest, rows = _shop(catalogue, tmp_path)
    shop = manifest.parent
    build("shop", [_write(shop, rows[:36])], settings=settings)
    write_photo(shop / rows[0]["image"], 4242, (64, 64), fmt="PNG")
    build("shop", [_write(shop, rows[:36])], settings=settings)  # a segmented version

    def refuse(*_: object, **__: object) -> Encoder:
        raise AssertionError("an encoder was loaded")

    monkeypatch.setattr(indexer.encoding, "load_encoder", refuse)
    for i, r in enumerate(rows[:36]):
        r["price"] = float(i) + 0.5
    meta = build("shop", [_write(shop, rows[:36])], settings=settings)
    assert meta.published and (meta.items_encoded, meta.items_reused) == (0, 36)
    with _any(settings, None) as idx:
        assert idx.manifest.sharding["rule"] == "segments"
        assert len(idx.filter_rows({"price": {"gte": 30.0}})) == 6
    assert verify_version(settings.index_root, "shop") == []


def test_incremental_answers_equal_a_force_build(
    settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    build("shop", [manifest], settings=settings)
    shop = manifest.parent
    write_photo(shop / rows[10]["image"], 777, (64, 64), fmt="PNG")  # 1 changed
    removed = rows.pop(20)  # 1 removed
    write_photo(shop / "images" / "new.png", 778, (64, 64))  # 1 added
    rows.insert(7, {"id": "brand-new", "image": "images/new.png", "captions": removed["captions"]})
    incremental = build("shop", [_write(shop, rows)], settings=settings)
    assert (incremental.items_encoded, incremental.items_reused) == (2, 38)
    assert (incremental.items_new, incremental.items_changed, incremental.items_removed) == (1, 1, 1)
    forced = build("shop", [manifest], settings=settings, force=True)
    assert forced.items_encoded == 40
    texts = [r["captions"]["en"][0] for r in rows[:12]] + [r["captions"]["de"][0] for r in rows[12:24]]
    queries = np.asarray(encoder.encode_text(texts).embeds, dtype=np.float32)
    assert incremental.ann_index.startswith("segments:")  # a small change: one new segment
    with _any(settings, incremental.version) as a, _any(settings, forced.version) as b:
        sa, ra = a.search(queries, 10)
        sb, rb = b.search(queries, 10)
        ids_a = [[it["id"] for it in a.items(r)] for r in ra]
        ids_b = [[it["id"] for it in b.items(r)] for r in rb]
        assert ids_a == ids_b
        np.testing.assert_allclose(sa, sb, atol=1e-6)
        ids = [r["id"] for r in rows]
        rows_a = np.array([a.row_of(i) for i in ids])
        rows_b = np.array([b.row_of(i) for i in ids])
        np.testing.assert_allclose(a.rerank_tokens(rows_a), b.rerank_tokens(rows_b), atol=1e-3)


def test_corrupted_stored_vector_is_encoded_again_and_reported(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert first.version is not None
    good = _embeds(settings, first.version)
    path = index_dir(settings.index_root, "shop") / first.version / EMBEDDINGS_FILE
    header = path.stat().st_size - good.nbytes
    with open(path, "r+b") as fh:  # row 7's embedding overwritten on disk
        fh.seek(header + 7 * good.shape[1] * 4)
        fh.write(np.full(good.shape[1], 0.5, np.float32).tobytes())
    rows[0]["price"] = 1.0  # a metadata change, so the build is not CURRENT already
    again = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert again.reuse_mismatched == [rows[7]["id"]]
    assert (again.items_encoded, again.items_reused) == (1, 39)
    assert any("failed their checksum" in note and rows[7]["id"] in note for note in again.notes)
    fixed = _by_id(settings, again.version)
    for r, vec in zip(rows, good, strict=True):
        np.testing.assert_allclose(fixed[r["id"]], vec, atol=1e-6)
    assert verify_version(settings.index_root, "shop", again.version) == []


def test_rows_added_by_add_are_reused_by_the_next_build(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    manifest, rows = _shop(catalogue, tmp_path)
    build("shop", [_write(manifest.parent, rows[:30])], settings=settings)
    added = add("shop", [_write(manifest.parent, rows)], settings=settings)
    assert added.items_indexed == 10
    again = build("shop", [manifest], settings=settings)
    assert (again.items_encoded, again.items_reused) == (0, 40)


N_PHOTOS, CHANGED, SHARD = 48, 32, 4


def _cli(folder: Path, root: Path, report: Path) -> list[str]:
    return [
        sys.executable, "-m", "ccrk_cli.main", "index", "build", "--name", "shop", "--index-root", str(root),
        "--threads", "1", "--workers", "1", "--batch-size", "4", "--json-report", str(report), str(folder),
    ]  # fmt: skip


def _killed_then_rerun(
    folder: Path, root: Path, tmp_path: Path, shard_size: int, current: str
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """``ccrk index build`` of ``folder`` killed -9 once it wrote 2 shards of ``shard_size`` items (CURRENT
    still ``current``), then run again to the end (its JSON report in ``tmp_path / "rerun.json"``): the
    shards written before the kill, and the re-run."""
    env = {
        **os.environ,
        "CCRK_SHARD_SIZE": str(shard_size),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    env["COLUMNS"] = "300"
    proc = subprocess.Popen(
        _cli(folder, root, tmp_path / "killed.json"), cwd=REPO_ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    written = kill_after_shards(proc, root, "shop/.builds/build-*/shards/shard-*.npz", 2)
    assert current_version(root, "shop") == current  # CURRENT untouched
    rerun = subprocess.run(
        _cli(folder, root, tmp_path / "rerun.json"), cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    return written, rerun


def test_kill_9_mid_incremental_build_then_rerun_publishes_the_same(
    settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "photos"
    for i in range(N_PHOTOS):
        write_photo(folder / f"{i:03d}.jpg", i, (480, 360))
    root = settings.index_root
    first = build("shop", [folder], settings=settings.model_copy(update={"shard_size": SHARD}))
    for i in range(CHANGED):  # 2/3 of the photos change: enough shards to kill the build between them
        write_photo(folder / f"{i:03d}.jpg", 1000 + i, (480, 360))
    written, rerun = _killed_then_rerun(folder, root, tmp_path, SHARD, first.version)
    assert 2 <= written < CHANGED // SHARD
    assert f"encoded {CHANGED} of {N_PHOTOS}; reused {N_PHOTOS - CHANGED}" in " ".join(rerun.stdout.split())
    report = json.loads((tmp_path / "rerun.json").read_text())
    assert (report["items_encoded"], report["items_reused"], report["items_changed"]) == (
        CHANGED,
        16,
        CHANGED,
    )
    assert report["resumed_shards"] >= 2
    assert list(root.glob("shop/.builds/build-*")) == []
    forced = build("shop", [folder], settings=settings.model_copy(update={"shard_size": SHARD}), force=True)
    np.testing.assert_allclose(
        _embeds(settings, report["version"]), _embeds(settings, forced.version), atol=1e-6
    )


def test_appended_rows_extend_the_parents_hnsw_graph(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """Above exact_max_items the index is HNSW: rows only appended are added to the parent's graph (recall
    measured against exact search first), anything else rebuilds it from the stored vectors."""
    hnsw = settings.model_copy(update={"exact_max_items": 10})
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [_write(manifest.parent, rows[:30])], settings=hnsw)
    assert first.index_factory.startswith("HNSW")
    grown = build("shop", [_write(manifest.parent, rows)], settings=hnsw)
    assert (grown.items_encoded, grown.items_reused) == (10, 30)
    assert grown.ann_index.startswith(f"{first.version}'s HNSW graph + 10 added (recall@10 1.000")
    with _open(hnsw, grown.version) as idx:
        assert idx.index_kind == "hnsw" and idx.manifest.build_params["hnsw_extended_from"] == first.version
        embeds = idx.embeddings(np.arange(40))
        _, found = idx.search(embeds, 1)
        np.testing.assert_array_equal(found[:, 0], np.arange(40))
    assert verify_version(hnsw.index_root, "shop", grown.version) == []
    rows.pop(0)  # a removal: the row is marked deleted in a segment of its own (the graph is kept)
    shrunk = build("shop", [_write(manifest.parent, rows)], settings=hnsw)
    assert shrunk.items_encoded == 0 and shrunk.ann_index.startswith("segments: 0 linked whole, 1 ")
    rows.pop(0)
    rows.pop(0)  # 3 of 40 rows deleted passes a 5 % share: compacted, the graph rebuilt from stored vectors
    tight = hnsw.model_copy(update={"index_segment_max_dead": 0.05})
    compacted = build("shop", [_write(manifest.parent, rows)], settings=tight)
    assert (compacted.items_encoded, compacted.ann_index) == (0, "rebuilt from stored vectors")
    assert any(note.startswith("compacted into one version") for note in compacted.notes)


def test_a_rebuild_of_the_same_rows_keeps_the_parents_rerank_policy(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """Measurements taken over from the parent (same vectors and captions) include the re-rank policy's
    gaps: a metadata-only rebuild re-ranks as adaptively as its parent."""
    with_policy = settings.model_copy(update={"rerank_policy_queries": 40})
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=with_policy)
    with _open(settings, first.version) as idx:
        policy = idx.manifest.rerank.get("policy")
    assert policy is not None
    for r in rows:
        r["price"] = 1.5
    touched = build("shop", [_write(manifest.parent, rows)], settings=with_policy)
    assert touched.published and touched.items_encoded == 0
    with _open(settings, touched.version) as idx:
        assert idx.manifest.rerank.get("policy") == policy


def _exact_answers(settings: Settings, version: str | None, queries: np.ndarray) -> tuple[list, np.ndarray]:
    with _any(settings, version) as idx:
        scores, rows = idx.search_exact(queries, 10)
        return [[it["id"] for it in idx.items(r)] for r in rows], scores


def test_one_changed_image_writes_a_segment_sharing_the_parents_files(
    settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    """1 of 40 images changed: only it is encoded; the new version is the parent's files (hard links:
    the same inodes) with that row marked deleted, plus a segment of one row; disk of both versions
    together within 1.1x of one; verify passes; exact answers equal a --force build's; a pruned parent
    leaves the new version whole."""
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert first.version is not None
    write_photo(manifest.parent / rows[3]["image"], 4242, (64, 64), fmt="PNG")
    base = index_dir(settings.index_root, "shop")
    again = build("shop", [manifest], settings=settings)
    assert again.version is not None and (again.items_encoded, again.items_reused) == (1, 39)
    seg0, seg1 = base / again.version / "shard-000", base / again.version / "shard-001"
    for name in (EMBEDDINGS_FILE, RERANK_FILE, INDEX_FILE):
        assert (seg0 / name).stat().st_ino == _inode(settings, first.version, name)
    # Every other file is a link too: the second version costs its metadata, file stats, manifests and the
    # new segment (at 40 tiny items those fixed costs are a fifth of a version; bench/incremental.py
    # measures 1,000 and 100,000).
    own = sorted(p.name for p in seg0.iterdir() if p.stat().st_nlink == 1)
    assert own == ["image_stats.npy", "manifest.json", "metadata.sqlite"]
    extra = disk_bytes(base / first.version, base / again.version) - disk_bytes(base / first.version)
    written = [seg0 / name for name in own] + [base / again.version / "manifest.json"]
    assert extra == disk_bytes(seg1) + sum(p.stat().st_blocks * 512 for p in written)
    assert verify_version(settings.index_root, "shop", again.version) == []
    with _any(settings, again.version) as idx:
        assert len(idx) == 40 and idx.total_rows == 41
        assert idx.row_of(rows[3]["id"]) == 40  # the live row is the new segment's
        assert idx.manifest.sharding["rule"] == "segments"
        assert np.load(seg1 / EMBEDDINGS_FILE).shape[0] == 1
    assert prune_versions(settings.index_root, "shop", 1) == [first.version]  # the parent goes
    assert verify_version(settings.index_root, "shop", again.version) == []  # its shared files stay
    reference = settings.model_copy(update={"index_root": tmp_path / "reference"})
    forced = build("shop", [manifest], settings=reference, force=True)
    texts = [r["captions"]["en"][0] for r in rows[:20]]
    queries = np.asarray(encoder.encode_text(texts).embeds, dtype=np.float32)
    ids_f, scores_f = _exact_answers(reference, forced.version, queries)
    ids_c, scores_c = _exact_answers(settings, again.version, queries)
    assert ids_c == ids_f
    np.testing.assert_allclose(scores_c, scores_f, atol=1e-6)


def test_segments_compact_past_the_segment_limit_and_answers_stay_those_of_force(
    settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    limited = settings.model_copy(update={"index_max_segments": 3})
    manifest, rows = _shop(catalogue, tmp_path)
    build("shop", [manifest], settings=limited)
    shop = manifest.parent
    factories = []
    for k in range(3):  # each build changes one image: segments 2, 3, then compaction into one
        write_photo(shop / rows[k]["image"], 9000 + k, (64, 64), fmt="PNG")
        report = build("shop", [manifest], settings=limited)
        assert report.items_encoded == 1
        factories.append(report.index_shards)
    assert factories == [2, 3, 1]
    assert any("3 segments" not in n and n.startswith("compacted") for n in report.notes)
    assert verify_version(settings.index_root, "shop") == []
    with _any(settings, None) as idx:
        assert not idx.manifest.is_sharded and idx.total_rows == 40
    forced = build("shop", [manifest], settings=limited, force=True)
    queries = np.asarray(encoder.encode_text([r["captions"]["en"][0] for r in rows[:16]]).embeds, np.float32)
    ids_a, scores_a = _exact_answers(settings, report.version, queries)
    ids_b, scores_b = _exact_answers(settings, forced.version, queries)
    assert ids_a == ids_b
    np.testing.assert_allclose(scores_a, scores_b, atol=1e-6)


def test_add_delete_and_metadata_on_a_segmented_version(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    from indexer.build import delete

    manifest, rows = _shop(catalogue, tmp_path)
    shop = manifest.parent
    build("shop", [_write(shop, rows[:36])], settings=settings)
    write_photo(shop / rows[0]["image"], 31337, (64, 64), fmt="PNG")
    seg = build("shop", [_write(shop, rows[:36])], settings=settings)
    assert seg.index_shards == 2 and seg.items_encoded == 1
    added = add("shop", [_write(shop, rows)], settings=settings)  # 4 new items: a third segment
    assert added.items_indexed == 4 and added.index_shards == 3
    # An add never compacts: at index_max_segments it refuses, naming the build that does.
    with pytest.raises(BuildError, match=r"index_max_segments 3.*ccrk index build"):
        add("shop", [_write(shop, rows)], settings=settings.model_copy(update={"index_max_segments": 3}))
    gone = delete("shop", [rows[0]["id"], rows[10]["id"], rows[38]["id"]], settings=settings)
    assert gone.count == 37
    assert verify_version(settings.index_root, "shop") == []
    with _any(settings, None) as idx:
        assert idx.manifest.sharding["rule"] == "segments"
        assert [idx.row_of(rows[i]["id"]) for i in (0, 10, 38)] == [None, None, None]
        assert idx.row_of(rows[39]["id"]) is not None
    left = [r for i, r in enumerate(rows) if i not in (0, 10, 38)]
    for i, r in enumerate(left):  # a metadata-only change of every row: nothing encoded, filters see it
        r["price"] = float(i)
    meta = build("shop", [_write(shop, left)], settings=settings)
    assert meta.published and meta.items_encoded == 0
    with _any(settings, None) as idx:
        found = idx.filter_rows({"price": {"gte": 35}})
        assert sorted(it["id"] for it in idx.items(found)) == sorted(r["id"] for r in left[35:])
    assert verify_version(settings.index_root, "shop") == []


def test_a_segment_changed_since_its_version_was_published_is_not_taken_over(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """A segment of CURRENT rewritten and sealed afresh since CURRENT was published (its files and its own
    manifest agreeing, not the sha256 CURRENT's manifest records for it): the next build's segment plan
    linked its files into the new version, their checksums recorded as good, and published it. The build
    reuses nothing of CURRENT instead (everything encoded again, the reason noted), publishing a version
    whose files share nothing with the changed segment and that verifies clean."""
    from tests.fixtures import reseal_changed_shard

    manifest, rows = _shop(catalogue, tmp_path)
    shop = manifest.parent
    build("shop", [_write(shop, rows[:36])], settings=settings)
    write_photo(shop / rows[0]["image"], 31337, (64, 64), fmt="PNG")
    assert build("shop", [_write(shop, rows[:36])], settings=settings).index_shards == 2  # segmented
    parent = index_dir(settings.index_root, "shop") / str(current_version(settings.index_root, "shop"))
    changed = reseal_changed_shard(parent / "shard-001")
    write_photo(shop / rows[5]["image"], 4242, (64, 64), fmt="PNG")
    report = build("shop", [_write(shop, rows[:36])], settings=settings)
    assert report.published and report.items_encoded == 36 and report.items_reused == 0
    assert any("shard-001/manifest.json: sha256 differs" in note for note in report.notes), report.notes
    published = index_dir(settings.index_root, "shop") / str(current_version(settings.index_root, "shop"))
    assert published != parent
    inodes = {p.stat().st_ino for p in published.rglob("*") if p.is_file()}
    assert changed.stat().st_ino not in inodes
    assert verify_version(settings.index_root, "shop") == []


def test_kill_9_mid_segment_build_then_rerun_publishes_the_same(settings: Settings, tmp_path: Path) -> None:
    """The small-change path (a new segment) resumes after kill -9 like any build: 6 of 48 photos changed,
    encoded one per shard; killed after 2 shards; the re-run publishes a segmented version equal to a
    --force build."""
    folder = tmp_path / "photos"
    for i in range(N_PHOTOS):
        write_photo(folder / f"{i:03d}.jpg", i, (480, 360))
    root = settings.index_root
    first = build("shop", [folder], settings=settings)
    for i in range(6):
        write_photo(folder / f"{i:03d}.jpg", 2000 + i, (480, 360))
    written, _ = _killed_then_rerun(folder, root, tmp_path, 1, first.version)
    assert 2 <= written < 6
    report = json.loads((tmp_path / "rerun.json").read_text())
    assert (report["items_encoded"], report["items_reused"], report["index_shards"]) == (6, 42, 2)
    assert report["resumed_shards"] >= 2
    assert verify_version(root, "shop") == []
    forced = build("shop", [folder], settings=settings, force=True)
    a, b = _by_id(settings, report["version"]), _by_id(settings, forced.version)
    assert a.keys() == b.keys()
    for item_id, vec in b.items():
        np.testing.assert_allclose(a[item_id], vec, atol=1e-6)


def test_files_hashed_before_are_not_read_again_and_a_rewritten_one_is(
    settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """The file stats recorded with the digests (``store.version.reuse.image_stat``) spare reading the
    unchanged
    files; a file written since (same path, same size even) has a new change time: hashed and encoded."""
    import indexer.incremental as incremental
    import store.version.reuse as reuse

    monkeypatch.setattr(reuse, "RACY_NS", 0)  # the test's files are seconds old, not hours
    manifest, rows = _shop(catalogue, tmp_path)
    build("shop", [manifest], settings=settings)
    hashed: list[Path] = []

    def counting(path: Path) -> bytes | None:
        hashed.append(Path(path))
        return reuse.image_digest(path)

    monkeypatch.setattr(incremental, "image_digest", counting)
    target = manifest.parent / rows[6]["image"]
    data = target.read_bytes()
    target.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # other bytes, same size and path
    rows[0]["price"] = 2.0
    again = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert hashed == [target]
    assert again.items_changed == 1 and again.items_encoded == 1


def test_the_model_check_is_skipped_for_the_files_current_was_checked_with(
    settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    import indexer.build as build_module
    import indexer.build_key as build_key

    model = tmp_path / "model"
    shutil.copytree(settings.model_dir, model)
    monkeypatch.setattr(build_key, "RACY_NS", 0)  # the copy is seconds old
    checked: list[Path] = []
    real_check = build_module.check_model_dir

    def counting(model_dir: Path, **kwargs: Any) -> None:
        checked.append(Path(model_dir))
        real_check(model_dir, **kwargs)

    monkeypatch.setattr(build_module, "check_model_dir", counting)
    own = settings.model_copy(update={"model_dir": model})
    manifest, rows = _shop(catalogue, tmp_path)
    build("shop", [manifest], settings=own)
    rows[0]["price"] = 3.0
    build("shop", [_write(manifest.parent, rows)], settings=own)
    assert checked == [model]  # the second build: the very files CURRENT's build checked
    os.utime(model / "config.json")  # any change to a file of the model: checked again
    rows[0]["price"] = 4.0
    build("shop", [_write(manifest.parent, rows)], settings=own)
    assert checked == [model, model]


def test_a_version_written_before_segments_and_file_stats_is_reused_and_segmented(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """CURRENT as the previous release wrote it (no image_stats.npy, no model files key): still served,
    its rows reused, and it becomes the first segment of the next version."""
    from store.version.manifest import IndexManifest

    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert first.version is not None
    old = index_dir(settings.index_root, "shop") / first.version
    (old / "image_stats.npy").unlink()
    m = IndexManifest.load(old / "manifest.json")
    m.checksums.pop("image_stats.npy")
    m.build_params.pop("model_files_key", None)
    m.save(old / "manifest.json")
    assert verify_version(settings.index_root, "shop", first.version) == []
    with _any(settings, None) as idx:
        assert len(idx) == 40
    write_photo(manifest.parent / rows[9]["image"], 5151, (64, 64), fmt="PNG")
    again = build("shop", [manifest], settings=settings)
    assert (again.items_encoded, again.items_reused, again.index_shards) == (1, 39, 2)
    assert verify_version(settings.index_root, "shop", again.version) == []
