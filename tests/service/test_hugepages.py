"""Huge pages for what a serving process keeps (``service.hugepages``) and when the runtime asks for them."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import pytest

from service import hugepages
from service.hugepages import HUGE_PAGE, _anonymous_ranges, advise_huge_pages
from service.metrics import Metrics
from service.runtime import Runtime
from tests.fixtures import make_settings

MB = 1024 * 1024
MAPS = """\
55d0c0000000-55d0c1200000 rw-p 00000000 00:00 0                          [heap]
7f0000100000-7f0001300000 rw-p 00000000 00:00 0
7f0002000000-7f0004000000 r--p 00000000 00:00 0
7f0004000000-7f0006000000 rw-s 00000000 00:05 12                         /dev/zero (deleted)
7f0006000000-7f0008000000 rw-p 00000000 08:01 4242                       /data/embeddings.npy
7f0008000000-7f0008300000 rw-p 00000000 00:00 0
7ffc00000000-7ffc02000000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_large_private_writable_anonymous_mappings_aligned_to_huge_pages() -> None:
    ranges = list(_anonymous_ranges(MAPS, 4 * MB))
    # The heap (18 MiB, aligned: all of it); the anonymous 18 MiB mapping from 1 MiB in: its aligned part
    # [2 MiB, 18 MiB), 16 MiB. Not: read-only, shared, a file, the stack, nor 3 MiB (under the minimum).
    assert ranges == [
        (0x55D0C0000000, 0x1200000),
        (0x7F0000200000, 0x1000000),
    ]
    assert all(start % HUGE_PAGE == 0 and length % HUGE_PAGE == 0 for start, length in ranges)
    assert list(_anonymous_ranges(MAPS, 64 * MB)) == []


def test_nothing_advised_where_there_is_no_madvise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hugepages, "_madvise", lambda: None)
    assert advise_huge_pages() == 0


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    found = re.search(r"\[(\w+)\]", text)
    return found.group(1) if found else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
def test_a_large_anonymous_mapping_is_advised_and_keeps_its_bytes() -> None:
    size = 24 * MB
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pattern = bytes(range(256)) * (size // 256)
        area[:] = pattern
        advised = advise_huge_pages(min_bytes=16 * MB)
        if _thp_mode() in (None, "never"):
            pytest.skip("transparent huge pages are off here")
        assert advised >= 16 * MB  # at least the aligned part of this mapping
        assert area[:] == pattern  # same bytes, collapsed or not
    finally:
        area.close()


def test_the_runtime_advises_only_when_the_setting_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr("service.runtime.advise_huge_pages", lambda: calls.append(1) or 0)
    off = Runtime(make_settings(tmp_path, huge_pages=False), Metrics())
    off._huge_pages()
    assert calls == [] and not off._pages_advised
    on = Runtime(make_settings(tmp_path), Metrics())
    on._huge_pages()
    assert calls == [1] and on._pages_advised
