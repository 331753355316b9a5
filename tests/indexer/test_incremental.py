"""A full build reuses the stored vectors of CURRENT for every image whose bytes did not change
(``indexer.incremental``): unchanged, touched, moved, metadata-only and corrupted cases, equality with a
``--force`` build, ``add`` in between, and a real ``kill -9`` mid-way through an incremental build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ccrk_settings import Settings
from indexer.build import add, build
from model.runtime import Encoder
from store.layout import EMBEDDINGS_FILE, INDEX_FILE, RERANK_FILE, index_dir
from store.reader import IndexVersion
from store.verify import verify_version
from store.versions import current_version
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
    old, new = _embeds(settings, first.version), _embeds(settings, again.version)
    assert not np.allclose(old[3], new[3], atol=1e-3)  # encoded again
    np.testing.assert_array_equal(np.delete(old, 3, axis=0), np.delete(new, 3, axis=0))  # the rest reused
    with _open(settings, again.version) as idx:
        assert idx.items([5])[0]["path"] == str(shop / moved)
    assert again.ann_index == "rebuilt from stored vectors"
    forced = build("shop", [manifest], settings=settings, force=True)
    assert (forced.items_encoded, forced.items_reused) == (40, 0)
    np.testing.assert_allclose(_embeds(settings, forced.version), new, atol=1e-6)


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
    with _open(settings, incremental.version) as a, _open(settings, forced.version) as b:
        sa, ra = a.search(queries, 10)
        sb, rb = b.search(queries, 10)
        ids_a = [[it["id"] for it in a.items(r)] for r in ra]
        ids_b = [[it["id"] for it in b.items(r)] for r in rb]
        assert ids_a == ids_b
        np.testing.assert_allclose(sa, sb, atol=1e-6)
        toks = np.arange(a.total_rows)
        np.testing.assert_allclose(a.rerank_tokens(toks), b.rerank_tokens(toks), atol=1e-3)


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
    np.testing.assert_allclose(_embeds(settings, again.version), good, atol=1e-6)
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
    env = {**os.environ, "CCRK_SHARD_SIZE": str(SHARD), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    env["COLUMNS"] = "300"
    proc = subprocess.Popen(
        _cli(folder, root, tmp_path / "killed.json"), cwd=REPO_ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    written = kill_after_shards(proc, root, "shop/.builds/build-*/shards/shard-*.npz", 2)
    assert 2 <= written < CHANGED // SHARD
    assert current_version(root, "shop") == first.version  # CURRENT untouched
    rerun = subprocess.run(
        _cli(folder, root, tmp_path / "rerun.json"), cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
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
    rows.pop(0)  # a removal: the graph would keep the removed row, so it is rebuilt
    shrunk = build("shop", [_write(manifest.parent, rows)], settings=hnsw)
    assert (shrunk.items_encoded, shrunk.ann_index) == (0, "rebuilt from stored vectors")


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
