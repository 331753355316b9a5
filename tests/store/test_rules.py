"""The rules file of an index (``store.rules``): written atomically beside the versions, read back as written,
its etag and signature changing with its content, and files that are not rules files refused by name."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from store.errors import IndexFormatError
from store.layout import file_signature, index_dir
from store.rules import (
    EMPTY,
    RULES_FILE,
    read_rules,
    read_rules_file,
    rules_beside,
    rules_lock,
    rules_path,
    write_rules,
)

RULE = {"id": "shoes", "query": "running shoes", "threshold": 0.8, "actions": [{"hide": {"brand": "x"}}]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    index_dir(tmp_path, "shop").mkdir()
    return tmp_path


def test_no_file_reads_as_no_rules(root: Path) -> None:
    assert read_rules(root, "shop") == EMPTY and EMPTY.etag == ""
    assert file_signature(rules_path(root, "shop")) is None


def test_written_rules_read_back_with_a_new_etag_per_content(root: Path) -> None:
    first = write_rules(root, "shop", [RULE])
    again = read_rules(root, "shop")
    assert again.rules == (RULE,) and again.etag == first.etag and again.signature == first.signature
    assert again.get("shoes") == RULE and again.get("other") is None
    second = write_rules(root, "shop", [RULE, {**RULE, "id": "b"}])
    assert second.etag != first.etag and second.signature != first.signature
    assert [r["id"] for r in read_rules(root, "shop").rules] == ["shoes", "b"]
    emptied = write_rules(root, "shop", [])
    assert read_rules(root, "shop").rules == () and emptied.etag not in ("", first.etag)


def test_the_file_sits_beside_the_versions(root: Path) -> None:
    write_rules(root, "shop", [RULE])
    version = index_dir(root, "shop") / "20261201T000000Z-abcdef"
    assert rules_beside(version) == index_dir(root, "shop") / RULES_FILE == rules_path(root, "shop")
    assert not list(index_dir(root, "shop").glob(".rules.json.*.tmp"))  # no temp file left behind


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"format": 2, "rules": []}',
        b'{"format": 1, "rules": {}}',
        b'{"format": 1, "rules": [1]}',
        b'{"format": 1, "rules": [{"query": "no id"}]}',
        b'{"format": 1, "rules": [{"id": "a"}, {"id": "a"}]}',
    ],
)
def test_a_file_that_is_not_a_rules_file_is_refused_by_name(root: Path, content: bytes) -> None:
    path = rules_path(root, "shop")
    path.write_bytes(content)
    with pytest.raises(IndexFormatError, match=RULES_FILE):
        read_rules_file(path)


def test_rules_are_written_only_for_an_existing_index(tmp_path: Path) -> None:
    with pytest.raises(IndexFormatError, match="no index"):
        write_rules(tmp_path, "absent", [RULE])
    with pytest.raises(IndexFormatError, match="no index"), rules_lock(tmp_path, "absent"):
        pass


def test_the_lock_holds_one_writer_at_a_time(root: Path) -> None:
    order: list[str] = []
    entered = threading.Event()

    def other() -> None:
        with rules_lock(root, "shop"):
            order.append("other")

    with rules_lock(root, "shop"):
        thread = threading.Thread(target=other)
        thread.start()
        entered.wait(0.2)  # the other writer is blocked on the lock meanwhile
        order.append("first")
    thread.join(5)
    assert order == ["first", "other"]
