"""The shared on-disk format: publishing, opening, ANN vs exact search, filters, deletions, model checks.

Versions are written here with faiss and numpy directly (not the builder), so these tests pin the format
itself; exact search is checked against a numpy brute force and ANN against exact search."""

from __future__ import annotations

import json
import os
from pathlib import Path

import faiss
import numpy as np
import pytest

from indexer import index_format as fmt
from indexer.index_format import (
    FilterError,
    IndexFormatError,
    IndexManifest,
    IndexNotFoundError,
    IndexVersion,
    ModelMismatchError,
)

D = 16
T, W = 5, 8
CATEGORIES = ("shoe", "bag", "hat", "scarf")


def _vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Clustered, like real embeddings (uniform random vectors make every ANN index look bad).
    centres = rng.normal(size=(20, D))
    x = centres[rng.integers(0, 20, n)] + 0.4 * rng.normal(size=(n, D))
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_version(
    root: Path,
    name: str,
    *,
    n: int = 300,
    factory: str = "Flat",
    search_params: dict | None = None,
    deleted: set[int] | frozenset[int] = frozenset(),
    int8: bool = False,
    seed: int = 0,
    fingerprint: str = "f" * 64,
    publish: bool = True,
    gate: bool | None = None,
) -> str:
    """One version written with faiss and numpy; ``gate`` records a quality-gate verdict in the manifest as
    the builder does (False: refused, and then normally not published)."""
    embeds = _vectors(n, seed)
    version = fmt.new_version_name(root, name)
    stage = root / name / fmt.BUILDS_DIR / version
    stage.mkdir(parents=True)
    index = faiss.index_factory(D, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(embeds)
    index.add(embeds)
    faiss.write_index(index, str(stage / fmt.INDEX_FILE))
    np.save(stage / fmt.EMBEDDINGS_FILE, embeds)
    tokens = np.random.default_rng(seed + 1).normal(size=(n, T, W)).astype(np.float32)
    if int8:
        scales = np.abs(tokens).max(axis=2) / 127.0
        np.save(stage / fmt.RERANK_FILE, np.round(tokens / scales[..., None]).astype(np.int8))
        np.save(stage / fmt.RERANK_SCALES_FILE, scales.astype(np.float32))
    else:
        np.save(stage / fmt.RERANK_FILE, tokens.astype(np.float16))
    fmt.write_metadata(
        stage / fmt.METADATA_FILE,
        (
            (i, f"sku-{i}", f"img/{i}.jpg", {"category": CATEGORIES[i % 4], "price": float(i)}, i in deleted)
            for i in range(n)
        ),
    )
    manifest = IndexManifest(
        format_version=fmt.FORMAT_VERSION,
        name=name,
        version=version,
        created_at="2026-11-22T00:00:00Z",
        model_name="test-model",
        model_fingerprint=fingerprint,
        embed_dim=D,
        preprocessing={"image_size": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
        count=n - len(deleted),
        index_factory=factory,
        search_params=search_params or {},
        measured_recall_at_10=None,
        language_recall_at_10={},
        build_seconds=0.0,
        skipped=[],
        checksums=fmt.file_checksums(stage),
        rerank={"dtype": "int8" if int8 else "fp16", "tokens": T, "width": W, "bytes_per_image": 0},
        parent_version=None,
        total_rows=n,
        build_params={} if gate is None else {"quality_gate": {"passed": gate, "reasons": ["test verdict"]}},
    )
    manifest.save(stage / fmt.MANIFEST_FILE)
    fmt.install_version(root, name, stage, version)
    if publish:
        fmt.publish_version(root, name, version)
    return version


def brute_force(embeds: np.ndarray, q: np.ndarray, k: int, live: np.ndarray) -> np.ndarray:
    scores = q @ embeds.T
    scores[:, ~live] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def test_publish_is_atomic_and_open_follows_current(tmp_path: Path) -> None:
    v1 = write_version(tmp_path, "shop", seed=0)
    v2 = write_version(tmp_path, "shop", seed=1)
    assert v1 < v2 and fmt.list_versions(tmp_path, "shop") == [v1, v2]
    assert fmt.current_version(tmp_path, "shop") == v2
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert idx.manifest.version == v2 and idx.path == tmp_path / "shop" / v2
    with IndexVersion.open(tmp_path, "shop", v1) as idx:
        assert idx.manifest.version == v1
    # Publishing a version that does not exist leaves CURRENT untouched and no temp file behind.
    with pytest.raises(IndexNotFoundError):
        fmt.publish_version(tmp_path, "shop", "20990101T000000Z-abcdef")
    assert fmt.current_version(tmp_path, "shop") == v2
    fmt.publish_version(tmp_path, "shop", v1)
    assert (tmp_path / "shop" / "CURRENT").read_text().strip() == v1
    assert [p.name for p in (tmp_path / "shop").iterdir() if p.name.endswith(".tmp")] == []


def test_missing_index_and_version_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="no published version"):
        IndexVersion.open(tmp_path, "nothing")
    write_version(tmp_path, "shop")
    with pytest.raises(IndexNotFoundError, match="no version"):
        IndexVersion.open(tmp_path, "shop", "20990101T000000Z-abcdef")


def test_prune_keeps_newest_and_current(tmp_path: Path) -> None:
    versions = [write_version(tmp_path, "shop", seed=s) for s in range(4)]
    fmt.publish_version(tmp_path, "shop", versions[0])  # rolled back to the oldest
    deleted = fmt.prune_versions(tmp_path, "shop", keep=2)
    assert deleted == [versions[1]]
    assert fmt.list_versions(tmp_path, "shop") == [versions[0], versions[2], versions[3]]


def test_refused_by_gate_reads_the_builders_verdict(tmp_path: Path) -> None:
    plain = write_version(tmp_path, "shop", n=20)  # gate off
    passed = write_version(tmp_path, "shop", n=20, gate=True)
    refused = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    versions = (plain, passed, refused)
    assert [fmt.version_refused(tmp_path, "shop", v) for v in versions] == [False, False, True]
    assert [fmt.version_approved(tmp_path, "shop", v) for v in versions] == [True, True, False]
    manifest = IndexManifest.load(tmp_path / "shop" / refused / fmt.MANIFEST_FILE)
    assert fmt.refused_by_gate(manifest) and fmt.list_versions(tmp_path, "shop") == [plain, passed, refused]
    # An unreadable manifest: a typed error when asked directly, never counted as approved.
    (tmp_path / "shop" / passed / fmt.MANIFEST_FILE).write_text("{broken", encoding="utf-8")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        fmt.version_refused(tmp_path, "shop", passed)
    assert not fmt.version_approved(tmp_path, "shop", passed)


def test_prune_counts_refused_versions_apart(tmp_path: Path) -> None:
    """keep=2: the newest two approved versions and the newest two refused ones stay, counted apart (the
    old rule, newest two of all, would have kept r3 and g4 only and deleted g3, the last good fallback)."""
    g1, g2 = (write_version(tmp_path, "shop", n=20, seed=s) for s in (0, 1))
    r1 = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    g3 = write_version(tmp_path, "shop", n=20, gate=True)
    r2, r3 = (write_version(tmp_path, "shop", n=20, gate=False, publish=False) for _ in range(2))
    g4 = write_version(tmp_path, "shop", n=20, gate=True)
    assert fmt.current_version(tmp_path, "shop") == g4
    assert fmt.prune_versions(tmp_path, "shop", keep=2) == [g1, g2, r1]
    assert fmt.list_versions(tmp_path, "shop") == [g3, r2, r3, g4]

    # CURRENT is never deleted, even a refused version published by force, and counts in neither quota.
    fmt.publish_version(tmp_path, "shop", r2)
    r4 = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    assert fmt.prune_versions(tmp_path, "shop", keep=2) == []
    assert fmt.list_versions(tmp_path, "shop") == [g3, r2, r3, g4, r4]
    fmt.publish_version(tmp_path, "shop", g4)
    assert fmt.prune_versions(tmp_path, "shop", keep=2) == [r2]

    # A version whose manifest cannot be read is pruned with the refused ones, never kept over a good one:
    # rolled back to a1, keep=1 keeps a2 (the newest good) besides CURRENT, not the newer unreadable x.
    a1, a2, x, y = (write_version(tmp_path, "b", n=20, gate=True) for _ in range(4))
    for broken in (x, y):
        (tmp_path / "b" / broken / fmt.MANIFEST_FILE).write_text("{broken", encoding="utf-8")
    fmt.publish_version(tmp_path, "b", a1)
    assert fmt.prune_versions(tmp_path, "b", keep=1) == [x]
    assert fmt.list_versions(tmp_path, "b") == [a1, a2, y]


@pytest.mark.parametrize(
    ("factory", "params"),
    [
        ("Flat", {}),
        ("HNSW16,Flat", {"efSearch": 64}),
        ("IVF16,PQ4x8", {"nprobe": 8, "rescore_factor": 10}),
    ],
)
def test_search_exact_is_brute_force_and_ann_reaches_recall(
    tmp_path: Path, factory: str, params: dict
) -> None:
    n, k = 2000, 10
    write_version(tmp_path, "shop", n=n, factory=factory, search_params=params, deleted={3, 7, 11})
    embeds = _vectors(n, 0)
    queries = _vectors(50, 99)
    live = np.ones(n, dtype=bool)
    live[[3, 7, 11]] = False
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert len(idx) == n - 3 and idx.total_rows == n
        ex_s, ex_r = idx.search_exact(queries, k)
        np.testing.assert_array_equal(ex_r, brute_force(embeds, queries, k, live))
        np.testing.assert_allclose(
            ex_s, np.take_along_axis(queries @ embeds.T, ex_r, 1), rtol=1e-5, atol=1e-6
        )
        s, r = idx.search(queries, k)
        assert s.shape == (50, k) and r.dtype == np.int64
        assert not np.isin(r, [3, 7, 11]).any()
        recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(r, ex_r, strict=True)])
        assert recall >= 0.9, recall
        # Scores returned are the true inner products (exact re-scoring for PQ), sorted descending.
        np.testing.assert_allclose(s, np.take_along_axis(queries @ embeds.T, r, 1), rtol=1e-4, atol=1e-5)
        assert (np.diff(s, axis=1) <= 1e-6).all()


def test_padding_when_fewer_rows_than_k(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", n=5)
    with IndexVersion.open(tmp_path, "shop") as idx:
        s, r = idx.search(_vectors(2, 5), 8)
        assert (r[:, :5] >= 0).all() and (r[:, 5:] == -1).all() and np.isneginf(s[:, 5:]).all()
        with pytest.raises(IndexFormatError, match="queries must be"):
            idx.search(np.zeros((1, D + 1), np.float32), 3)


def test_filters_and_filtered_search(tmp_path: Path) -> None:
    n = 2000
    write_version(tmp_path, "shop", n=n, factory="HNSW16,Flat", search_params={"efSearch": 32}, deleted={0})
    embeds = _vectors(n, 0)
    queries = _vectors(20, 7)
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert idx.fields == {"category", "price"}
        shoes = idx.filter_rows({"category": "shoe"})
        np.testing.assert_array_equal(shoes, np.arange(4, n, 4))  # row 0 is deleted
        np.testing.assert_array_equal(
            idx.filter_rows({"category": ["bag", "hat"]}), [i for i in range(n) if i % 4 in (1, 2)]
        )
        np.testing.assert_array_equal(idx.filter_rows({"price": {"gte": 10, "lt": 14}}), [10, 11, 12, 13])
        np.testing.assert_array_equal(idx.filter_rows({"category": "shoe", "price": {"lte": 12}}), [4, 8, 12])
        with pytest.raises(FilterError, match="'colour'"):
            idx.filter_rows({"colour": "red"})
        with pytest.raises(FilterError, match="'price'"):
            idx.filter_rows({"price": {"gte": "cheap"}})
        live = np.zeros(n, dtype=bool)
        live[shoes] = True
        want = brute_force(embeds, queries, 10, live)
        # Few allowed rows: exact over them. Many: the faiss selector path (threshold lowered here).
        for threshold in (fmt.EXACT_FILTER_MAX, 10):
            idx.exact_filter_max = threshold
            _s, r = idx.search(queries, 10, allowed_rows=shoes)
            assert np.isin(r, shoes).all()
            recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r, want, strict=True)])
            assert recall >= (1.0 if threshold > len(shoes) else 0.9)
        # A filter narrower than k still returns every allowed row, then padding.
        _s, r = idx.search(queries[:1], 10, allowed_rows=np.array([8, 12, 0]))  # 0 is deleted
        assert sorted(r[0, :2].tolist()) == [8, 12] and (r[0, 2:] == -1).all()


def test_deleted_rows_and_items(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", n=50, deleted={5})
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert idx.row_of("sku-4") == 4 and idx.row_of("sku-5") is None and idx.row_of("nope") is None
        assert idx.items([7, 4]) == [
            {"id": "sku-7", "path": "img/7.jpg", "category": "scarf", "price": 7.0},
            {"id": "sku-4", "path": "img/4.jpg", "category": "shoe", "price": 4.0},
        ]
        with pytest.raises(IndexFormatError, match="unknown rows"):
            idx.items([999])
        emb = np.load(idx.path / fmt.EMBEDDINGS_FILE)
        _, r = idx.search(emb[5:6], 50)
        assert 5 not in r[0] and (r[0, :49] >= 0).all() and r[0, 49] == -1


@pytest.mark.parametrize("int8", [False, True])
def test_rerank_tokens_round_trip(tmp_path: Path, int8: bool) -> None:
    write_version(tmp_path, "shop", n=20, int8=int8, seed=3)
    tokens = np.random.default_rng(4).normal(size=(20, T, W)).astype(np.float32)
    with IndexVersion.open(tmp_path, "shop") as idx:
        got = idx.rerank_tokens(np.array([3, 0, 19]))
        assert got.dtype == np.float32 and got.shape == (3, T, W)
        # fp16 keeps ~3 digits; int8 with a per-vector scale is within half a step of that vector's max/127.
        tol = np.abs(tokens[[3, 0, 19]]).max(axis=2, keepdims=True) / 254 + 1e-6 if int8 else 2e-3
        assert (np.abs(got - tokens[[3, 0, 19]]) <= tol).all()


def _vm_flags(path: Path) -> list[str]:
    """VmFlags of this process's mappings of ``path`` (/proc/self/smaps)."""
    flags, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line and line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            current = line.split()[-1] if len(line.split()) >= 6 else None
        elif line.startswith("VmFlags:") and current == str(path.resolve()):
            flags.append(line)
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
@pytest.mark.parametrize("int8", [False, True])
def test_rerank_store_mapped_for_random_reads(tmp_path: Path, int8: bool) -> None:
    """The re-rank store (and int8 scales) carry the random-read advice ("rr"): no readahead around each
    of the scattered rows a re-rank reads. The embeddings, scanned in order by exact search, keep it."""
    version = write_version(tmp_path, "shop", n=20, int8=int8, seed=3)
    folder = tmp_path / "shop" / version
    with IndexVersion.open(tmp_path, "shop"):
        stores = [folder / fmt.RERANK_FILE] + ([folder / fmt.RERANK_SCALES_FILE] if int8 else [])
        for store in stores:
            flags = _vm_flags(store)
            assert flags and all(" rr" in f for f in flags), (store.name, flags)
        embeddings = _vm_flags(folder / fmt.EMBEDDINGS_FILE)
        assert all(" rr" not in f for f in embeddings)


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
    first = fmt.model_fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights-2")
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
    assert fmt.model_fingerprint(tmp_path) != first and len(first) == 64


def test_manifest_round_trip_and_future_format(tmp_path: Path) -> None:
    write_version(tmp_path, "shop")
    version = fmt.current_version(tmp_path, "shop")
    path = tmp_path / "shop" / version / fmt.MANIFEST_FILE
    manifest = IndexManifest.load(path)
    assert IndexManifest.from_json(manifest.to_json()) == manifest
    data = json.loads(path.read_text())
    data["format_version"] = fmt.FORMAT_VERSION + 1
    with pytest.raises(IndexFormatError, match="not supported"):
        IndexManifest.from_json(json.dumps(data))
    del data["embed_dim"]
    data["format_version"] = fmt.FORMAT_VERSION
    with pytest.raises(IndexFormatError, match="embed_dim"):
        IndexManifest.from_json(json.dumps(data))


def test_verify_finds_corruption(tmp_path: Path) -> None:
    version = write_version(tmp_path, "shop", n=30)
    assert fmt.verify_version(tmp_path, "shop") == []
    emb_path = tmp_path / "shop" / version / fmt.EMBEDDINGS_FILE
    data = bytearray(emb_path.read_bytes())
    data[-1] ^= 0xFF
    emb_path.write_bytes(bytes(data))
    assert fmt.verify_version(tmp_path, "shop") == ["embeddings.npy: checksum mismatch"]


def test_topk_merge_equals_a_full_sort_with_ties_and_padding() -> None:
    """The partial selection must give exactly what sorting every candidate gives (ties by lower row)."""
    from indexer.index_format import _topk_merge

    rng = np.random.default_rng(0)
    for _ in range(200):
        q, m, k = int(rng.integers(1, 5)), int(rng.integers(1, 300)), int(rng.integers(1, 40))
        scores = np.round(rng.normal(size=(q, m)), 1).astype(np.float32)  # one decimal: many ties
        rows = np.repeat(rng.permutation(1000)[:m][None], q, axis=0).astype(np.int64)
        rows[:, : m // 5], scores[:, : m // 5] = -1, -np.inf  # padding, as faiss returns it
        best_s, best_r = np.full((q, k), -np.inf, np.float32), np.full((q, k), -1, np.int64)
        all_s, all_r = np.concatenate([best_s, scores], 1), np.concatenate([best_r, rows], 1)
        order = np.lexsort((np.where(all_r < 0, np.iinfo(np.int64).max, all_r), -all_s), axis=-1)[:, :k]
        got_s, got_r = _topk_merge(best_s, best_r, scores, rows, k)
        assert np.array_equal(got_s, np.take_along_axis(all_s, order, 1))
        assert np.array_equal(got_r, np.take_along_axis(all_r, order, 1))
