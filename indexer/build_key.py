"""Whether a full build's result is already CURRENT, so that re-running it publishes nothing.

A build killed just after publishing (before its work folder was removed) used to publish the same content
again when re-run, and pruning then dropped an older, distinct version to make room for the duplicate.
Every full build now records its *build key* in the manifest (``build_params``): the shard plan hash
(``indexer.shards.plan_hash``: items, model fingerprint, storage options) extended with what else decides
the result: each image file's size and modification time (an image replaced under the same path must be
encoded again), and the index options. A build whose key equals CURRENT's is a no-op.

``add`` and ``delete`` derive their manifests from their parent's: they drop the key (``without_key``),
since their result is no longer what the parent's build produced.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ccrk_settings import Settings
from indexer.sources import SourceItem
from store.errors import IndexFormatError
from store.layout import MANIFEST_FILE, index_dir
from store.manifest import IndexManifest
from store.versions import current_version

BUILD_KEY = "build_key"
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


def build_key(
    plan: str,
    items: Sequence[SourceItem],
    *,
    settings: Settings,
    index_factory: str | None,
    stats: Sequence[os.stat_result | None] | None = None,
) -> str:
    """The key of a full build: ``plan`` (the shard plan hash) + file sizes and times + index options.

    One ``stat`` per item (0.29 s for 100,000 files on a local disk with a warm cache; ``stats``: those
    of the items' first photos, taken already); a missing file counts as such, so it appearing later
    changes the key."""
    digest = hashlib.sha256()
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
    digest.update(json.dumps(options).encode())
    if stats is not None and len(stats) != len(items):
        raise ValueError(f"internal: {len(stats)} file stats for {len(items)} items")
    for i, item in enumerate(items):
        for k, path in enumerate((item.path, *item.extra_paths)):
            st = stats[i] if stats is not None and k == 0 else _stat(path)
            digest.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode() if st is not None else b"-\n")
        if item.extra_paths:  # a product's further photos (their order decides the photo rows)
            digest.update(json.dumps([str(p) for p in item.extra_paths]).encode())
    return digest.hexdigest()[:16]


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def published_as(root: Path, name: str, key: str) -> str | None:
    """CURRENT's version when its manifest records ``key`` (the build would publish the same content
    again), else None; an unreadable CURRENT never matches, so the build goes ahead."""
    current = current_version(root, name)
    if current is None:
        return None
    try:
        manifest = IndexManifest.load(index_dir(root, name) / current / MANIFEST_FILE)
    except IndexFormatError:
        return None
    return current if manifest.build_params.get(BUILD_KEY) == key else None


def without_key(build_params: dict[str, Any]) -> dict[str, Any]:
    """A parent's build parameters for a derived version (add, delete): without its build's key."""
    return {k: v for k, v in build_params.items() if k not in (BUILD_KEY, PLAN_HASH, "work_key")}
