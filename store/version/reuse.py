"""What lets a rebuild reuse a version's vectors instead of encoding its images again: per row, the content
digest of the image the row was encoded from and a checksum of the row's stored vectors.

A version written by a full build holds, beside its arrays (``store.layout``)::

    image_digests.npy    (N, 16) uint8  blake2b-128 of the bytes of the image row i was encoded from
    row_digests.npy      (N, 16) uint8  blake2b-128 of row i's stored bytes: its embedding, then its
                                         re-rank tokens, then their int8 scales (as stored)

    image_stats.npy      (N, 5) int64  optional: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of the
                                         image file when it was hashed (zeros: not recorded)

A version without the digests (written before them) is read as holding nothing reusable. The stats let a
rebuild skip reading a file again when it is the very file hashed before (same device, inode, size,
modification and change times: a write to a file changes its change time, which no user can set back;
files whose change time was within ``RACY_NS`` of hashing are not recorded), as git's index does; the
identity of an image stays its content digest. Both files
are covered by the manifest's checksums like every other file, so ``verify`` checks them; the per-row
checksum is what a rebuild checks each reused row against (``StoredVectors.check``): a row whose bytes do
not match is not reused but encoded again.

Whether vectors may be reused at all (same model, same storage options) is the caller's decision, recorded
as ``REUSE_KEY`` in the manifest's ``build_params`` (``reuse_key``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from store.errors import IndexFormatError
from store.files import names_full_disk
from store.layout import (
    EMBEDDINGS_FILE,
    IMAGE_DIGESTS_FILE,
    IMAGE_STATS_FILE,
    MANIFEST_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    ROW_DIGESTS_FILE,
)
from store.version.manifest import IndexManifest

DIGEST_BYTES = 16
REUSE_KEY = "reuse_key"  # build_params entry: what the stored vectors depend on besides the image bytes
READ_CHUNK = 1 << 20
STAT_COLUMNS = 5
CHECK_CHUNK = 2048  # stored rows hashed per task when checking them (``StoredVectors.check``)
CHECK_MIN_TASK = 128  # and at least these many (fewer rows: one thread)
RACY_NS = 2_000_000_000  # a file changed this recently may change again within its timestamps' tick


def image_stat(
    path: Path, now_ns: int, taken: os.stat_result | None = None
) -> tuple[int, int, int, int, int] | None:
    """(dev, inode, size, mtime_ns, ctime_ns) of a file, taken before hashing it (``taken``: its stat,
    taken already, after ``now_ns``); None when it cannot be read or changed too recently to be told apart
    from a later change (``RACY_NS``; ``now_ns`` taken before the stat is the stricter)."""
    st = taken
    if st is None:
        try:
            st = os.stat(path)
        except OSError:
            return None
    if now_ns - st.st_ctime_ns < RACY_NS or now_ns - st.st_mtime_ns < RACY_NS:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class FileStats:
    """``os.stat`` of many files, taken once for all who need them (a build's key and its digests), and
    the time just before (``image_stat``'s ``now_ns``); None: the file cannot be stat'ed."""

    now_ns: int
    stats: list[os.stat_result | None]

    @classmethod
    def take(cls, paths: Sequence[Path]) -> FileStats:
        now = time.time_ns()
        stats: list[os.stat_result | None] = []
        for path in paths:
            try:
                stats.append(os.stat(path))
            except OSError:
                stats.append(None)
        return cls(now, stats)


_STAT = struct.Struct(f"={STAT_COLUMNS}q")  # as an int64 row of image_stats.npy holds them (native order)


def stat_key(stat: tuple[int, ...]) -> bytes:
    """The bytes of ``image_stat``'s tuple as a row of image_stats.npy (``StoredVectors.rows_by_stat``)."""
    return _STAT.pack(*stat)


def reuse_key(*, fingerprint: str, rerank_dtype: str, options: Sequence[object]) -> str:
    """The key two versions' vectors must share to be interchangeable: the model fingerprint, the re-rank
    dtype and whatever else changes the encoded bytes (``options``: runtime backend, int8 graphs, ...)."""
    text = json.dumps([fingerprint, rerank_dtype, *[str(o) for o in options]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def image_digest(path: Path) -> bytes | None:
    """blake2b-128 of a file's bytes; None when it cannot be read (the decoder reports why)."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    try:
        with open(path, "rb") as fh:
            while block := fh.read(READ_CHUNK):
                digest.update(block)
    except OSError:
        return None
    return digest.digest()


def _row_bytes(arr: np.ndarray, m: int, dtype: type | None = None) -> tuple[memoryview, int]:
    """An array's ``m`` rows as stored, flat (a view where it is C-contiguous already), and bytes per row."""
    flat = np.ascontiguousarray(arr, dtype=dtype).reshape(-1).view(np.uint8)
    return memoryview(flat), flat.size // max(1, m)


def _digest(parts: Sequence[tuple[memoryview, int]], rows: Iterable[int]) -> bytes:
    """The checksums of ``rows`` of ``parts`` (``_row_bytes``), concatenated."""
    blake2b, out = hashlib.blake2b, bytearray()
    (first, width), rest = parts[0], parts[1:]
    for i in rows:
        digest = blake2b(first[i * width : (i + 1) * width], digest_size=DIGEST_BYTES)
        for part, w in rest:
            digest.update(part[i * w : (i + 1) * w])
        out += digest.digest()
    return bytes(out)


def row_digests(embeds: np.ndarray, tokens: np.ndarray | None, scales: np.ndarray | None) -> np.ndarray:
    """(m, 16) uint8: the checksum of each row's stored bytes (embedding, tokens, scales, as stored)."""
    m = int(embeds.shape[0])
    parts = [_row_bytes(embeds, m, np.float32)]
    if tokens is not None and tokens.size:
        parts.append(_row_bytes(tokens, m))
    if scales is not None and scales.size:
        parts.append(_row_bytes(scales, m, np.float32))
    return np.frombuffer(_digest(parts, range(m)), np.uint8).reshape(m, DIGEST_BYTES).copy()


def write_reuse_digests(
    stage: Path, images: np.ndarray, rows: np.ndarray, stats: np.ndarray | None = None
) -> None:
    """The digest files of a staged version (``images`` and ``rows``: (N, 16) uint8, by row; ``stats``:
    (N, 5) int64 file stats, written when given)."""
    if images.shape != rows.shape or images.ndim != 2 or images.shape[1] != DIGEST_BYTES:
        raise IndexFormatError(f"internal: digests of shapes {images.shape} and {rows.shape}")
    for name, arr in ((IMAGE_DIGESTS_FILE, images), (ROW_DIGESTS_FILE, rows)):
        with names_full_disk(stage / name):
            np.save(stage / name, np.ascontiguousarray(arr, dtype=np.uint8))
    if stats is not None:
        if stats.shape[0] != images.shape[0]:
            raise IndexFormatError(f"internal: file stats of shape {stats.shape}")
        write_stats(stage, stats)


def write_stats(stage: Path, stats: np.ndarray) -> None:
    """image_stats.npy of a staged version (or segment): (N, 5) int64 file stats by row."""
    if stats.ndim != 2 or stats.shape[1] != STAT_COLUMNS:
        raise IndexFormatError(f"internal: file stats of shape {stats.shape}")
    with names_full_disk(stage / IMAGE_STATS_FILE):
        np.save(stage / IMAGE_STATS_FILE, np.ascontiguousarray(stats, dtype=np.int64))


class KnownDigests(Protocol):
    """Stored rows whose files were hashed: their content digests (``images``, by row) and the rows whose
    file stats were recorded (``StoredVectors``; ``store.product_reuse.StoredProductVectors``'s photos)."""

    images: np.ndarray

    def rows_by_stat(self) -> dict[bytes, int]: ...


def _check_recorded(path: Path, sha256: str) -> None:
    """IndexFormatError unless segment manifest ``path`` is the one its version's manifest records: a
    segment changed since the version was published (its files and its manifest sealed afresh) would have
    its files linked, and its checksums recorded as good, into the next version; a build reuses nothing of
    it instead (``indexer.incremental``: everything encoded again)."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise IndexFormatError(f"cannot read {path}: {exc}") from exc
    if digest != sha256:
        raise IndexFormatError(f"{path}: sha256 differs from the version's manifest")


class StoredVectors:
    """The reusable rows of one installed version, read-only: which row holds the vectors of an image with
    a given content digest, those rows' stored bytes, and their check against the stored row checksums.
    An unsharded version is one folder; a segmented one (``store.version.sharding.SEGMENT_RULE``) is its
    segments
    in order, rows numbered globally (segment offset + local row), as ``store.shards.sharded.ShardedIndex``
    does.
    ``open`` returns None for a version without digests, with another ``reuse_key``, or hash-sharded."""

    def __init__(self, path: Path, manifest: IndexManifest, folders: Sequence[Path] | None = None) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self.folders = [Path(f) for f in folders] if folders else [self.path]
        images, digests, stats, self._embeds, self._tokens, self._scales = [], [], [], [], [], []
        for folder in self.folders:
            try:
                images.append(np.load(folder / IMAGE_DIGESTS_FILE))
                stat_file = folder / IMAGE_STATS_FILE
                stats.append(np.load(stat_file) if stat_file.is_file() else None)
                digests.append(np.load(folder / ROW_DIGESTS_FILE))
                self._embeds.append(np.load(folder / EMBEDDINGS_FILE, mmap_mode="r"))
                tokens, scales = folder / RERANK_FILE, folder / RERANK_SCALES_FILE
                self._tokens.append(np.load(tokens, mmap_mode="r") if tokens.is_file() else None)
                self._scales.append(np.load(scales, mmap_mode="r") if scales.is_file() else None)
            except (OSError, ValueError) as exc:
                raise IndexFormatError(f"cannot read the stored vectors of {folder}: {exc}") from exc
            n = int(self._embeds[-1].shape[0])
            if images[-1].shape != (n, DIGEST_BYTES) or digests[-1].shape != (n, DIGEST_BYTES):
                raise IndexFormatError(
                    f"{folder}: digests of shapes {images[-1].shape} / {digests[-1].shape} for {n} rows"
                )
        self.images = np.concatenate(images)
        self.digests = np.concatenate(digests)
        self.stats = np.concatenate(
            [
                st
                if st is not None and st.shape == (im.shape[0], STAT_COLUMNS)
                else np.zeros((im.shape[0], STAT_COLUMNS), np.int64)
                for st, im in zip(stats, images, strict=True)
            ]
        )
        totals = np.array([e.shape[0] for e in self._embeds], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(totals)[:-1]]).astype(np.int64)
        self.totals = totals
        self.rows = int(totals.sum())
        self._by_image: dict[bytes, int] | None = None

    @classmethod
    def open(cls, path: Path, manifest: IndexManifest, key: str) -> StoredVectors | None:
        """The version at ``path`` when its vectors were stored under reuse key ``key`` with digests;
        else None (nothing of it is reusable). IndexFormatError when a segment's manifest is not the one
        the version's manifest records (the segment changed since it was published)."""
        if manifest.build_params.get(REUSE_KEY) != key:
            return None
        folders = [Path(path)]
        if manifest.is_sharded:
            from store.version.sharding import Sharding  # the sharding block, only for sharded versions

            sharding = Sharding.from_dict(manifest.sharding)
            if not sharding.segmented:
                return None
            folders = [Path(path) / s.dir for s in sharding.shards]
            for folder, entry in zip(folders, sharding.shards, strict=True):
                _check_recorded(folder / MANIFEST_FILE, entry.manifest_sha256)
        for folder in folders:
            if not (folder / IMAGE_DIGESTS_FILE).is_file() or not (folder / ROW_DIGESTS_FILE).is_file():
                return None
        return cls(path, manifest, folders)

    @property
    def segmented(self) -> bool:
        return self.manifest.is_sharded

    def segment_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, local row) of global rows."""
        rows = np.asarray(rows, dtype=np.int64)
        seg = np.searchsorted(self.offsets, rows, side="right") - 1
        seg = np.clip(seg, 0, len(self.offsets) - 1)
        return seg, rows - self.offsets[seg]

    def rows_by_stat(self) -> dict[bytes, int]:
        """{file stats (``stat_key``): row} of the rows whose file stats were recorded."""
        known = np.flatnonzero(self.stats.any(axis=1))
        keys, width = np.ascontiguousarray(self.stats[known], dtype=np.int64).tobytes(), STAT_COLUMNS * 8
        return {keys[k * width : (k + 1) * width]: row for k, row in enumerate(known.tolist())}

    def row_of_image(self, digest: bytes) -> int:
        """The row encoded from an image with this content digest; -1 when none is."""
        if self._by_image is None:
            keys = self.images.tobytes()
            self._by_image = {}
            for row in range(self.rows - 1, -1, -1):  # the first row of equal images wins
                self._by_image[keys[row * DIGEST_BYTES : (row + 1) * DIGEST_BYTES]] = row
        return self._by_image.get(digest, -1)

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The stored bytes of ``rows``: (m, D) embeddings, (m, T, W) tokens and (m, T) int8 scales (as
        stored: fp16 or int8 tokens; None where the version has none)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows):
            raise IndexFormatError(f"rows out of range 0..{self.rows - 1}")
        if len(self.folders) == 1:
            return self._read_one(0, rows)
        seg, local = self.segment_of(rows)
        parts = {int(i): self._read_one(int(i), local[seg == i]) for i in np.unique(seg)}
        first = parts[int(seg[0])] if rows.size else self._read_one(0, rows)
        out = []
        for k, like in enumerate(first):
            if like is None:
                out.append(None)
                continue
            arr = np.empty((rows.shape[0], *like.shape[1:]), like.dtype)
            for i, part in parts.items():
                arr[seg == i] = part[k]
            out.append(arr)
        return out[0], out[1], out[2]  # type: ignore[return-value]

    def _read_one(self, i: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        embeds = np.asarray(self._embeds[i][rows])
        tokens = None if self._tokens[i] is None else np.asarray(self._tokens[i][rows])
        scales = None if self._scales[i] is None else np.asarray(self._scales[i][rows])
        return embeds, tokens, scales

    def check(self, rows: np.ndarray, threads: int = 0) -> np.ndarray:
        """(m,) bool: whether each row's stored bytes still match its stored checksum. The rows are hashed
        where they lie (memory-mapped, no copy), in chunks of ``CHECK_CHUNK`` rows on ``threads`` threads
        (0: one per CPU; hashing releases the GIL)."""
        asked = np.asarray(rows, dtype=np.int64)
        rows = np.unique(asked)  # sorted: each segment's rows in file order
        if rows.size and (rows[0] < 0 or rows[-1] >= self.rows):
            raise IndexFormatError(f"rows out of range 0..{self.rows - 1}")
        seg, local = self.segment_of(rows)
        views = self.row_views()
        found = bytearray(rows.size * DIGEST_BYTES)

        def hash_chunk(lo: int, hi: int) -> None:
            k = lo
            while k < hi:  # runs of rows in one segment
                s = int(seg[k])
                end = k + int(np.searchsorted(seg[k:hi], s, side="right"))
                found[k * DIGEST_BYTES : end * DIGEST_BYTES] = _digest(views[s], local[k:end].tolist())
                k = end

        workers = threads or os.cpu_count() or 1
        # At most CHECK_CHUNK rows a task, and a share for each thread of a few thousand rows too.
        step = max(CHECK_MIN_TASK, min(CHECK_CHUNK, -(-rows.size // workers)))
        chunks = [(lo, min(lo + step, rows.size)) for lo in range(0, rows.size, step)]
        workers = max(1, min(workers, len(chunks)))
        if workers == 1:
            for lo, hi in chunks:
                hash_chunk(lo, hi)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for done in [pool.submit(hash_chunk, lo, hi) for lo, hi in chunks]:
                    done.result()
        got = np.frombuffer(bytes(found), np.uint8).reshape(rows.size, DIGEST_BYTES)
        good = (got == self.digests[rows]).all(axis=1)
        return good[np.searchsorted(rows, asked)]

    def row_views(self) -> list[list[tuple[memoryview, int]]]:
        """Each segment's row bytes as ``row_digests`` takes them (``_row_bytes``: memory-mapped, no copy)."""
        views = []
        for i, emb in enumerate(self._embeds):
            m = int(emb.shape[0])
            parts = [_row_bytes(np.asarray(emb), m, np.float32)]
            for extra, dtype in ((self._tokens[i], None), (self._scales[i], np.float32)):
                if extra is not None and extra.size:
                    parts.append(_row_bytes(np.asarray(extra), m, dtype))
            views.append(parts)
        return views

    def close(self) -> None:
        self._embeds, self._tokens, self._scales = [], [], []
