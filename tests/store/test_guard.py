"""A version's files changed in place (``store.guard``): refused at open when their sizes do not add up; while
served, a truncation is held by the kernel until the version is closed (a read lease) and named meanwhile, or,
without a lease, named by its changed size; a version that failed to open holds nothing back."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import store.guard
from store.errors import IndexFormatError
from store.guard import FileGuard
from store.layout import EMBEDDINGS_FILE, RERANK_FILE, index_dir
from store.opening import open_version
from store.products.channels import TEXT_EMBEDDINGS, ProductChannels
from store.version.reader import IndexVersion
from store.version.versions import current_version
from tests.store.test_products import make_channels
from tests.store.writing import vectors, write_rows, write_version


def folder_of(root: Path, name: str) -> Path:
    version = current_version(root, name)
    assert version is not None
    return index_dir(root, name) / version


def truncating(path: Path, size: int) -> threading.Thread:
    """``os.truncate`` in a thread of its own: held by the kernel while a lease is on the file."""
    thread = threading.Thread(target=os.truncate, args=(path, size), daemon=True)
    thread.start()
    return thread


def until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.01)


@pytest.fixture
def no_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a file system without leases, or files another user owns: sizes are compared instead."""
    monkeypatch.setattr(store.guard, "_take_lease", lambda fd: False)


@pytest.mark.parametrize("damaged", [EMBEDDINGS_FILE, RERANK_FILE])
def test_an_array_truncated_before_the_open_is_refused_naming_it(tmp_path: Path, damaged: str) -> None:
    write_version(tmp_path, "shop", n=50)
    path = folder_of(tmp_path, "shop") / damaged
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(IndexFormatError, match=rf"{damaged} is \d+ bytes, its header says .*truncated"):
        IndexVersion.open(tmp_path, "shop")
    # Nothing of the failed open holds the files: a truncation of another of them goes on at once.
    other = folder_of(tmp_path, "shop") / (RERANK_FILE if damaged == EMBEDDINGS_FILE else EMBEDDINGS_FILE)
    thread = truncating(other, 0)
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_truncation_of_an_open_version_waits_for_its_close_and_is_named_meanwhile(tmp_path: Path) -> None:
    write_version(tmp_path, "shop", n=300)
    version = IndexVersion.open(tmp_path, "shop")
    if not version._guard.leased:
        pytest.skip("this file system grants no leases (the size check is tested below)")
    q = vectors(3, seed=5)
    before = version.search_exact(q, 10)
    assert version.damage() is None
    path = version.path / EMBEDDINGS_FILE
    thread = truncating(path, 128)
    until(lambda: version.damage() is not None)
    problem = version.damage()
    assert problem is not None and problem.startswith(f"{EMBEDDINGS_FILE} is being truncated")
    time.sleep(0.2)
    assert thread.is_alive()  # held by the kernel: the mapped pages are all still there
    again = version.search_exact(q, 10)
    assert np.array_equal(again[1], before[1])
    version.close()  # gives the lease back: the truncation goes on
    thread.join(timeout=10)
    assert not thread.is_alive() and path.stat().st_size == 128


def test_without_a_lease_a_size_changed_in_place_is_named(tmp_path: Path, no_leases: None) -> None:
    write_version(tmp_path, "shop", n=300)
    with IndexVersion.open(tmp_path, "shop") as version:
        assert len(version._guard) >= 3 and version._guard.leased == 0
        assert version.damage() is None
        path = version.path / RERANK_FILE
        size = path.stat().st_size
        os.truncate(path, 1000)  # not held: the mapping must not be read any more
        problem = version.damage()
        assert problem == f"{RERANK_FILE} is 1000 bytes, {size} at the open: changed in place ({path})"


def test_the_product_channels_and_the_shards_are_guarded(tmp_path: Path, no_leases: None) -> None:
    (tmp_path / "channels").mkdir()
    channels, *_ = make_channels(tmp_path / "channels")
    assert channels.damage() is None
    os.truncate(tmp_path / "channels" / TEXT_EMBEDDINGS, 200)
    assert TEXT_EMBEDDINGS in (channels.damage() or "")
    channels.close()
    with pytest.raises(IndexFormatError, match=TEXT_EMBEDDINGS):
        ProductChannels(tmp_path / "channels", 4)

    embeds = vectors(200, seed=2)
    write_rows(tmp_path, "sharded", embeds, [f"sku-{i}" for i in range(200)], shard_count=3)
    with open_version(tmp_path, "sharded") as sharded:
        assert sharded.damage() is None
        shard = sharded.shards[2].path / EMBEDDINGS_FILE
        os.truncate(shard, 300)
        assert str(shard) in (sharded.damage() or "")


def test_an_array_whose_size_fits_its_header_maps_as_np_load_does(tmp_path: Path) -> None:
    arrays = {
        "c.npy": np.arange(24, dtype=np.float16).reshape(2, 3, 4),
        "f.npy": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
        "empty.npy": np.zeros((0, 7), np.float32),
    }
    guard = FileGuard()
    for name, array in arrays.items():
        np.save(tmp_path / name, array)
        mapped = guard.map_array(tmp_path / name)
        assert mapped.dtype == array.dtype and mapped.shape == array.shape
        assert np.array_equal(mapped, np.load(tmp_path / name))
    assert guard.problem() is None
    guard.close()
