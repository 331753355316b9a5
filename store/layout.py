"""Where an index's files live, and how they are written so that readers never see a torn one.

Layout::

    INDEX_ROOT/NAME/CURRENT             the published version name, switched atomically
    INDEX_ROOT/NAME/rules.json          merchandising rules (``store.rules``), beside the versions
    INDEX_ROOT/NAME/changes.sqlite      the live change log (``store.live``; SQLite in WAL mode, with its
                                        ``-wal`` and ``-shm`` files): product writes since the versions
    INDEX_ROOT/NAME/<version>/          immutable once published (version: sortable UTC stamp + suffix)
        manifest.json                   IndexManifest (``store.version.manifest``)
        index.faiss                     faiss index, inner product on L2-normalised embeddings; ids = rows
        embeddings.npy                  (N, D) float32: exact reference, re-scoring, rebuilds
        rerank_tokens.npy               (N, T, W) float16, or int8 with rerank_scales.npy (N, T) float32
        metadata.sqlite                 items(row, id, path, fields JSON, deleted) + field_names(name)
        image_digests.npy               (N, 16) uint8 content digest of each row's image
        (``store.version.reuse``)
        row_digests.npy                 (N, 16) uint8 checksum of each row's stored vectors (full builds)
        products.json, ...              product channels, when built from products
        (``store.products.channels``)
        lexical.tantivy/                their full-text index: a folder, its files checksummed as
                                        ``lexical.tantivy/<name>`` (``NESTED_DIRS``)
    INDEX_ROOT/NAME/.builds/...         work dirs of unfinished writers, never read by readers

A sharded version (``store.version.sharding``) holds no data files of its own but its product channels::

    INDEX_ROOT/NAME/<version>/
        manifest.json                   format_version 2, with a ``sharding`` block (rule, shards, checksums)
        shard-000/ ... shard-{S-1}/     each an ordinary format-1 version folder, as above
        products.json, ...              product channels over the global rows, when built from products
                                        (``store.products.channels``; checksums in this manifest's
                                        ``checksums``)

A published version is never modified: ``add`` and ``delete`` write a new version (unchanged large files
are hard-linked), so a reader holding an old version keeps a consistent view.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from pathlib import Path

from store.errors import IndexFormatError

FORMAT_VERSION = 1  # an unsharded version, and each shard of a sharded one
SHARDED_FORMAT_VERSION = 2  # a sharded version's own manifest (older readers refuse it)
MAX_FORMAT_VERSION = SHARDED_FORMAT_VERSION  # the newest format this code reads

CURRENT_FILE = "CURRENT"
CHANGELOG_FILE = "changes.sqlite"  # store.live: beside the versions, since it outlives each of them
BUILDS_DIR = ".builds"
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.npy"
RERANK_FILE = "rerank_tokens.npy"
RERANK_SCALES_FILE = "rerank_scales.npy"
METADATA_FILE = "metadata.sqlite"
IMAGE_DIGESTS_FILE = "image_digests.npy"
ROW_DIGESTS_FILE = "row_digests.npy"
IMAGE_STATS_FILE = "image_stats.npy"  # store.version.reuse: what each row's image file was when it was hashed
LEXICAL_DIR = "lexical.tantivy"
NESTED_DIRS = (LEXICAL_DIR,)  # folders of a version whose files are data files (a shard folder is not one)

VERSION_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


def index_dir(root: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise IndexFormatError(f"invalid index name {name!r}")
    return Path(root) / name


def builds_dir(root: Path, name: str) -> Path:
    """``NAME/.builds``: staged versions, trash and writers' work folders (never read by readers)."""
    return index_dir(root, name) / BUILDS_DIR


def is_version_name(text: str) -> bool:
    return bool(VERSION_RE.match(text))


# -- durable writes --------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FileSignature = tuple[int, int, int] | None  # (inode, size, mtime_ns); None: no file


def file_signature(path: Path) -> FileSignature:
    """What tells a file was replaced or changed without reading it (``write_atomic`` renames a new inode
    into place); None where there is no file. One ``stat``: cheap enough for every search, which polls the
    index-level files beside the versions so (``store.rules``, ``store.synonyms``)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, os.replace, fsync the folder: readers see old or new, never
    a torn file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(version_dir: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of every data file of a version folder (the manifest itself excluded). ``known``: checksums
    of files that are hard links to a published version's, taken from its manifest instead of reading
    them again (a link shares the inode, so its bytes are that version's; if they rotted since, ``verify``
    still says so, for both versions)."""
    known = known or {}
    folder = Path(version_dir)
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST_FILE]
    for nested in NESTED_DIRS:
        if (folder / nested).is_dir():
            files += sorted(p for p in (folder / nested).iterdir() if p.is_file())
    names = {p.relative_to(folder).as_posix(): p for p in files if not p.name.startswith(".")}
    return {name: known.get(name) or sha256_file(p) for name, p in sorted(names.items())}
