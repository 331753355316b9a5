"""Builds on a nearly full filesystem: a small tmpfs holds the index root (mounted here, as root; skipped
where mounting is not allowed). A build that does not fit must fail with a message naming the path and the
space, leave no staged version behind, and keep the published version CURRENT and loadable; the space check
refuses before encoding when the disk is clearly too small. Real ``ccrk index build`` processes: the old
memory-mapped writer died there with SIGBUS, which would take a test process down with it."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest

from ccrk_settings import Settings
from indexer import disk
from indexer.build import add, build
from indexer.errors import DiskSpaceError
from indexer.sources import read_sources
from store.files import NpyWriter, names_full_disk
from store.layout import (
    BUILDS_DIR,
    CURRENT_FILE,
    EMBEDDINGS_FILE,
    INDEX_FILE,
    METADATA_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
)
from store.verify import verify_version
from store.version import versions
from store.version.metadata import write_metadata
from store.version.reader import IndexVersion
from store.version.versions import current_version, list_versions
from tests.conftest import REPO_ROOT
from tests.indexer.files import write_photo

KIB = 1024
MIB = 1024 * KIB
# The CLI with the space check switched off: the estimate says "fits", the disk disagrees (as when another
# writer fills it during the build). Arguments after the code go to `ccrk`.
UNCHECKED = (
    "import runpy, sys\n"
    "import indexer.disk\n"
    "indexer.disk.check_free_space = lambda *args, **kwargs: None\n"
    "sys.argv[0] = 'ccrk'\n"
    "runpy.run_module('ccrk_cli.main', run_name='__main__')\n"
)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """mount(size_bytes) -> a fresh tmpfs of that size; all unmounted at the end."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        target = tmp_path / f"tmpfs{len(mounted)}"
        target.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size // KIB}k", "tmpfs", str(target)],
                capture_output=True,
                text=True,
            )
        except (PermissionError, FileNotFoundError) as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(target)
        return target

    try:
        yield mount
    finally:
        for target in reversed(mounted):
            if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)


def _photos(folder: Path, count: int, first_seed: int = 100) -> Path:
    for i in range(count):
        write_photo(folder / f"{i:03d}.jpg", first_seed + i)
    return folder


def _ccrk(root: Path, folder: Path, *, unchecked: bool = False) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CCRK_SHARD_SIZE": "8",
        "CCRK_KEEP_VERSIONS": "3",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "COLUMNS": "400",  # one line per message: the assertions read paths whole
    }
    start = [sys.executable, "-c", UNCHECKED] if unchecked else [sys.executable, "-m", "ccrk_cli.main"]
    args = ["index", "build", "--name", "shop", "--index-root", str(root), "--threads", "1", "--workers", "0"]
    return subprocess.run(
        [*start, *args, str(folder)], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )


def _published(settings: Settings, photo_folder: Path) -> str:
    report = build("shop", [photo_folder], settings=settings)
    assert report.published
    return report.version or ""


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"KiB": KIB, "MiB": MIB}[unit]


def _leftovers(root: Path) -> list[str]:
    builds = root / "shop" / BUILDS_DIR
    return sorted(p.name for p in builds.iterdir() if p.name != "lock")


def _still_serves(root: Path, version: str, count: int) -> None:
    assert current_version(root, "shop") == version
    assert list_versions(root, "shop") == [version]
    assert verify_version(root, "shop") == []
    with IndexVersion.open(root, "shop") as idx:
        assert len(idx) == count
        q = np.asarray(np.load(idx.path / EMBEDDINGS_FILE, mmap_mode="r")[:1])
        assert idx.search(q, 1)[1][0, 0] == 0


def test_build_that_does_not_fit_fails_cleanly_and_leaves_nothing(
    tmpfs: Callable[[int], Path], settings: Settings, photo_folder: Path, tmp_path: Path
) -> None:
    """Shards fit, the version does not: exit 2 with the path and the space, the staged version and the
    shards removed (leftovers would keep the disk full), CURRENT untouched. After the disk grows the same
    command builds and publishes."""
    mount = tmpfs(int(2.5 * MIB))
    root = mount / "indexes"
    first = _published(settings.model_copy(update={"index_root": root}), photo_folder)
    folder = _photos(tmp_path / "more", 80)  # ~1.4 MiB of shards, then ~1.5 MiB of version: 2.9 > 2.5 - 0.25
    result = _ccrk(root, folder, unchecked=True)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])  # 135 / -7 was SIGBUS
    message = " ".join(result.stderr.split())
    # e.g. "no space left on the device writing .../shop/.builds/<version>/rerank_tokens.npy: this operation
    # needs about 2.5 MiB in .../shop (...), 1.3 MiB is free there now. nothing was published, CURRENT still
    # names <first>; its 1.4 MiB of encoded shards were removed to free the space (a re-run encodes again)"
    written = re.search(
        r"no space left on the device writing (\S+): this operation needs about ([\d.]+) MiB", message
    )
    assert written, message
    assert Path(written[1]).parent.parent == root / "shop" / BUILDS_DIR and written[1].endswith(".npy")
    assert re.search(r"[\d.]+ [KM]iB is free there now\. Nothing was published", message), message
    assert f"CURRENT still names {first}" in message
    assert re.search(r"its [\d.]+ [KM]iB of encoded shards were removed to free the space", message), message
    assert _leftovers(root) == []  # no staged version, no trash, no shards
    _still_serves(root, first, 12)

    subprocess.run(["mount", "-o", "remount,size=8m", str(mount)], check=True)
    again = _ccrk(root, folder)
    assert again.returncode == 0, again.stderr[-3000:]
    assert current_version(root, "shop") != first and _leftovers(root) == []
    with IndexVersion.open(root, "shop") as idx:
        assert len(idx) == 80


def test_space_check_refuses_before_encoding(
    tmpfs: Callable[[int], Path], settings: Settings, photo_folder: Path, tmp_path: Path
) -> None:
    mount = tmpfs(int(2.5 * MIB))
    root = mount / "indexes"
    first = _published(settings.model_copy(update={"index_root": root}), photo_folder)
    free_before = shutil.disk_usage(mount).free
    result = _ccrk(root, _photos(tmp_path / "more", 80))
    assert result.returncode == 2, result.stderr[-3000:]
    message = " ".join(result.stderr.split())
    # "not enough free space in .../shop for the build of 'shop': it needs about 3.9 MiB (encoded shards
    # 1.3 MiB, embeddings 40.1 KiB, re-rank store 1.3 MiB, ..., headroom 1.0 MiB), 2.2 MiB is free there"
    found = re.search(
        r"not enough free space in (\S+) for the build of 'shop': it needs about ([\d.]+ [KM]iB) "
        r"\(encoded shards [\d.]+ MiB, .*re-rank store [\d.]+ MiB, .*\), ([\d.]+ [KM]iB) is free there",
        message,
    )
    assert found, message
    assert Path(found[1]) == root / "shop"
    assert _bytes(found[2]) > 1.2 * MIB + _bytes(found[3])  # clearly too small: shards alone 1.3 MiB
    assert _bytes(found[3]) == pytest.approx(free_before, abs=0.05 * MIB)  # shown to 0.1
    assert f"Nothing was published, CURRENT still names {first}" in message
    assert _leftovers(root) == []  # refused before the first shard: not even an empty work folder
    assert shutil.disk_usage(mount).free == free_before
    _still_serves(root, first, 12)


def test_space_estimate_covers_a_real_version(settings: Settings, tmp_path: Path) -> None:
    """The estimate of a version's files is at least their real size and not far above it."""
    folder = _photos(tmp_path / "photos", 40)
    for dtype in ("fp16", "int8"):
        s = settings.model_copy(update={"rerank_dtype": dtype, "index_root": tmp_path / dtype})
        report = build("shop", [folder], settings=s)
        version = s.index_root / "shop" / (report.version or "")
        real = {p.name: p.stat().st_size for p in version.iterdir()}
        items = read_sources([folder]).items
        parts = disk.version_parts(
            40, 128, 65, 128, dtype, index_bytes=4 * 40 * 128, metadata=disk.metadata_bytes(items, 40)
        )
        rerank = real[RERANK_FILE] + real.get(RERANK_SCALES_FILE, 0)
        assert parts["embeddings"] == real[EMBEDDINGS_FILE]
        assert parts["re-rank store"] == rerank
        assert real[METADATA_FILE] <= parts["metadata"] <= 3 * real[METADATA_FILE]
        assert sum(real.values()) <= disk.SpaceNeed(parts).total
        assert parts["index"] >= real[INDEX_FILE] - 100  # faiss's header; the headroom covers it


def test_writers_name_the_file_on_a_full_disk(tmpfs: Callable[[int], Path]) -> None:
    """Each writer of a version reports ENOSPC as an OSError naming its file, never a SIGBUS or a bare
    sqlite / faiss error; a preallocating array file fails before writing anything."""
    mount = tmpfs(256 * KIB)
    big = mount / "big.npy"
    with pytest.raises(OSError) as caught:
        NpyWriter(big, np.float32, (1000, 128))  # 512 KB
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(big)
    assert big.stat().st_size == 0
    meta = mount / "metadata.sqlite"
    with pytest.raises(OSError) as caught, names_full_disk(meta):
        write_metadata(meta, ((i, f"id-{i}", "x" * 200, {"t": "y" * 100}, False) for i in range(5000)))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(meta)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    meta.unlink()
    index = faiss.IndexFlatIP(128)
    index.add(np.ones((1000, 128), dtype=np.float32))
    with pytest.raises(OSError) as caught, names_full_disk(mount / "index.faiss"):
        faiss.write_index(index, str(mount / "index.faiss"))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(mount / "index.faiss")


def test_failed_publish_removes_the_installed_version(
    settings: Settings, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CURRENT cannot be written (full disk): the version installed a moment before goes again, so nothing
    later takes it for a good version; CURRENT still names the old one."""
    first = _published(settings, photo_folder)
    (photo_folder / "p0.jpg").unlink()  # another build

    def full(root: Path, name: str, version: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as from a write(): no file name

    monkeypatch.setattr(versions, "publish_version", full)
    current_file = settings.index_root / "shop" / CURRENT_FILE
    with pytest.raises(DiskSpaceError, match=f"writing {current_file}: .* CURRENT still names {first}"):
        build("shop", [photo_folder], settings=settings)
    assert list_versions(settings.index_root, "shop") == [first]
    assert current_version(settings.index_root, "shop") == first
    assert _leftovers(settings.index_root) == []  # shards too: a full disk is freed


def test_add_is_refused_before_encoding_when_it_cannot_fit(
    tmpfs: Callable[[int], Path], settings: Settings, photo_folder: Path, tmp_path: Path
) -> None:
    """``add`` copies every parent row into the new version: its estimate counts them, and refuses."""
    mount = tmpfs(int(2.5 * MIB))
    s = settings.model_copy(update={"index_root": mount / "indexes"})
    first = _published(s, photo_folder)
    more = _photos(tmp_path / "more", 80)
    with pytest.raises(
        DiskSpaceError, match=r"for the addition to 'shop': .*encoded shards 1\.3 MiB"
    ) as caught:
        add("shop", [more], settings=s)
    assert f"CURRENT still names {first}" in str(caught.value)
    assert _leftovers(s.index_root) == []
    _still_serves(s.index_root, first, 12)


def test_disk_full_while_encoding_leaves_nothing(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    """The shards themselves do not fit: the shard being written is named; it, its partial temp file and the
    complete shards are removed (the disk is free again)."""
    mount = tmpfs(1 * MIB)
    root = mount / "indexes"
    result = _ccrk(root, _photos(tmp_path / "more", 80), unchecked=True)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    message = " ".join(result.stderr.split())
    builds = root / "shop" / BUILDS_DIR
    shard = re.search(
        rf"no space left on the device writing {builds}/build-\w+/shards/shard-(\d+)\.npz: ", message
    )
    assert shard, message
    assert "Nothing was published, the index has no published version" in message
    assert _leftovers(root) == []
