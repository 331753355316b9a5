"""The analysed terms of a version's product text values as 64-bit hashes, one run per text row
(``text_term_hashes.npy`` and its row offsets ``text_term_offsets.npy``, written since 27 Nov 2026 beside
``products.sqlite``): which of a query's terms a candidate's text value holds is then one array comparison
over the few rows a query asks about, memory-mapped, instead of a SQLite look-up and a split per row (at
100k products 0.2-0.6 ms of a hybrid query's CPU, its largest part after the graph walks).

A version written before has no such files; ``store.products.channels.ProductChannels`` then reads the terms
from
``products.sqlite`` as before. Two distinct terms share a hash with probability ~2^-64 per pair.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from store.files import names_full_disk
from store.products.vectors import concat_ranges

TERM_HASHES = "text_term_hashes.npy"
TERM_OFFSETS = "text_term_offsets.npy"


def term_hash(term: str) -> int:
    """A term's stable 64-bit hash (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest(), "little")


def hash_terms(terms: Sequence[str]) -> np.ndarray:
    return np.fromiter((term_hash(t) for t in terms), np.uint64, count=len(terms))


def write_term_hashes(stage: Path, rows: Sequence[Sequence[str]]) -> None:
    """Write the hashes of every text row's terms (as stored in ``products.sqlite``) into a staged version."""
    cache: dict[str, int] = {}  # a catalogue repeats its words: hash each distinct term once
    counts = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])

    def hashed(term: str) -> int:
        value = cache.get(term)
        if value is None:
            value = cache[term] = term_hash(term)
        return value

    hashes = np.fromiter((hashed(t) for row in rows for t in row), np.uint64, count=int(offsets[-1]))
    for name, array in ((TERM_HASHES, hashes), (TERM_OFFSETS, offsets)):
        with names_full_disk(Path(stage) / name):
            np.save(Path(stage) / name, array)


class TermHashes:
    """The term hashes of an opened version (read-only, memory-mapped; thread-safe)."""

    def __init__(self, hashes: np.ndarray, offsets: np.ndarray) -> None:
        # Plain array views of the mapped files: numpy's memmap subclass adds Python work to every index.
        self.hashes = np.asarray(hashes)
        self.offsets = np.asarray(offsets)

    @classmethod
    def open(
        cls, version_dir: Path, rows: int, mapper: Callable[[Path], np.ndarray] | None = None
    ) -> TermHashes | None:
        """The version's term hashes; None when it was written without them. Raises ``ValueError`` or
        ``OSError`` on unreadable files, or on offsets that do not cover ``rows`` rows. ``mapper`` maps a
        file (``store.guard.FileGuard.map_array``: size-checked and watched), default ``np.load``'s."""
        folder = Path(version_dir)
        if not (folder / TERM_HASHES).is_file():
            return None
        load = mapper or (lambda path: np.load(path, mmap_mode="r"))
        hashes = load(folder / TERM_HASHES)
        offsets = load(folder / TERM_OFFSETS)
        if hashes.dtype != np.uint64 or offsets.dtype != np.int64 or hashes.ndim != 1:
            raise ValueError(f"{TERM_HASHES} / {TERM_OFFSETS}: expected 1-d uint64 hashes and int64 offsets")
        if offsets.shape != (rows + 1,) or int(offsets[0]) != 0 or int(offsets[-1]) != hashes.size:
            raise ValueError(f"{TERM_OFFSETS} covers {offsets.size - 1} text rows, expected {rows}")
        return cls(hashes, offsets)

    def presence(self, text_rows: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        """(rows, terms) bool: whether each text row (>= 0) holds each term."""
        rows = np.asarray(text_rows, np.int64)
        present = np.zeros((rows.size, len(terms)), bool)
        if not rows.size or not terms:
            return present
        lo = self.offsets[rows]
        counts = self.offsets[rows + 1] - lo
        total = int(counts.sum())
        if total == 0:
            return present
        positions, firsts = concat_ranges(lo, counts)
        equal = self.hashes[positions][:, None] == hash_terms(terms)[None, :]
        held = np.flatnonzero(counts > 0)
        present[held] = np.logical_or.reduceat(equal, firsts[held], axis=0)
        return present
