"""Fuzzed manifests (hypothesis): JSONL and CSV files of rows with values a manifest should not hold (lone
surrogates, bytes that are not UTF-8, NaN and Infinity, huge numbers, deep nesting, NUL bytes, odd field
names), further mangled byte-wise, and the check every one must pass: read, it is refused with a
``SourceError`` naming the file, or its items are what the build writes (metadata.sqlite and its size
estimate, file stats, the plan hash) without an error. Shared by tests/indexer/test_sources.py (a few
hundred cases) and bench/manifest_fuzz.py (10,000)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from indexer import disk
from indexer.errors import SourceError
from indexer.shards import plan_hash
from indexer.sources import read_sources
from store.version.metadata import write_metadata
from store.version.reuse import FileStats

# Characters, lone surrogates among them (hypothesis leaves those out of text by default).
CHARS = st.one_of(
    st.characters(),
    st.integers(0xD800, 0xDFFF).map(chr),
    st.sampled_from(["\0", '"', "\\", "'", "@", ".", "$", "[", "\n", "\r", ","]),
)
# Mostly plain text (so that most rows get as far as being written), one time in four with odd characters.
PLAIN = st.text(st.characters(), max_size=12)
TEXT = st.one_of(PLAIN, PLAIN, PLAIN, st.text(CHARS, max_size=12))
NAMES = st.one_of(
    st.sampled_from(["title", "title@de", "price", "tags", "attrs", "captions", "image", "paths"]), TEXT
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=8,
)
PATHS = st.one_of(st.just("a.jpg"), st.just("photos/b.png"), TEXT)
CELLS = st.one_of(
    TEXT,
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "00123", "-0", "1.5", "9" * 5000, ""]),
    st.integers(-(2**70), 2**70).map(str),
)


@st.composite
def rows(draw: Any, n: int) -> dict[str, Any]:
    """Row ``n`` of a manifest: mostly with an id and a path (so that most rows are read and written), now
    and then without, or with odd ones."""
    row: dict[str, Any] = {}
    kind = draw(st.integers(0, 7))
    if kind < 5:
        row["id"] = f"item-{n}" if kind < 3 else draw(TEXT) + f"-{n}"
    elif kind == 5:
        row["id"] = draw(st.one_of(st.integers(-(2**70), 2**70), VALUES))
    if draw(st.integers(0, 7)):
        row["path"] = draw(PATHS)
    if draw(st.integers(0, 4)) == 0:
        row["paths"] = draw(st.one_of(st.lists(PATHS, max_size=3), VALUES))
    row.update(draw(st.dictionaries(NAMES, VALUES, max_size=4)))
    return row


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate: bytes that are not UTF-8


@st.composite
def mangled(draw: Any, data: bytes) -> bytes:
    """``data`` as it is, or with a few bytes inserted, replaced or cut."""
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["insert", "replace", "cut"]))
        junk = draw(st.binary(min_size=1, max_size=4))
        if how == "insert":
            data = data[:at] + junk + data[at:]
        elif how == "replace":
            data = data[:at] + junk + data[at + len(junk) :]
        else:
            data = data[:at]
    return data


@st.composite
def jsonl_files(draw: Any) -> bytes:
    lines: list[bytes] = []
    for n in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 11))
        if kind == 0:
            lines.append(draw(st.binary(max_size=40)))
        elif kind == 1:
            depth = draw(st.integers(1, 3000))
            lines.append(b'{"id": "d", "path": "a.jpg", "deep": ' + b"[" * depth + b"]" * depth + b"}")
        else:
            row = draw(rows(n))
            ascii_only = draw(st.booleans())
            lines.append(_encode(json.dumps(row, ensure_ascii=ascii_only, allow_nan=True)))
    return draw(mangled(b"\n".join(lines)))


@st.composite
def csv_files(draw: Any) -> bytes:
    extra = draw(st.lists(NAMES, max_size=3))
    header = draw(st.permutations(["id", "path", *extra])) if draw(st.integers(0, 5)) else extra
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for n in range(draw(st.integers(0, 3))):
        width = len(header) + draw(st.sampled_from([0, 0, 0, 0, 0, -1, 1]))
        cells = draw(st.lists(CELLS, min_size=max(0, width), max_size=max(0, width)))
        for column, name in enumerate(header[: len(cells)]):
            if name == "id" and draw(st.integers(0, 3)):
                cells[column] = f"item-{n}"  # mostly an id of its own, so that most rows are read
            elif name == "path" and draw(st.integers(0, 3)):
                cells[column] = "a.jpg"
        writer.writerow(cells)
    return draw(mangled(_encode(out.getvalue())))


MANIFESTS = st.one_of(jsonl_files().map(lambda b: (".jsonl", b)), csv_files().map(lambda b: (".csv", b)))


def check_manifest(suffix: str, data: bytes) -> str:
    """'refused' (a SourceError naming the file) or 'accepted' (and written as a build writes it); any
    other exception propagates: a traceback the CLI would show."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / f"manifest{suffix}"
        manifest.write_bytes(data)
        try:
            scan = read_sources([manifest])
        except SourceError as exc:
            if str(manifest) not in str(exc):
                raise AssertionError(f"the message does not name the file: {exc}") from exc
            return "refused"
        items = scan.items
        disk.metadata_bytes(items, len(items))
        FileStats.take([p for it in items for p in (it.path, *it.extra_paths)])
        plan_hash(items, fingerprint="f", rerank_dtype="fp16", shard_size=8, max_pixels=1)
        db = Path(tmp) / "metadata.sqlite"
        write_metadata(db, ((row, it.id, str(it.path), it.fields, False) for row, it in enumerate(items)))
        con = sqlite3.connect(db)
        try:  # every row's fields JSON SQLite reads (the field indexes read only rows with indexed fields)
            (bad,) = con.execute("SELECT count(*) FROM items WHERE NOT json_valid(fields)").fetchone()
        finally:
            con.close()
        assert bad == 0, f"{bad} rows of fields SQLite's JSON refuses"
        return "accepted"
