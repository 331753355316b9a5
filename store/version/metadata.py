"""A version's item metadata (``metadata.sqlite``): the schema, writing and reading it whole, the
translation of search filters into SQL, and the thread-safe read-only view a reader searches through."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from store.errors import FilterError

# (row, id, path, fields, deleted): one item as written and read whole.
MetadataRow = tuple[int, str, str | None, dict[str, Any], bool]
# The same with its fields as metadata.sqlite holds them (JSON text, or None): rows carried from one version
# to the next without parsing and re-encoding every row's fields (``read_metadata(raw=True)``).
StoredRow = tuple[int, str, str | None, str | None, bool]

METADATA_SCHEMA = """
CREATE TABLE items(
    row INTEGER PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    path TEXT,
    fields TEXT,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE field_names(name TEXT PRIMARY KEY);
"""
MAX_FIELD_INDEXES = 64  # expression indexes: one per field name, the first 64 in sorted order
RANGE_OPS = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}


def field_expr(name: str) -> str:
    """SQL expression of one metadata field (a literal JSON path, so expression indexes can serve it)."""
    if '"' in name or any(ord(c) < 32 for c in name) or not name:
        raise FilterError(f"invalid field name {name!r}")
    return "json_extract(fields, '$.\"" + name.replace("'", "''") + "\"')"


# json.dumps(fields, ensure_ascii=False), without building an encoder per row.
_FIELDS_JSON = json.JSONEncoder(ensure_ascii=False)


def fields_json(fields: dict[str, Any]) -> str:
    """A row's fields as metadata.sqlite stores them."""
    return _FIELDS_JSON.encode(fields)


def write_metadata(
    path: Path, items: Iterable[MetadataRow | StoredRow], *, text_names: Iterable[str] = ()
) -> None:
    """Write metadata.sqlite from (row, id, path, fields, deleted) tuples, with an index per field. Fields
    given as text (``StoredRow``, ``fields_json``) are stored as they are; ``text_names``: their field
    names (the caller knows them; they are not parsed here).

    A new file in a version being staged: no rollback journal and no syncs of its own (a failure discards
    the whole stage, and installing the version fsyncs every file of it)."""
    path = Path(path)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.executescript(METADATA_SCHEMA)
        names: set[str] = set(text_names)
        encode = _FIELDS_JSON.encode

        def rows() -> Iterable[tuple[int, str, str | None, str | None, int]]:
            for row, item_id, item_path, fields, deleted in items:
                if fields is None or isinstance(fields, str):
                    yield row, item_id, item_path, fields, int(deleted)
                    continue
                names.update(fields)
                yield row, item_id, item_path, encode(fields), int(deleted)

        con.executemany("INSERT INTO items(row, id, path, fields, deleted) VALUES (?, ?, ?, ?, ?)", rows())
        con.executemany("INSERT INTO field_names(name) VALUES (?)", [(n,) for n in sorted(names)])
        for i, n in enumerate(sorted(names)[:MAX_FIELD_INDEXES]):
            con.execute(f"CREATE INDEX ix_field_{i} ON items({field_expr(n)})")
        con.commit()
    finally:
        con.close()


@overload
def read_metadata(path: Path, raw: Literal[False] = False) -> list[MetadataRow]: ...
@overload
def read_metadata(path: Path, raw: Literal[True]) -> list[StoredRow]: ...


def read_metadata(path: Path, raw: bool = False) -> list[MetadataRow] | list[StoredRow]:
    """All (row, id, path, fields, deleted) of a metadata.sqlite, by row (for add/delete/rebuilds);
    ``raw``: the fields as stored (``StoredRow``), not parsed."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        query = con.execute("SELECT row, id, path, fields, deleted FROM items ORDER BY row")
        if raw:
            return [(r, i, p, f, bool(d)) for r, i, p, f, d in query]
        return [(r, i, p, json.loads(f) if f else {}, bool(d)) for r, i, p, f, d in query]
    finally:
        con.close()


def filter_sql(filters: dict[str, Any], fields: set[str]) -> tuple[str, list[Any]]:
    """The query for the sorted live rows matching every filter, and its arguments: {field: value}
    equality, {field: [v1, v2]} any-of, {field: {"gte": x, "lte": y}} numeric range (also gt/lt).
    FilterError (naming the field) for a field not in ``fields`` or a malformed condition."""
    clauses: list[str] = ["deleted = 0"]
    args: list[Any] = []
    for name, cond in filters.items():
        if name not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise FilterError(f"unknown filter field {name!r} (known fields: {known})")
        expr = field_expr(name)
        if isinstance(cond, dict):
            if not cond or set(cond) - RANGE_OPS.keys():
                raise FilterError(
                    f"filter on {name!r}: range keys must be among gte, gt, lte, lt, got {sorted(cond)}"
                )
            for op, value in cond.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise FilterError(f"filter on {name!r}: {op} needs a number, got {value!r}")
                clauses.append(f"typeof({expr}) IN ('integer', 'real') AND {expr} {RANGE_OPS[op]} ?")
                args.append(value)
        elif isinstance(cond, list | tuple):
            if not cond or not all(isinstance(v, str | int | float | bool) for v in cond):
                raise FilterError(f"filter on {name!r}: any-of needs a non-empty list of scalars")
            clauses.append(f"{expr} IN ({','.join('?' * len(cond))})")
            args.extend(cond)
        elif isinstance(cond, str | int | float | bool):
            clauses.append(f"{expr} = ?")
            args.append(cond)
        else:
            raise FilterError(f"filter on {name!r}: unsupported value {cond!r}")
    return f"SELECT row FROM items WHERE {' AND '.join(clauses)} ORDER BY row", args


def _sql_value(value: Any) -> Any:
    """A field's value as ``json_extract`` hands it to SQL: true/false as 1/0, an array or object as its
    minified JSON text, anything else as it is (None: SQL NULL)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return value


def _sql_equal(value: Any, wanted: Any) -> bool:
    """SQL ``=`` between a field's value and a bound filter value (a bool binds as 1/0): numbers equal by
    value, text by its characters, a number never equal to a text, NULL to nothing."""
    value, wanted = _sql_value(value), _sql_value(wanted)
    if value is None or wanted is None:
        return False
    if isinstance(value, str) or isinstance(wanted, str):
        return isinstance(value, str) and isinstance(wanted, str) and value == wanted
    return bool(value == wanted)


def fields_match(fields: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Whether one row's fields match every filter, exactly as ``filter_sql``'s query decides it for a
    stored row: a row whose fields changed since the version was written (``store.live``) is matched in
    memory, and must match as the version's own rows do. The filters are checked by ``filter_sql`` first."""
    for name, cond in filters.items():
        value = fields.get(name)
        if isinstance(cond, dict):
            number = _sql_value(value)
            if not isinstance(number, int | float) or isinstance(number, bool):
                return False
            for op, bound in cond.items():
                if not {
                    "gte": number >= bound,
                    "gt": number > bound,
                    "lte": number <= bound,
                    "lt": number < bound,
                }[op]:
                    return False
        elif isinstance(cond, list | tuple):
            if not any(_sql_equal(value, wanted) for wanted in cond):
                return False
        elif not _sql_equal(value, cond):
            return False
    return True


JSON_KINDS = {"integer": "number", "real": "number", "true": "bool", "false": "bool"}


def kind_of(value: Any) -> str | None:
    """A JSON value's kind as ``MetadataReader.field_kinds`` names them: number, bool, text, array, object
    (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "array" if isinstance(value, list | tuple) else "object"


class MetadataReader:
    """One published metadata.sqlite, opened read-only and immutable (a published version never changes);
    one connection shared by threads under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True, check_same_thread=False)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def deleted_rows(self) -> np.ndarray:
        with self._lock:
            return np.fromiter(
                (r for (r,) in self._db.execute("SELECT row FROM items WHERE deleted != 0")), dtype=np.int64
            )

    def field_names(self) -> set[str]:
        """Names that filters may use (from the items themselves for a file without ``field_names``)."""
        with self._lock:
            try:
                return {r for (r,) in self._db.execute("SELECT name FROM field_names")}
            except sqlite3.OperationalError:
                return {
                    r for (r,) in self._db.execute("SELECT DISTINCT key FROM items, json_each(items.fields)")
                }

    def row_count(self) -> int:
        """Rows in the table, deleted ones included."""
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM items").fetchone()
        return int(n)

    def items(self, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
        """{"id", "path", **fields} of those of ``rows`` that exist, by row."""
        found: dict[int, dict[str, Any]] = {}
        with self._lock:
            for start in range(0, len(rows), 500):
                chunk = list(rows[start : start + 500])
                marks = ",".join("?" * len(chunk))
                for row, item_id, path, fields in self._db.execute(
                    f"SELECT row, id, path, fields FROM items WHERE row IN ({marks})", chunk
                ):
                    found[row] = {"id": item_id, "path": path, **(json.loads(fields) if fields else {})}
        return found

    def row_of(self, item_id: str) -> int | None:
        """The live row of ``item_id`` (None when unknown or deleted)."""
        with self._lock:
            hit = self._db.execute(
                "SELECT row FROM items WHERE id = ? AND deleted = 0", (item_id,)
            ).fetchone()
        return None if hit is None else int(hit[0])

    def field_kinds(self, name: str) -> set[str]:
        """The kinds of value (``kind_of``) field ``name`` holds in the live rows: what a write of that
        field must agree with. A scan of the table (tens of ms at 100k rows): callers keep the answer."""
        kind = field_expr(name).replace("json_extract(", "json_type(", 1)
        sql = f"SELECT DISTINCT {kind} FROM items WHERE deleted = 0"
        with self._lock:
            found = {t for (t,) in self._db.execute(sql) if t is not None and t != "null"}
        return {JSON_KINDS.get(t, t) for t in found}

    def rows_matching(self, filters: dict[str, Any], fields: set[str]) -> np.ndarray:
        """Sorted live rows matching every filter (``filter_sql``)."""
        sql, args = filter_sql(filters, fields)
        with self._lock:
            return np.fromiter((r for (r,) in self._db.execute(sql, args)), dtype=np.int64)
