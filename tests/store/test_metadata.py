"""metadata.sqlite: written and read whole, filters translated to SQL (every malformed filter a
FilterError naming its field), and the read-only view a reader searches through, old files included."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from store.errors import FilterError
from store.version.metadata import (
    MAX_FIELD_INDEXES,
    MetadataReader,
    field_expr,
    fields_json,
    filter_sql,
    read_metadata,
    write_metadata,
)

ROWS = [
    (0, "a", "img/a.jpg", {"colour": "red", "price": 3.5, "name": "Süß 赤"}, False),
    (1, "b", None, {"colour": "blue", "price": 10}, True),
    (2, "c", "img/c.jpg", {"colour": "red", "price": 12}, False),
    (3, "d", "img/d.jpg", {}, False),
]


def test_written_rows_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    write_metadata(path, iter(ROWS))
    assert read_metadata(path) == ROWS
    write_metadata(path, iter(ROWS[:1]))  # an existing file is replaced, not appended to
    assert read_metadata(path) == ROWS[:1]


def test_rows_carried_as_stored_text_are_written_as_they_are(tmp_path: Path) -> None:
    # A rebuild carries a parent's rows without parsing their fields (read raw, written as text, with
    # the field names the caller knows): the same file content as writing the parsed rows.
    path, again = tmp_path / "metadata.sqlite", tmp_path / "again.sqlite"
    write_metadata(path, iter(ROWS))
    raw = read_metadata(path, raw=True)
    assert [r[:3] + r[4:] for r in raw] == [r[:3] + r[4:] for r in ROWS]
    assert all(isinstance(r[3], str) for r in raw) and raw[0][3] == fields_json(ROWS[0][3])
    write_metadata(again, raw, text_names={"colour", "price", "name"})
    assert read_metadata(again) == ROWS
    reader = MetadataReader(again)
    try:
        assert reader.field_names() == {"colour", "price", "name"}
        assert reader.rows_matching({"colour": "red"}, reader.field_names()).tolist() == [0, 2]
    finally:
        reader.close()


def test_one_expression_index_per_field_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    fields = {f"f{i:03d}": i for i in range(MAX_FIELD_INDEXES + 6)}
    write_metadata(path, [(0, "x", None, fields, False)])
    con = sqlite3.connect(path)
    try:
        names = {n for (n,) in con.execute("SELECT name FROM field_names")}
        (indexes,) = con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'ix_field_%'").fetchone()
    finally:
        con.close()
    assert names == set(fields) and indexes == MAX_FIELD_INDEXES


def test_filters_become_sql_or_a_filter_error_naming_the_field() -> None:
    fields = {"colour", "price"}
    sql, args = filter_sql({"colour": ["red", "blue"], "price": {"gte": 3, "lt": 11}}, fields)
    assert sql.startswith("SELECT row FROM items WHERE deleted = 0 AND ") and sql.endswith("ORDER BY row")
    assert args == ["red", "blue", 3, 11]
    with pytest.raises(FilterError, match=r"'size' \(known fields: colour, price\)"):
        filter_sql({"size": 1}, fields)
    for bad in ({"price": {"between": 1}}, {"price": {}}, {"price": {"gte": True}}, {"price": {"lt": "9"}}):
        with pytest.raises(FilterError, match="'price'"):
            filter_sql(bad, fields)
    for bad in ({"colour": []}, {"colour": [["red"]]}, {"colour": None}):
        with pytest.raises(FilterError, match="'colour'"):
            filter_sql(bad, fields)
    with pytest.raises(FilterError, match="invalid field name"):
        field_expr('a"b')


def test_the_reader_view_serves_items_rows_and_filters(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    write_metadata(path, ROWS)
    meta = MetadataReader(path)
    try:
        assert meta.row_count() == 4 and meta.deleted_rows().tolist() == [1]
        assert meta.field_names() == {"colour", "price", "name"}
        assert meta.items([2, 0, 9]) == {
            2: {"id": "c", "path": "img/c.jpg", "colour": "red", "price": 12},
            0: {"id": "a", "path": "img/a.jpg", "colour": "red", "price": 3.5, "name": "Süß 赤"},
        }
        assert meta.row_of("c") == 2 and meta.row_of("b") is None and meta.row_of("zz") is None
        fields = meta.field_names()
        np.testing.assert_array_equal(meta.rows_matching({"colour": "red"}, fields), [0, 2])
        np.testing.assert_array_equal(meta.rows_matching({"price": {"gt": 5}}, fields), [2])  # 1 is deleted
    finally:
        meta.close()


def test_a_file_without_field_names_lists_the_items_keys(tmp_path: Path) -> None:
    """An early file lacks the field_names table: the names come from the items themselves."""
    path = tmp_path / "metadata.sqlite"
    write_metadata(path, ROWS)
    con = sqlite3.connect(path)
    con.execute("DROP TABLE field_names")
    con.commit()
    con.close()
    meta = MetadataReader(path)
    try:
        assert meta.field_names() == {"colour", "price", "name"}
    finally:
        meta.close()
