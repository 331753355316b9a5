"""What lets a rebuild reuse a version's product channels (``store.products.channels``) instead of encoding
every
photo and text value again: per photo row, the content digest of its file and a checksum of its stored
vectors; per text value, a checksum of its stored embedding (the value itself, its field, language and
text, is in ``products.sqlite`` already).

A version with product channels written since 27 Nov 2026 (session 14) holds, beside them::

    photo_digests.npy       (M, 16) uint8  blake2b-128 of the bytes of photo row i's file
    (``store.version.reuse``'s)
    photo_row_digests.npy   (M, 16) uint8  blake2b-128 of photo row i's stored vectors: its cross-modal
                                           embedding, then its visual one (as stored, float32)
    photo_stats.npy         (M, 5) int64   optional: the file's stats when it was hashed (zeros: not
                                           recorded; ``store.version.reuse.image_stat``: a file with the very
                                           stats
                                           is not read again)
    text_row_digests.npy    (F, 16) uint8  blake2b-128 of text row i's stored embedding

They sit with the other channel files (a sharded version: beside its shards), so the manifest's checksums
cover them and ``verify`` checks them. A version without them (written before, or by an ``add`` to such a
version) is read as holding nothing reusable; so is one stored under another reuse key
(``store.version.reuse.REUSE_KEY``: model, storage options). A reused row is checked against its stored
checksum
(``StoredProductVectors.check_photos`` / ``check_texts``): one whose bytes do not match is encoded again.
Channels a rebuild would write from the very same inputs (``ProductInfo.inputs_key``) are taken over whole
instead (``link_channels``: hard links, as ``store.version.writer`` links a parent's arrays).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from store.errors import IndexFormatError
from store.files import names_full_disk
from store.products.channels import (
    CHANNEL_FILES,
    PHOTO_EMBEDDINGS,
    PHOTO_OWNERS,
    PHOTO_VISUAL,
    PRODUCTS_DB,
    PRODUCTS_FILE,
    TEXT_EMBEDDINGS,
    TEXT_OWNERS,
    ProductInfo,
    has_product_channels,
)
from store.products.term_hashes import TERM_HASHES, TERM_OFFSETS
from store.text.lexical_index import TANTIVY_DIR
from store.version.manifest import IndexManifest
from store.version.reuse import CHECK_CHUNK, DIGEST_BYTES, REUSE_KEY, STAT_COLUMNS, row_digests
from store.version.writer import link_from_version

PHOTO_DIGESTS = "photo_digests.npy"
PHOTO_ROW_DIGESTS = "photo_row_digests.npy"
PHOTO_STATS = "photo_stats.npy"
TEXT_ROW_DIGESTS = "text_row_digests.npy"

TextKey = tuple[str, str, str]  # (field, language, text) of a text value
K = TypeVar("K")  # a photo's content digest or a TextKey


def photo_row_digests(embeds: np.ndarray, visual: np.ndarray | None) -> np.ndarray:
    """(M, 16) uint8: the checksum of each photo row's stored vectors (embedding, then visual)."""
    vis = None if visual is None or not visual.size else np.asarray(visual, np.float32)
    # ``row_digests`` hashes the embedding, then a second part's bytes as stored: the visual row.
    return row_digests(np.asarray(embeds, np.float32), vis, None)


def text_row_digests(embeds: np.ndarray) -> np.ndarray:
    """(F, 16) uint8: the checksum of each text row's stored embedding."""
    return row_digests(np.asarray(embeds, np.float32), None, None)


def write_product_digests(
    stage: Path,
    images: np.ndarray,
    photo_embeds: np.ndarray,
    photo_visual: np.ndarray | None,
    text_embeds: np.ndarray,
    stats: np.ndarray | None = None,
) -> None:
    """The digest files of staged product channels: ``images`` (M, 16) uint8 the photos' content digests
    in photo-row order, the checksums of the vectors as ``store.products.channels.write_product_channels``
    stored
    them, and ``stats`` (M, 5) int64 the files' stats when hashed (written when given)."""
    m = int(photo_embeds.shape[0])
    if images.shape != (m, DIGEST_BYTES):
        raise IndexFormatError(f"internal: photo digests of shape {images.shape} for {m} photos")
    arrays = {
        PHOTO_DIGESTS: np.ascontiguousarray(images, np.uint8),
        PHOTO_ROW_DIGESTS: photo_row_digests(photo_embeds, photo_visual),
        TEXT_ROW_DIGESTS: text_row_digests(
            np.asarray(text_embeds, np.float32).reshape(-1, photo_embeds.shape[1])
        ),
    }
    for name, arr in arrays.items():
        with names_full_disk(stage / name):
            np.save(stage / name, arr)
    if stats is not None:
        write_photo_stats(stage, stats)


def write_photo_stats(stage: Path, stats: np.ndarray) -> None:
    """photo_stats.npy of staged channels: (M, 5) int64 the photo files' stats when hashed."""
    rows = int(np.load(stage / PHOTO_DIGESTS, mmap_mode="r").shape[0])
    if stats.shape != (rows, STAT_COLUMNS):
        raise IndexFormatError(f"internal: photo file stats of shape {stats.shape} for {rows} photos")
    with names_full_disk(stage / PHOTO_STATS):
        np.save(stage / PHOTO_STATS, np.ascontiguousarray(stats, np.int64))


def link_channels(version_dir: Path, stage: Path, known: dict[str, str]) -> list[str]:
    """Every product-channel file of an installed version (its digests too; not its photo stats, which are
    the staging build's to write) taken over unchanged into ``stage`` by
    ``store.version.writer.link_from_version``:
    hard links (copies across filesystems), their checksums in the version's manifest into ``known`` (the
    stage's writer's ``linked_checksums``). A copy that does not match the recorded checksum (the parent's
    file rotted) is not taken over: what was linked or copied is removed again and ``IndexFormatError``
    raised (the caller writes the channels afresh). Returns the names linked, relative to the folder."""
    folder, stage = Path(version_dir), Path(stage)
    names = [
        n
        for n in (
            *CHANNEL_FILES,
            TERM_HASHES,
            TERM_OFFSETS,
            PHOTO_DIGESTS,
            PHOTO_ROW_DIGESTS,
            TEXT_ROW_DIGESTS,
        )
        if (folder / n).is_file()
    ]
    if (folder / TANTIVY_DIR).is_dir():  # its files, not the lock files a reader leaves (dot files)
        names += [
            f"{TANTIVY_DIR}/{p.name}"
            for p in sorted((folder / TANTIVY_DIR).iterdir())
            if p.is_file() and not p.name.startswith(".")
        ]
    link_from_version(folder, stage, names, known)  # a rotted copy: IndexFormatError
    return names


def has_product_digests(version_dir: Path) -> bool:
    folder = Path(version_dir)
    return all((folder / f).is_file() for f in (PHOTO_DIGESTS, PHOTO_ROW_DIGESTS, TEXT_ROW_DIGESTS))


class StoredProductVectors:
    """The reusable photo and text rows of one installed version's product channels, read-only: which
    photo row holds the vectors of a file with a given content digest, which text row the embedding of a
    (field, language, text), those rows' stored vectors and their check against the stored checksums.
    ``open`` returns None for a version without channels or digests, or with another reuse key."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.images = np.load(self.path / PHOTO_DIGESTS)
            self.photo_digests = np.load(self.path / PHOTO_ROW_DIGESTS)
            self.text_digests = np.load(self.path / TEXT_ROW_DIGESTS)
            stats = self.path / PHOTO_STATS
            self.stats = np.load(stats) if stats.is_file() else None
            self._embeds = np.load(self.path / PHOTO_EMBEDDINGS, mmap_mode="r")
            visual = self.path / PHOTO_VISUAL
            self._visual = np.load(visual, mmap_mode="r") if visual.is_file() else None
            self._texts = np.load(self.path / TEXT_EMBEDDINGS, mmap_mode="r")
            photo_owners = np.load(self.path / PHOTO_OWNERS)
            text_owners = np.load(self.path / TEXT_OWNERS)
            con = sqlite3.connect(f"file:{self.path / PRODUCTS_DB}?mode=ro&immutable=1", uri=True)
            try:
                values = con.execute("SELECT field, lang, text FROM texts ORDER BY row").fetchall()
            finally:
                con.close()
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise IndexFormatError(f"cannot read the stored product vectors of {self.path}: {exc}") from exc
        m, f = int(self._embeds.shape[0]), int(self._texts.shape[0])
        if (
            self.images.shape != (m, DIGEST_BYTES)
            or self.photo_digests.shape != (m, DIGEST_BYTES)
            or self.text_digests.shape != (f, DIGEST_BYTES)
            or len(values) != f
            or photo_owners.shape != (m,)
            or text_owners.shape != (f,)
            or (self._visual is not None and self._visual.shape[0] != m)
        ):
            raise IndexFormatError(f"{self.path}: product digests do not fit its {m} photos and {f} texts")
        if self.stats is not None and self.stats.shape != (m, STAT_COLUMNS):
            self.stats = None
        self.photos, self.texts = m, f
        self.info = ProductInfo.load(self.path / PRODUCTS_FILE)
        self._photo_owners = photo_owners.tolist()
        self._by_image: dict[bytes, int] | None = None
        self._by_owner_image: dict[tuple[int, bytes], list[int]] = {}
        # A value's own row first (equal values of several products were encoded in other batches: the
        # last bits may differ), else the first of equal values. Equal values of one product (an untagged
        # field identified as the language another of its values is tagged with) take its equal rows in
        # order (``photo_rows_of``).
        self._by_text: dict[TextKey, int] = {}
        self._by_owner_text: dict[tuple[int, TextKey], list[int]] = {}
        for row in range(f):
            field, lang, text = values[row]
            key = (str(field), str(lang or "und"), str(text))
            self._by_text.setdefault(key, row)  # the first of equal values of several products
            self._by_owner_text.setdefault((int(text_owners[row]), key), []).append(row)

    @classmethod
    def open(cls, path: Path, manifest: IndexManifest, key: str) -> StoredProductVectors | None:
        """The product channels of the version at ``path`` when stored under reuse key ``key`` with
        digests; else None (nothing of them is reusable)."""
        if manifest.build_params.get(REUSE_KEY) != key:
            return None
        if not has_product_channels(path) or not has_product_digests(path):
            return None
        return cls(path)

    @property
    def has_visual(self) -> bool:
        return self._visual is not None

    # The interface ``indexer.incremental.digest_and_stat`` reads of a version's stored rows.
    def rows_by_stat(self) -> dict[bytes, int]:
        """{file stats (``store.version.reuse.stat_key``): photo row} of the photos whose stats were
        recorded."""
        if self.stats is None:
            return {}
        known = np.flatnonzero(self.stats.any(axis=1))
        keys, width = np.ascontiguousarray(self.stats[known], np.int64).tobytes(), STAT_COLUMNS * 8
        return {keys[k * width : (k + 1) * width]: row for k, row in enumerate(known.tolist())}

    def photo_rows_of(self, digests: Sequence[bytes], owners: Sequence[int]) -> list[int]:
        """The photo row encoded from a file with each content digest, of its product row (``owners``, -1:
        none) where it has one, else the first; -1 when none is. One to one within a product: its equal
        files take its equal rows in order (the first the first, the second the second), so that a product
        with two photos of the very same bytes carries two rows over, not one row twice (the calibration's
        count of changed rows, ``indexer.product_reuse.taken_over_calibration``); a further one than the
        parent held shares the product's first."""
        if self._by_image is None:
            keys = self.images.tobytes()
            self._by_image = {}
            for row in range(self.photos):
                digest_of = keys[row * DIGEST_BYTES : (row + 1) * DIGEST_BYTES]
                self._by_image.setdefault(digest_of, row)  # the first of equal photos
                self._by_owner_image.setdefault((self._photo_owners[row], digest_of), []).append(row)
        return _given_out(self._by_owner_image, self._by_image, list(zip(owners, digests, strict=True)))

    def text_rows_of(self, keys: Sequence[TextKey], owners: Sequence[int]) -> list[int]:
        """The text row of a value with each (field, language, text), of its product row (``owners``)
        where it has one, else the first; -1 when none is. One to one within a product, as
        ``photo_rows_of``."""
        return _given_out(self._by_owner_text, self._by_text, list(zip(owners, keys, strict=True)))

    def photo_vectors(self, rows: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(m, D) cross-modal and (m, V) visual embeddings (None: the version has none) of photo rows."""
        rows = np.asarray(rows, np.int64)
        visual = None if self._visual is None else np.array(self._visual[rows], np.float32)
        return np.array(self._embeds[rows], np.float32), visual

    def text_vectors(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        return np.array(self._texts[np.asarray(rows, np.int64)], np.float32)

    def check_photos(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """(m,) bool: whether each photo row's stored vectors still match its stored checksum; read and
        hashed ``CHECK_CHUNK`` rows at a time (a million photos' vectors are gigabytes)."""
        rows = np.asarray(rows, np.int64)
        good = np.zeros(rows.size, bool)
        for lo in range(0, rows.size, CHECK_CHUNK):
            part = rows[lo : lo + CHECK_CHUNK]
            embeds, visual = self.photo_vectors(part)
            good[lo : lo + part.size] = (photo_row_digests(embeds, visual) == self.photo_digests[part]).all(1)
        return good

    def check_texts(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """(m,) bool: whether each text row's stored embedding still matches its stored checksum; read and
        hashed ``CHECK_CHUNK`` rows at a time."""
        rows = np.asarray(rows, np.int64)
        good = np.zeros(rows.size, bool)
        for lo in range(0, rows.size, CHECK_CHUNK):
            part = rows[lo : lo + CHECK_CHUNK]
            good[lo : lo + part.size] = (
                text_row_digests(self.text_vectors(part)) == self.text_digests[part]
            ).all(axis=1)
        return good

    def close(self) -> None:
        self._embeds = self._texts = np.zeros((0, 0), np.float32)
        self._visual = None


def _given_out(
    own: dict[tuple[int, K], list[int]], first: dict[K, int], wanted: list[tuple[int, K]]
) -> list[int]:
    """Each (owner, key)'s row: the owner's rows with that key given out in order, one each; past them the
    owner's first; an owner without one: the first of any owner's (``first``); -1 when none holds it."""
    taken: dict[tuple[int, K], int] = {}
    out = []
    for owner, key in wanted:
        rows = own.get((owner, key)) if owner >= 0 else None
        if not rows:
            out.append(first.get(key, -1))
            continue
        n = taken.get((owner, key), 0)
        taken[(owner, key)] = n + 1
        out.append(rows[n] if n < len(rows) else rows[0])
    return out


def read_photo_digests(version_dir: Path) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The (M, 16) photo content digests and (M, 5) file stats of a version's channels, as stored (an
    ``add`` carries them over); (None, None) without digests, stats None when not recorded."""
    folder = Path(version_dir)
    if not has_product_digests(folder):
        return None, None
    try:
        images = np.load(folder / PHOTO_DIGESTS)
        stats = np.load(folder / PHOTO_STATS) if (folder / PHOTO_STATS).is_file() else None
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"cannot read the photo digests of {folder}: {exc}") from exc
    if stats is not None and stats.shape != (images.shape[0], STAT_COLUMNS):
        stats = None
    return images, stats
