"""Whether a full build's result is already CURRENT, so that re-running it publishes nothing.

A build killed just after publishing (before its work folder was removed) used to publish the same content
again when re-run, and pruning then dropped an older, distinct version to make room for the duplicate.
Every full build now records its *build key* in the manifest (``build_params``): the shard plan hash
(``indexer.shards.plan_hash``: items, model fingerprint, storage options) extended with what else decides
the result: each image file's inode, size, modification and change times, and the index options. A build
whose key equals CURRENT's is a no-op.

Size and modification time alone do not vouch for a file's bytes: ``cp -p``, ``rsync -a`` or ``tar x`` of a
same-size re-export restore the old modification time over new bytes. They cannot restore the change time,
nor keep the inode of a file replaced by a rename, so both are in the key. Nor do a file's stats vouch for
it when it changed within ``RACY_NS`` of the build looking at it (a timestamp tick of a coarse filesystem:
it may change again with the same stats): such a build is recorded as *racy* (``RACY_KEY``) with the key
of its files' bytes (``CONTENT_KEY``, ``content_key``), and a later build with its stat key is a no-op
only when the files' content digests give that key too (a file whose full stats CURRENT recorded when
hashing it is not read again; the racy ones always are).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccrk_settings import Settings
from indexer.incremental import digest_and_stat
from indexer.sources import SourceItem
from store.errors import IndexFormatError
from store.layout import MANIFEST_FILE, index_dir
from store.version.manifest import IndexManifest
from store.version.reuse import DIGEST_BYTES, KnownDigests
from store.version.versions import current_version

BUILD_KEY = "build_key"
CONTENT_KEY = "content_key"  # build_params: the key of the files' bytes (``content_key``), racy builds
RACY_KEY = "racy_files"  # build_params: the build saw files changed within RACY_NS (their stats vouch not)
PLAN_HASH = "plan_hash"
MODEL_FILES_KEY = "model_files_key"  # build_params: the model directory's files when the build checked it
RACY_NS = 2_000_000_000  # files changed this recently are not vouched for by their stats


def model_files_key(model_dir: Path, backend: str, int8: bool) -> str | None:
    """A key of every file under the model directory as it is now (path, device, inode, size,
    modification and change times) and the options the check depends on; None when a file changed in the
    last 2 s. Equal keys: the very files ``model.model_check.check_model_dir`` checked before (a write
    changes a file's change time, which no user can set back), so the check would find the same."""
    now = time.time_ns()
    digest = hashlib.sha256(json.dumps([backend, int8]).encode())
    for path in sorted(Path(model_dir).rglob("*")):
        try:
            st = path.stat()
        except OSError:
            return None
        if now - st.st_ctime_ns < RACY_NS or now - st.st_mtime_ns < RACY_NS:
            return None
        stamp = [str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        digest.update(json.dumps(stamp).encode())
    return digest.hexdigest()[:16]


def current_build_param(root: Path, name: str, key: str) -> Any:
    """``build_params[key]`` of CURRENT's manifest (None: no CURRENT, unreadable, or not recorded)."""
    current = current_version(root, name)
    if current is None:
        return None
    try:
        return IndexManifest.load(index_dir(root, name) / current / MANIFEST_FILE).build_params.get(key)
    except IndexFormatError:
        return None


def _options(plan: str, settings: Settings, index_factory: str | None) -> list[Any]:
    """What besides the files decides a build's result: the plan hash and the index options."""
    options = [
        plan,
        index_factory,
        settings.exact_max_items,
        settings.memory_budget_mb,
        settings.target_recall,
        settings.backend,  # the runtimes' embeddings differ in the last bits
        settings.int8,  # int8 graphs encode images differently
    ]
    if settings.index_shards > 1:  # left out when unsharded: the keys of earlier builds stay valid
        options.append(settings.index_shards)
    if settings.text_fields:  # likewise: only builds that search text fields record them
        options.append(sorted(settings.text_fields))
    return options


def build_key(
    plan: str,
    items: Sequence[SourceItem],
    *,
    settings: Settings,
    index_factory: str | None,
    stats: Sequence[os.stat_result | None] | None = None,
    now_ns: int | None = None,
) -> tuple[str, bool]:
    """The key of a full build: ``plan`` (the shard plan hash) + file stats + index options; and whether a
    file changed within ``RACY_NS`` of ``now_ns`` (its stats do not vouch for its bytes).

    One ``stat`` per item (0.29 s for 100,000 files on a local disk with a warm cache; ``stats``: those
    of the items' first photos, taken already, just after ``now_ns``); a missing file counts as such, so it
    appearing later changes the key."""
    now = time.time_ns() if now_ns is None else now_ns
    digest = hashlib.sha256()
    digest.update(json.dumps(_options(plan, settings, index_factory)).encode())
    if stats is not None and len(stats) != len(items):
        raise ValueError(f"internal: {len(stats)} file stats for {len(items)} items")
    racy = False
    for i, item in enumerate(items):
        for k, path in enumerate((item.path, *item.extra_paths)):
            st = stats[i] if stats is not None and k == 0 else _stat(path)
            if st is None:
                digest.update(b"-\n")
                continue
            racy = racy or now - st.st_ctime_ns < RACY_NS or now - st.st_mtime_ns < RACY_NS
            digest.update(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\n".encode())
        if item.extra_paths:  # a product's further photos (their order decides the photo rows)
            digest.update(json.dumps([str(p) for p in item.extra_paths]).encode())
    return digest.hexdigest()[:16], racy


def content_key(
    plan: str,
    digests: np.ndarray,
    *,
    settings: Settings,
    index_factory: str | None,
    extra_digests: np.ndarray | None = None,
    extra_paths: Sequence[Path] = (),
) -> str:
    """The key of a full build by its files' bytes: ``digests`` (n, 16) the items' first photos' content
    digests (zeros: unreadable), ``extra_digests`` (m, 16) those of their further photos (``extra_paths``,
    in item order) + the index options. Equal to CURRENT's: the very result, whatever the files' stats."""
    digest = hashlib.sha256()
    digest.update(json.dumps(_options(plan, settings, index_factory)).encode())
    digest.update(np.ascontiguousarray(digests, np.uint8).tobytes())
    if extra_digests is not None and len(extra_paths):
        digest.update(np.ascontiguousarray(extra_digests, np.uint8).tobytes())
        digest.update(json.dumps([str(p) for p in extra_paths]).encode())
    return digest.hexdigest()[:16]


def further_photo_digests(
    items: Sequence[SourceItem], known: KnownDigests | None
) -> tuple[list[Path], np.ndarray]:
    """The items' further photos (in item order) and their content digests (``content_key``); a file with
    the stats recorded for a photo of ``known`` (CURRENT's product channels) is not read."""
    paths = [p for it in items for p in it.extra_paths]
    if not paths:
        return paths, np.zeros((0, DIGEST_BYTES), np.uint8)
    digests, _ = digest_and_stat([SourceItem(id=str(m), path=p) for m, p in enumerate(paths)], known)
    return paths, digests


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def published_as(root: Path, name: str, key: str, param: str = BUILD_KEY) -> str | None:
    """CURRENT's version when its manifest records ``key`` as ``param`` (the build would publish the same
    content again), else None; an unreadable CURRENT never matches, so the build goes ahead."""
    current = current_version(root, name)
    if current is None:
        return None
    try:
        manifest = IndexManifest.load(index_dir(root, name) / current / MANIFEST_FILE)
    except IndexFormatError:
        return None
    return current if manifest.build_params.get(param) == key else None


def without_key(build_params: dict[str, Any]) -> dict[str, Any]:
    """A parent's build parameters for a derived version (add, delete): without its build's key."""
    dropped = (BUILD_KEY, CONTENT_KEY, RACY_KEY, PLAN_HASH, "work_key")
    return {k: v for k, v in build_params.items() if k not in dropped}
