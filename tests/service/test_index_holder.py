"""The served version's metadata row cache: same answers as the format module's reader, bounded, copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer import index_format as fmt
from service.index_holder import Served
from tests.service.conftest import INDEX_NAME


def test_item_cache_answers_like_sqlite_and_stays_bounded(index_root: Path) -> None:
    index = fmt.IndexVersion.open(index_root, INDEX_NAME)
    try:
        served = Served(index, item_cache_rows=5)
        rows = [3, 0, 7, 3, 1]
        assert served.items(rows) == index.items(rows)
        assert served.items(rows) == index.items(rows)  # now from the cache
        assert len(served._items) == 4

        first = served.items([3])[0]
        first.pop("id")  # a caller changing its copy (the search route pops id and path)
        assert served.items([3])[0]["id"] == index.items([3])[0]["id"]

        wide = list(range(10, 22))
        assert served.items(wide) == index.items(wide)  # more rows than the cache holds: still all right
        assert len(served._items) == 12  # the older rows made room; one batch may overshoot the bound
        served.items([0, 1])
        assert list(served._items) == [19, 20, 21, 0, 1] and served.items([2, 1]) == index.items([2, 1])

        with pytest.raises(fmt.IndexFormatError):
            served.items([0, 10**6])
    finally:
        index.close()
