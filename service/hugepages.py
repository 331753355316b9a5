"""Transparent huge pages for what a serving process keeps for its whole life: the model's weights, the ANN
index, the language detector's tables.

A text search is bound by memory latency more than by arithmetic: it walks tens of megabytes at random (the
HNSW graph and its vectors, py3langid's automaton and feature table, the word table, the encoder's weights),
one after another, so each stage finds the previous stage's data in the caches and TLB instead of its own.
With 4 KiB pages, every one of those cache misses is also a TLB miss; with 2 MiB pages most are not. Where
the kernel's THP mode is ``madvise`` (the usual default) nothing gets huge pages unless asked, so after
startup every large private anonymous mapping of the process is advised (``MADV_HUGEPAGE``) and, on kernels
that have it (6.1+), collapsed into huge pages at once (``MADV_COLLAPSE``) rather than over minutes by
khugepaged. Best effort: on another OS, libc or kernel nothing changes. The contents are the same bytes, so
answers are the same.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


@cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        madvise = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def _anonymous_ranges(maps: str, min_bytes: int) -> Iterator[tuple[int, int]]:
    """The 2 MiB-aligned parts of the private, writable, anonymous mappings (the heap included) of at least
    ``min_bytes`` in a ``/proc/<pid>/maps`` text: (start, length)."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or fields[1][:2] != "rw" or fields[1][3] != "p":
            continue
        path = fields[5].strip() if len(fields) > 5 else ""
        if path not in ("", "[heap]"):
            continue  # files, stacks, vdso
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start = -(-low // HUGE_PAGE) * HUGE_PAGE
        end = high // HUGE_PAGE * HUGE_PAGE
        if end - start >= max(min_bytes, HUGE_PAGE):
            yield start, end - start


def advise_huge_pages(min_bytes: int = 8 * HUGE_PAGE, collapse: bool = True) -> int:
    """Advise (and collapse) the process's large anonymous mappings; returns the bytes advised (0 where it
    cannot)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return 0
    advised = 0
    for start, length in _anonymous_ranges(maps, min_bytes):
        if madvise(start, length, MADV_HUGEPAGE) != 0:
            continue  # THP off in this kernel, or a mapping that went away meanwhile
        advised += length
        if collapse:
            madvise(start, length, MADV_COLLAPSE)  # EINVAL before 6.1: khugepaged does it later
    return advised
