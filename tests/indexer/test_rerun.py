"""Re-running a full build whose result is CURRENT already publishes nothing: after a real ``kill -9`` just
after publishing, and in process; a changed image file or a delete since makes it a real build again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ccrk_settings import Settings
from indexer.build import build, delete
from indexer.build_key import BUILD_KEY, CONTENT_KEY, PLAN_HASH, RACY_KEY
from store.layout import BUILDS_DIR, MANIFEST_FILE
from store.version.manifest import IndexManifest
from store.version.versions import current_version, list_versions
from tests.conftest import REPO_ROOT
from tests.indexer.files import write_photo

# `ccrk` with publish_version replaced: the real one, then SIGKILL, i.e. killed after CURRENT switched but
# before pruning and removing the work folder. Arguments after the code go to `ccrk`.
KILLED_AFTER_PUBLISH = (
    "import os, runpy, signal, sys\n"
    "from store.version import versions\n"
    "publish = versions.publish_version\n"
    "def publish_then_die(*args):\n"
    "    publish(*args)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "versions.publish_version = publish_then_die\n"
    "sys.argv[0] = 'ccrk'\n"
    "runpy.run_module('ccrk_cli.main', run_name='__main__')\n"
)


def _photos(folder: Path, count: int, first_seed: int) -> Path:
    for i in range(count):
        write_photo(folder / f"{i:03d}.jpg", first_seed + i)
    return folder


def _ccrk(code: list[str], root: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CCRK_SHARD_SIZE": "4",
        "CCRK_KEEP_VERSIONS": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "COLUMNS": "300",
    }
    args = ["index", "build", "--name", "shop", "--index-root", str(root), "--threads", "1", "--workers", "0"]
    return subprocess.run(
        [sys.executable, *code, *args, str(folder)], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )


def test_rerun_after_kill_just_after_publishing_publishes_nothing(settings: Settings, tmp_path: Path) -> None:
    keep2 = settings.model_copy(update={"keep_versions": 2, "shard_size": 4})
    root = keep2.index_root
    older = build("shop", [_photos(tmp_path / "a", 6, 0)], settings=keep2).version
    old = build("shop", [_photos(tmp_path / "b", 7, 50)], settings=keep2).version
    folder = _photos(tmp_path / "c", 8, 100)
    killed = _ccrk(["-c", KILLED_AFTER_PUBLISH], root, folder)
    assert killed.returncode == -9, killed.stderr[-2000:]
    new = current_version(root, "shop")
    assert new not in (older, old) and list_versions(root, "shop") == [older, old, new]  # not pruned yet
    assert list((root / "shop" / BUILDS_DIR).glob("build-*/shards/shard-*.npz"))  # not cleaned up yet

    rerun = _ccrk(["-m", "ccrk_cli.main"], root, folder)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    out = " ".join(rerun.stdout.split())
    assert f"{new} (already CURRENT: nothing built or published)" in out
    assert f"note: already published as {new}" in out
    # Nothing published, nothing pruned (a duplicate used to push `old` out); the killed run's work folder
    # is gone.
    assert current_version(root, "shop") == new
    assert list_versions(root, "shop") == [older, old, new]
    assert list((root / "shop" / BUILDS_DIR).glob("build-*")) == []


def test_rerun_in_process_and_what_makes_it_a_new_build(settings: Settings, tmp_path: Path) -> None:
    keep2 = settings.model_copy(update={"keep_versions": 2})
    root = keep2.index_root
    first = build("shop", [_photos(tmp_path / "a", 6, 0)], settings=keep2)
    folder = _photos(tmp_path / "b", 9, 50)
    second = build("shop", [folder], settings=keep2)
    manifest = IndexManifest.load(root / "shop" / (second.version or "") / MANIFEST_FILE)
    assert len(manifest.build_params[PLAN_HASH]) == len(manifest.build_params[BUILD_KEY]) == 16

    same = build("shop", [folder], settings=keep2)
    assert same.already_current and not same.published and same.pruned == []
    assert same.version == second.version and same.count == 9
    assert any(f"already published as {second.version}" in n for n in same.notes)
    assert list_versions(root, "shop") == [first.version, second.version]

    # Other index options are another result.
    other = build("shop", [folder], settings=keep2, index_factory="HNSW16,Flat")
    assert other.published and other.version != second.version
    # So is an image replaced under the same path (the file's size and time are in the key).
    write_photo(folder / "004.jpg", 999, size=(100, 80))
    replaced = build("shop", [folder], settings=keep2, index_factory="HNSW16,Flat")
    assert replaced.published and replaced.version != other.version
    # A delete since: the same build is a compaction, not a no-op.
    delete("shop", ["000.jpg"], settings=keep2)
    compacted = build("shop", [folder], settings=keep2, index_factory="HNSW16,Flat")
    assert compacted.published and compacted.count == 9
    # --force builds even when CURRENT holds the result.
    forced = build("shop", [folder], settings=keep2, index_factory="HNSW16,Flat", force=True)
    assert forced.published and forced.version != compacted.version


def _vouched_for_by_stats(monkeypatch: Any) -> None:
    """Files seconds old count as settled (the racy window is what ``test_a_racy_file_...`` checks)."""
    import indexer.build_key as build_key_module
    import store.version.reuse as reuse_module

    monkeypatch.setattr(build_key_module, "RACY_NS", 0)
    monkeypatch.setattr(reuse_module, "RACY_NS", 0)


def test_a_same_size_file_copied_with_its_old_time_is_built_again(
    settings: Settings, tmp_path: Path, monkeypatch: Any
) -> None:
    """`cp -p` (or `rsync -a`, `tar x`) of a same-size re-export: new bytes under the old size and
    modification time. The change time (which no copy can set back) makes it a new build."""
    _vouched_for_by_stats(monkeypatch)
    folder = _photos(tmp_path / "photos", 6, 0)
    first = build("shop", [folder], settings=settings)
    assert build("shop", [folder], settings=settings).already_current  # nothing changed: a no-op
    target = folder / "002.jpg"
    before = target.stat()
    export = write_photo(tmp_path / "export" / "002.jpg", 777, size=(40, 30)).read_bytes()
    assert len(export) < before.st_size
    staged = tmp_path / "export" / "002.jpg"
    staged.write_bytes(export + b"\0" * (before.st_size - len(export)))  # after the JPEG's end: ignored
    os.utime(staged, ns=(before.st_atime_ns, before.st_mtime_ns))
    shutil.copy2(staged, target)  # what `cp -p` does
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    rebuilt = build("shop", [folder], settings=settings)
    assert not rebuilt.already_current and rebuilt.published and rebuilt.version != first.version
    assert rebuilt.items_changed == 1 and rebuilt.items_encoded == 1


def test_a_rerun_of_a_racy_build_reads_the_files_it_did_not_vouch_for(
    settings: Settings, tmp_path: Path, monkeypatch: Any
) -> None:
    """Files changed within a timestamp tick of the build's look at them may change again with the very
    same stats: the rerun reads them (their digests equal: still CURRENT's result); once settled, their
    stats vouch for them and nothing is read."""
    import indexer.incremental as incremental
    from store.version import reuse

    hashed: list[Path] = []

    def counting(path: Path) -> bytes | None:
        hashed.append(Path(path))
        return reuse.image_digest(path)

    monkeypatch.setattr(incremental, "image_digest", counting)
    folder = _photos(tmp_path / "photos", 6, 0)  # just written: racy
    first = build("shop", [folder], settings=settings)
    manifest = IndexManifest.load(settings.index_root / "shop" / (first.version or "") / MANIFEST_FILE)
    assert manifest.build_params[RACY_KEY] is True and len(manifest.build_params[CONTENT_KEY]) == 16
    hashed.clear()
    again = build("shop", [folder], settings=settings)
    assert again.already_current and again.version == first.version
    assert sorted(p.name for p in hashed) == [f"{i:03d}.jpg" for i in range(6)]

    _vouched_for_by_stats(monkeypatch)  # settled: a build that sees them so records them
    settled = build("shop", [folder], settings=settings, index_factory="HNSW16,Flat")
    manifest = IndexManifest.load(settings.index_root / "shop" / (settled.version or "") / MANIFEST_FILE)
    assert settled.published and RACY_KEY not in manifest.build_params
    hashed.clear()
    assert build("shop", [folder], settings=settings, index_factory="HNSW16,Flat").already_current
    assert hashed == []


def test_a_racy_file_is_told_by_the_key(settings: Settings, tmp_path: Path) -> None:
    """A file changed within a timestamp tick of the stats (``RACY_NS``): the key says so."""
    from indexer.build_key import RACY_NS, build_key
    from indexer.sources import read_sources

    items = read_sources([_photos(tmp_path / "photos", 3, 0)]).items
    now = time.time_ns()

    def key(at: int) -> tuple[str, bool]:
        return build_key("plan", items, settings=settings, index_factory=None, now_ns=at)

    later = now + RACY_NS + 10**9
    assert key(now)[1] and not key(later)[1]
    assert key(now)[0] == key(later)[0]  # the same stats: the same key
