"""The query engine on versions written through the store's writer: opening, ANN vs exact search, filtered
search, deletions, items, and the re-rank store (round trip and random-read mapping)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from store.errors import FilterError, IndexFormatError, IndexNotFoundError
from store.layout import EMBEDDINGS_FILE, RERANK_FILE, RERANK_SCALES_FILE
from store.version.reader import EXACT_FILTER_MAX, IndexVersion, SearchableIndex
from tests.store.writing import D, T, W, brute_force, vectors, write_version


def test_missing_index_and_version_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="no published version"):
        IndexVersion.open(tmp_path, "nothing")
    write_version(tmp_path, "shop")
    with pytest.raises(IndexNotFoundError, match="no version"):
        IndexVersion.open(tmp_path, "shop", "20990101T000000Z-abcdef")


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
    embeds = vectors(n, 0)
    queries = vectors(50, 99)
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
        s, r = idx.search(vectors(2, 5), 8)
        assert (r[:, :5] >= 0).all() and (r[:, 5:] == -1).all() and np.isneginf(s[:, 5:]).all()
        with pytest.raises(IndexFormatError, match="queries must be"):
            idx.search(np.zeros((1, D + 1), np.float32), 3)


def test_filters_and_filtered_search(tmp_path: Path) -> None:
    n = 2000
    write_version(tmp_path, "shop", n=n, factory="HNSW16,Flat", search_params={"efSearch": 32}, deleted={0})
    embeds = vectors(n, 0)
    queries = vectors(20, 7)
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
        for threshold in (EXACT_FILTER_MAX, 10):
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
        emb = np.load(idx.path / EMBEDDINGS_FILE)
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
        stores = [folder / RERANK_FILE] + ([folder / RERANK_SCALES_FILE] if int8 else [])
        for store in stores:
            flags = _vm_flags(store)
            assert flags and all(" rr" in f for f in flags), (store.name, flags)
        embeddings = _vm_flags(folder / EMBEDDINGS_FILE)
        assert all(" rr" not in f for f in embeddings)


def test_an_opened_version_is_a_searchable_index(tmp_path: Path) -> None:
    """IndexVersion offers the whole surface the service searches through (a sharded index will too), and
    the row counts verification compares."""
    write_version(tmp_path, "shop", n=30, deleted={2})
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert isinstance(idx, SearchableIndex)
        assert idx.version == idx.manifest.version and len(idx) == 29
        assert idx.rerank_rows == idx.metadata_rows == idx.total_rows == 30


@pytest.mark.parametrize(
    ("factory", "params"),
    [
        ("Flat", {"rescore_factor": float("inf")}),
        ("HNSW16,Flat", {"efSearch": [64]}),
        ("Flat", {"rescore_factor": "x"}),
    ],
)
def test_unusable_search_params_are_a_format_error(tmp_path: Path, factory: str, params: dict) -> None:
    """A hand-edited manifest's search parameter that no int holds (Infinity, a list, a word) is a format
    error naming them: OverflowError and TypeError escaped the open, a 500 at the admin route and a reopen
    at every poll."""
    write_version(tmp_path, "shop", n=64, factory=factory, search_params=params)
    with pytest.raises(IndexFormatError, match="unusable search_params"):
        IndexVersion.open(tmp_path, "shop")
