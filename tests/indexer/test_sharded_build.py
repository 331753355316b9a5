"""Sharded builds with the demo model on the tiny synthetic catalogue: the same answers as the unsharded
build (engine and service), merged ANN recall at the target, verification, ``add`` and ``delete`` touching
only the owning shards, rollback at version level, and ``ccrk index build --shards``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import add, build, delete, rollback
from model.runtime import Encoder
from store.layout import EMBEDDINGS_FILE, INDEX_FILE, MANIFEST_FILE, METADATA_FILE
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from store.verify import verify_version
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.sharding import shard_of
from store.version.versions import current_version
from tests.fixtures import LiveServer, make_settings


def _records(catalogue: Path) -> list[dict]:
    return [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line.strip()]


def _subset(catalogue: Path, out: Path, ids: slice) -> Path:
    lines = []
    for rec in _records(catalogue)[ids]:
        rec["image"] = str(catalogue / rec["image"])
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return out


def _ids(index: ShardedIndex | IndexVersion, rows: np.ndarray) -> list[list[str]]:
    return [[item["id"] for item in index.items([int(r) for r in row if r >= 0])] for row in rows]


def test_a_sharded_build_answers_as_the_unsharded_one(
    settings: Settings, catalogue: Path, encoder: Encoder, tmp_path: Path
) -> None:
    root, source = settings.index_root, [catalogue / "test.jsonl"]
    plain = build("plain", source, settings=settings)
    report = build("sharded", source, settings=settings.model_copy(update={"index_shards": 3}))
    assert report.published and report.count == plain.count == 40 and report.index_shards == 3
    assert report.index_factory == "Flat" and len(report.search_params["per_shard"]) == 3
    assert verify_version(root, "sharded", model_dir=DEFAULT_MODEL_DIR) == []
    recs = _records(catalogue)
    queries = encoder.encode_text([r["captions"][lang][0] for r in recs[:12] for lang in ("en", "ja")]).embeds
    with open_version(root, "plain") as one, open_version(root, "sharded") as sharded:
        assert isinstance(sharded, ShardedIndex) and isinstance(one, IndexVersion)
        m = sharded.manifest
        assert m.format_version == 2 and m.count == 40 and m.parent_version is None
        assert m.measured_recall_at_10 == 1.0 and m.sharding["merged_recall_at_10"] == 1.0
        assert m.language_recall_at_10 == pytest.approx(one.manifest.language_recall_at_10, abs=1e-4)
        assert m.match_calibration and m.build_params["tuning_queries"] == "captions"
        for k in (1, 10):
            assert _ids(sharded, sharded.search_exact(queries, k)[1]) == _ids(
                one, one.search_exact(queries, k)[1]
            )
            assert _ids(sharded, sharded.search(queries, k)[1]) == _ids(one, one.search(queries, k)[1])
        # Each shard is an ordinary version holding the items the rule gives it.
        for s, entry in enumerate(m.sharding["shards"]):
            folder = sharded.path / entry["dir"]
            shard_manifest = IndexManifest.load(folder / MANIFEST_FILE)
            assert shard_manifest.build_params["shard"] == {"index": s, "of": 3}
            with IndexVersion(folder, shard_manifest) as alone:
                ids = [item["id"] for item in alone.items(range(alone.total_rows))]
                assert ids and all(shard_of(i, 3) == s for i in ids) and len(alone) == entry["count"]
    # The service serves the sharded version with the answers of the unsharded one.
    texts = [recs[0]["captions"]["en"][0], recs[5]["captions"]["de"][0], recs[9]["captions"]["ja"][0]]
    answers = {}
    for name in ("plain", "sharded"):
        with LiveServer(make_settings(root, index_name=name)) as live, live.client() as client:
            info = client.get("/v1/index").json()
            assert info["version"] == current_version(root, name) and info["count"] == 40
            answers[name] = []
            for text in texts:
                for body in ({"query": text, "top_k": 10}, {"query": text, "top_k": 5, "rerank": True}):
                    response = client.post("/v1/search", json=body)
                    assert response.status_code == 200, response.text
                    answers[name].append([hit["id"] for hit in response.json()["results"]])
            filtered = {
                "query": texts[0],
                "top_k": 5,
                "filters": {"category": recs[0]["attributes"]["category"]},
            }
            response = client.post("/v1/search", json=filtered)
            answers[name].append([hit["id"] for hit in response.json()["results"]])
            assert client.get(f"/v1/images/{recs[3]['id']}").status_code == 200
    assert answers["sharded"] == answers["plain"] and all(answers["plain"])


def _inodes(folder: Path) -> dict[str, int]:
    return {name: os.stat(folder / name).st_ino for name in (INDEX_FILE, EMBEDDINGS_FILE, METADATA_FILE)}


def test_ann_shards_add_and_delete_touch_only_owning_shards(
    settings: Settings, catalogue: Path, encoder: Encoder, tmp_path: Path
) -> None:
    root = settings.index_root
    sharded = settings.model_copy(update={"index_shards": 4, "exact_max_items": 4, "target_recall": 0.95})
    first = build("shop", [_subset(catalogue, tmp_path / "a.jsonl", slice(0, 36))], settings=sharded)
    recs = _records(catalogue)
    queries = encoder.encode_text([r["captions"]["en"][0] for r in recs[:36]]).embeds
    with open_version(root, "shop") as index:
        assert isinstance(index, ShardedIndex)
        assert {s.index_kind for s in index.shards} == {"hnsw"}
        assert index.manifest.measured_recall_at_10 >= sharded.target_recall
        exact = index.search_exact(queries, 10)[1]
        ann = index.search(queries, 10)[1]
        recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(ann, exact, strict=True)])
        assert recall >= sharded.target_recall
        before = {s: _inodes(shard.path) for s, shard in enumerate(index.shards)}

    # add: only the shards owning new items get new files; the others are the parent's, hard-linked.
    owners = {shard_of(r["id"], 4) for r in recs[36:]}
    assert owners != {0, 1, 2, 3}  # the test needs an untouched shard
    added = add("shop", [_subset(catalogue, tmp_path / "all.jsonl", slice(0, 40))], settings=sharded)
    assert added.published and added.items_indexed == 4 and added.count == 40
    assert verify_version(root, "shop", model_dir=DEFAULT_MODEL_DIR) == []
    with open_version(root, "shop") as index:
        assert isinstance(index, ShardedIndex) and index.manifest.parent_version == first.version
        for s, shard in enumerate(index.shards):
            now = _inodes(shard.path)
            if s in owners:
                assert all(now[f] != before[s][f] for f in now), s
                assert shard.manifest.parent_version == first.version
            else:
                assert now == before[s] and shard.manifest.version == first.version
        assert index.row_of(recs[38]["id"]) is not None and index.manifest.measured_recall_at_10 >= 0.95
        middle = {s: _inodes(shard.path) for s, shard in enumerate(index.shards)}

    # delete: only the owning shards' metadata is written again.
    gone = [recs[3]["id"], recs[9]["id"]]
    doomed = {shard_of(i, 4) for i in gone}
    deleted = delete("shop", gone, settings=sharded)
    assert deleted.count == 38 and deleted.items_indexed == 2
    assert verify_version(root, "shop") == []
    with open_version(root, "shop") as index:
        assert isinstance(index, ShardedIndex) and len(index) == 38
        assert all(index.row_of(i) is None for i in gone)
        assert not set(gone) & {i for row in _ids(index, index.search(queries, 38)[1]) for i in row}
        for s, shard in enumerate(index.shards):
            now = _inodes(shard.path)
            if s in doomed:
                assert now[METADATA_FILE] != middle[s][METADATA_FILE]
                assert (now[INDEX_FILE], now[EMBEDDINGS_FILE]) == (
                    middle[s][INDEX_FILE],
                    middle[s][EMBEDDINGS_FILE],
                )
            else:
                assert now == middle[s]
    # rollback works on whole versions.
    back = rollback("shop", settings=sharded)
    assert back.version == added.version == current_version(root, "shop")
    with open_version(root, "shop") as index:
        assert len(index) == 40


def test_the_shards_option_of_ccrk_index_build(tmp_path: Path, photo_folder: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "250"})  # tables wide enough not to wrap their cells
    common = ["--name", "photos", "--index-root", str(tmp_path / "idx")]
    result = runner.invoke(
        app,
        ["index", "build", *common, "--threads", "1", "--workers", "0", "--shards", "2", str(photo_folder)],
    )
    assert result.exit_code == 0, result.output
    assert "2 shards" in result.output and "(published)" in result.output
    result = runner.invoke(app, ["index", "list", *common])
    assert result.exit_code == 0 and "2 shards" in result.output
    result = runner.invoke(app, ["index", "verify", *common])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["index", "build", *common, "--shards", "0", str(photo_folder)])
    assert result.exit_code == 2 and "--shards" in result.output
