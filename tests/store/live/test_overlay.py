"""The live overlay over real versions (unsharded and sharded, written by the store's own writers): its
filters against the version's own SQL as the exact reference, its hidden rows against a brute force."""

from __future__ import annotations

import itertools
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from store.errors import FilterError
from store.live import Delete, Entry, Patch, Upsert
from store.live.delta import EmbeddedProduct
from store.live.overlay import LiveOverlay, merged
from store.live.view import LiveIndex
from store.opening import open_version
from store.version.metadata import fields_json, fields_match, filter_sql
from tests.store.writing import D, brute_force, vectors, write_rows, write_version


def entries(*changes: object, start: int = 1) -> list[Entry]:
    return [Entry(seq=start + i, committed_at=time.time(), change=c) for i, c in enumerate(changes)]  # type: ignore[arg-type]


VALUES = [None, True, False, 0, 1, 2, 1.0, 2.5, -3, "1", "a", "b", "", [1, 2], ["a"], {"k": 1}]
FILTERS = [
    {"f": True},
    {"f": False},
    {"f": 1},
    {"f": 1.0},
    {"f": 0},
    {"f": "1"},
    {"f": "a"},
    {"f": ""},
    {"f": ["a", 1]},
    {"f": [True, "b"]},
    {"f": ["[1,2]"]},
    {"f": {"gte": 1}},
    {"f": {"gt": 0, "lte": 2}},
    {"f": {"lt": 0}},
    {"f": {"gte": 1, "lt": 2.5}},
    {"f": "a", "g": {"gte": 0}},
]


def test_fields_match_decides_as_the_versions_sql_does() -> None:
    """Every pair of stored value and filter, matched in memory and by ``filter_sql`` over SQLite: the same
    rows, so a changed row is filtered as the version's own rows are (bools as 1/0, numbers by value, text
    apart from numbers, arrays as their JSON text, a missing field matching nothing)."""
    rows = [{"f": v} if v is not None else {} for v in VALUES]
    rows += [{"f": v, "g": g} for v, g in itertools.product(["a", 1], [0, -1, "x"])]
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE items(row INTEGER PRIMARY KEY, id TEXT, path TEXT, fields TEXT, deleted INT)")
    con.executemany(
        "INSERT INTO items VALUES (?, ?, NULL, ?, 0)",
        [(i, str(i), fields_json(r)) for i, r in enumerate(rows)],
    )
    for flt in FILTERS:
        sql, args = filter_sql(flt, {"f", "g"})
        by_sql = [r for (r,) in con.execute(sql, args)]
        in_memory = [i for i, r in enumerate(rows) if fields_match(r, flt)]
        assert in_memory == by_sql, flt
    assert len({tuple(r for (r,) in con.execute(*filter_sql(f, {"f", "g"}))) for f in FILTERS}) > 8


def test_merged_replaces_adds_and_removes_fields() -> None:
    assert merged({"a": 1, "b": 2}, {"b": 3, "c": 4, "a": None}) == {"b": 3, "c": 4}
    assert merged({"a": {"x": 1}}, {"a": {"y": 2}}) == {"a": {"y": 2}}  # top level only (RFC 7396 here)


@pytest.fixture(params=["unsharded", "sharded"])
def version(request: pytest.FixtureRequest, tmp_path: Path):
    n = 300
    if request.param == "unsharded":
        write_version(tmp_path, "shop", n=n, deleted={0})
    else:
        write_rows(tmp_path, "shop", vectors(n, 0), [f"sku-{i}" for i in range(n)], shard_count=3)
    index = open_version(tmp_path, "shop")
    yield index
    index.close()


def test_patches_change_items_filters_and_kinds(version) -> None:
    view = LiveIndex(version)
    row5, row6 = view.row_of("sku-5"), view.row_of("sku-6")
    cheap = set(view.filter_rows({"price": {"lt": 10}}).tolist())
    assert row5 in cheap
    applied = view.overlay.apply(
        entries(
            Patch("sku-5", fields={"price": 999.0, "in_stock": False}),
            Patch("sku-6", fields={"category": None, "in_stock": True}),
            Patch("no-such", fields={"price": 1.0}),
        )
    )
    assert (applied.entries, applied.skipped, applied.snapshot.applied) == (3, 1, 3)
    assert sorted(applied.rows.tolist()) == sorted([row5, row6])
    (five, six) = view.items([row5, row6])
    assert five["id"] == "sku-5" and five["price"] == 999.0 and five["in_stock"] is False
    assert "category" not in six and six["in_stock"] is True and six["price"] == 6.0
    assert "in_stock" in view.fields and "in_stock" not in version.fields
    assert set(view.filter_rows({"price": {"lt": 10}}).tolist()) == cheap - {row5}
    assert view.filter_rows({"in_stock": True}).tolist() == [row6]
    assert view.filter_rows({"price": {"gte": 999}}).tolist() == [row5]
    # A row whose fields did not change is still answered by the version's SQL.
    shoes = set(version.filter_rows({"category": "shoe"}).tolist())
    assert set(view.filter_rows({"category": "shoe"}).tolist()) == shoes
    assert view.field_kinds("price") == {"number"} and view.field_kinds("in_stock") == {"bool"}
    with pytest.raises(FilterError, match="'colour'"):
        view.filter_rows({"colour": "red"})
    # Entries already applied do nothing the second time.
    again = view.overlay.apply(entries(Patch("sku-5", fields={"price": 1.0})))
    assert again.entries == 0 and view.items([row5])[0]["price"] == 999.0


def test_deletes_hide_rows_from_searches_filters_and_counts(version) -> None:
    view = LiveIndex(version)
    gone = [view.row_of(f"sku-{i}") for i in (3, 4, 7)]
    before = len(view)
    view.overlay.apply(
        entries(Delete("sku-3"), Delete("sku-4"), Patch("sku-7", fields={"price": 1.5}), Delete("sku-7"))
    )
    view.overlay.apply(entries(Patch("sku-4", fields={"price": 2.0}), Delete("sku-3"), start=5))  # gone
    assert len(view) == before - 3
    assert all(view.row_of(f"sku-{i}") is None for i in (3, 4, 7)) and view.row_of("sku-8") is not None
    mask = view.live_mask()
    assert mask is not None and not mask[gone].any() and mask.sum() == len(view)
    assert not set(gone) & set(view.filter_rows({"price": {"lt": 20}}).tolist())
    queries = vectors(10, 3)
    embeds = version.embeddings(np.arange(version.total_rows))
    want = brute_force(embeds, queries, 10, mask)
    for search in (view.search, view.search_exact):
        _, rows = search(queries, 10)
        assert not np.isin(rows, gone).any()
        np.testing.assert_array_equal(np.sort(rows, axis=1), np.sort(want, axis=1))
    _, rows = view.search_exact(queries, 5, allowed_rows=np.asarray([*gone, 10, 11, 12]))
    assert set(rows.ravel().tolist()) <= {10, 11, 12, -1}


def test_upserts_and_text_are_counted_as_not_applied(version) -> None:
    view = LiveIndex(version)
    row = view.row_of("sku-9")
    snap = view.overlay.apply(
        entries(Upsert("sku-9", fields={"price": 1.0}), Patch("sku-9", text={"title": "new"}))
    ).snapshot
    assert snap.not_applied == 2 and view.row_of("sku-9") == row and view.items([row])[0]["price"] == 9.0


def test_the_view_reaches_the_versions_own_attributes(version) -> None:
    view = LiveIndex(version)
    assert view.manifest is version.manifest and view.total_rows == version.total_rows
    assert view.live_sequence == 0 and LiveIndex(version, LiveOverlay(version, 41)).live_sequence == 41


class OnePhoto:
    """An embedder giving every upserted product one photo (its vector from its id) and no text."""

    def embed(self, upsert: Upsert) -> EmbeddedProduct:
        vector = vectors(1, sum(map(ord, upsert.id)))
        return EmbeddedProduct(vector, None, None, [f"{upsert.id}.jpg"], [], np.zeros((0, D), np.float32))


LIVE_FILTERS = [
    {"in_stock": True},
    {"in_stock": False},
    {"price": {"lt": 50}},
    {"price": {"gte": 100, "lt": 250}},
    {"category": "shoe"},
    {"category": ["bag", "hat"]},
    {"in_stock": True, "price": {"gte": 100}},
    {"category": "shoe", "in_stock": True},
]


def test_filters_over_many_writes_match_a_brute_force_of_the_merged_fields(version) -> None:
    """Rounds of random patches (a field changed, added or removed), deletes and upserts, some rounds
    searched with the filters (twice: the snapshot's kept answer), some not (what a later snapshot finds
    from an earlier one's): every answer is exactly the rows the version's SQL finds in a table of each
    live product's fields as the writes left them (kept apart from the overlay, by ``merged``)."""
    view = LiveIndex(version, LiveOverlay(version, embedder=OnePhoto()))
    catalogue = {
        item["id"]: {k: v for k, v in item.items() if k not in ("id", "path")}
        for item in version.items(
            np.flatnonzero(
                version.live_mask() if version.live_mask() is not None else np.ones(version.total_rows, bool)
            ).tolist()
        )
    }
    rng = np.random.default_rng(5)
    seq, new = 1, 0
    for round_ in range(14):
        changes: list[object] = []
        if round_ == 0:  # in_stock on most products at once, so its filters match many version rows
            changes += [Patch(i, fields={"in_stock": bool(rng.random() < 0.7)}) for i in catalogue]
        for _ in range(int(rng.integers(1, 40))):
            ids = sorted(catalogue)
            pick = ids[int(rng.integers(0, len(ids)))]
            what = rng.random()
            if what < 0.1:
                changes.append(Delete(pick))
            elif what < 0.2:
                name = pick if rng.random() < 0.5 else f"new-{(new := new + 1)}"
                changes.append(Upsert(name, fields={"price": float(rng.integers(0, 300)), "in_stock": True}))
            else:
                fields: dict[str, object] = {"price": round(float(rng.uniform(0, 300)), 2)}
                if rng.random() < 0.5:
                    fields["in_stock"] = bool(rng.random() < 0.5)
                if rng.random() < 0.2:
                    fields["category"] = None if rng.random() < 0.5 else str(rng.choice(["shoe", "hat"]))
                changes.append(Patch(pick, fields=fields))
        for change in changes:  # the reference, apart from the overlay
            if isinstance(change, Delete):
                catalogue.pop(change.id, None)
            elif isinstance(change, Upsert):
                catalogue[change.id] = dict(change.fields)
            elif change.id in catalogue:  # type: ignore[attr-defined]
                catalogue[change.id] = merged(catalogue[change.id], change.fields)  # type: ignore[attr-defined]
        view.overlay.apply(entries(*changes, start=seq))
        seq += len(changes)
        assert view.snapshot.not_applied == 0 and len(view) == len(catalogue)
        if rng.random() < 0.4:
            continue  # not searched: the next snapshot finds the filters from an earlier one's
        con = sqlite3.connect(":memory:")
        con.execute(
            "CREATE TABLE items(row INTEGER PRIMARY KEY, id TEXT, path TEXT, fields TEXT, deleted INT)"
        )
        con.executemany(
            "INSERT INTO items VALUES (?, ?, NULL, ?, 0)",
            [(view.row_of(i), i, fields_json(f)) for i, f in catalogue.items()],
        )
        for flt in LIVE_FILTERS:
            want = [r for (r,) in con.execute(*filter_sql(flt, view.fields))]
            for _ in range(2):
                got = view.filter_rows(flt)
                assert got.tolist() == want, (round_, flt)
                assert not got.flags.writeable  # shared by the snapshot's searches
        con.close()
    assert view.snapshot.delta is not None and view.snapshot.hidden.size and view.snapshot.changed.size > 100
