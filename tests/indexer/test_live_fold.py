"""Folding the change log into versions (``indexer.live_fold``), on real versions written by the store's
writers (unsharded and sharded) and a real SQLite log: after ``compact`` the log holds nothing pending and
a server's view of the new version answers as its view of the old one with the log did; writes racing
compactions are neither lost nor applied twice; a full build records the log's sequence at its start."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.live_compact import compact
from indexer.live_fold import start_sequence
from indexer.report import BuildReport
from store.live import Change, Delete, Entry, Patch, SqliteChangeLog, changelog_path
from store.live.overlay import LiveOverlay
from store.live.view import LiveIndex
from store.opening import open_version
from store.version.versions import current_version, list_versions
from tests.store.writing import vectors, write_rows, write_version

N = 120
FILTERS: list[dict[str, Any]] = [
    {"category": "shoe"},
    {"price": {"lt": 30}},
    {"in_stock": True},
    {"category": ["bag", "hat"], "price": {"gte": 5}},
]


def settings(root: Path) -> Settings:
    return Settings(index_root=root)


@pytest.fixture(params=["unsharded", "sharded"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "unsharded":
        write_version(tmp_path, "shop", n=N, deleted={0})
    else:
        write_rows(tmp_path, "shop", vectors(N, 0), [f"sku-{i}" for i in range(N)], shard_count=3)
    return tmp_path


@pytest.fixture()
def log(root: Path) -> Iterator[SqliteChangeLog]:
    opened = SqliteChangeLog.for_index(root, "shop")
    yield opened
    opened.close()


def view(root: Path) -> LiveIndex:
    """What a server serves after loading CURRENT: the version, the log after what it holds applied."""
    base = open_version(root, "shop")
    index = LiveIndex(base, LiveOverlay(base, applied=base.manifest.live_sequence))
    with SqliteChangeLog.for_index(root, "shop") as opened:
        index.overlay.apply(list(opened.iter_changes(index.live_sequence)))
    return index


def answers(index: LiveIndex) -> dict[str, Any]:
    rows = list(range(index.total_rows))
    items = index.items(rows)
    live = index.live_mask()
    visible = sorted(i["id"] for r, i in zip(rows, items, strict=True) if index.row_of(i["id"]) == r)
    # A live mask, where there is one, marks exactly the visible rows.
    assert live is None or sorted(items[r]["id"] for r in np.flatnonzero(live)) == visible
    return {
        "count": len(index),
        "filters": [
            sorted(index.items(index.filter_rows(f).tolist()), key=lambda i: i["id"]) for f in FILTERS
        ],
        "items": sorted(
            (i for r, i in zip(rows, items, strict=True) if index.row_of(i["id"]) == r),
            key=lambda i: i["id"],
        ),
    }


def random_changes(rng: random.Random, n: int, items: Sequence[str] | None = None) -> list[Change]:
    """``n`` patches (price and stock; 10 %: a field removed, one added) and deletes (10 %) of ``items``
    (default: sku-1 .. sku-{N-1})."""
    out: list[Change] = []
    for _ in range(n):
        item = rng.choice(items) if items else f"sku-{rng.randrange(1, N)}"
        pick = rng.random()
        if pick < 0.1:
            out.append(Delete(item))
        elif pick < 0.2:
            out.append(Patch(item, fields={"category": None, "colour": rng.choice(["red", "blue"])}))
        else:
            out.append(
                Patch(item, fields={"price": round(rng.uniform(0, 100), 2), "in_stock": rng.random() < 0.7})
            )
    return out


def test_compact_empties_the_log_and_answers_the_same(root: Path, log: SqliteChangeLog) -> None:
    log.append(random_changes(random.Random(1), 300))
    before_view = view(root)
    before = answers(before_view)
    before_view.close()
    old = current_version(root, "shop")
    report = compact("shop", settings=settings(root))
    assert report.published and report.version != old
    assert any("folded" in note for note in report.notes), report.notes
    assert log.pending() == 0 and log.folded_sequence() == log.last_sequence() == 300
    # Kept while the version before (it holds none of them) is kept: a process may still serve it.
    assert [e.seq for e in log.iter_changes(0)] == list(range(1, 301))
    after_view = view(root)
    assert after_view.manifest.live_sequence == 300 and after_view.live_sequence == 300
    assert after_view.overlay.snapshot.empty  # everything is in the version's own files now
    assert answers(after_view) == before
    after_view.close()
    # Writes after the fold apply over the new version; a second compact with nothing new publishes nothing.
    log.append([Patch("sku-5", fields={"price": 0.5})])
    later = view(root)
    assert later.items([later.row_of("sku-5")])[0]["price"] == 0.5
    later.close()
    assert compact("shop", settings=settings(root)).published
    again = compact("shop", settings=settings(root))
    assert not again.published and "nothing pending" in again.notes[0]


def test_writes_racing_compactions_are_neither_lost_nor_doubled(root: Path, log: SqliteChangeLog) -> None:
    acked: list[tuple[int, Change]] = []
    stop = threading.Event()
    rng = random.Random(7)

    def writer() -> None:
        writes = SqliteChangeLog.for_index(root, "shop")
        while not stop.is_set():
            batch = random_changes(rng, rng.randrange(1, 20))
            acked.extend(zip(writes.append(batch), batch, strict=True))
        writes.close()

    # The reference: every acknowledged change applied once, in order, to the version they were made on.
    reference_base = open_version(root, "shop")
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        published = 0
        for n in range(4):
            # Each compaction starts once the writer has written since the last (a loaded machine may not
            # run its thread for a while); the writer goes on while it runs.
            deadline = time.monotonic() + 30
            while len(acked) < 15 * (n + 1) and time.monotonic() < deadline:
                time.sleep(0.005)
            published += compact("shop", settings=settings(root)).published
    finally:
        stop.set()
        thread.join(timeout=60)
    assert published >= 2 and len(acked) > 50
    final = view(root)
    held = final.manifest.live_sequence
    assert 0 < held <= log.last_sequence()
    # The entries left in the log are exactly those after what the version holds, none before.
    left = [e.seq for e in log.iter_changes(0)]
    kept = [open_version(root, "shop", v) for v in list_versions(root, "shop")]
    oldest = min(k.manifest.live_sequence for k in kept)
    for k in kept:
        k.close()
    assert left == [seq for seq, _ in sorted(acked) if seq > oldest]
    assert log.pending() == len([seq for seq, _ in acked if seq > held])
    reference = LiveIndex(reference_base)
    ordered = sorted(acked, key=lambda pair: pair[0])
    reference.overlay.apply([Entry(seq, 0.0, change) for seq, change in ordered])
    assert answers(final) == answers(reference)
    final.close()
    reference_base.close()


def test_a_full_build_starts_from_the_logs_last_sequence(root: Path, log: SqliteChangeLog) -> None:
    report = BuildReport("build", "shop", None, False)
    assert start_sequence(root, "fresh", settings(root), report) == 0  # no log: nothing superseded
    assert not changelog_path(root, "fresh").exists()
    log.append(random_changes(random.Random(2), 5))
    assert start_sequence(root, "shop", settings(root), report) == 5
    assert report.notes == []


def test_the_log_and_compact_commands(root: Path, log: SqliteChangeLog) -> None:
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    runner = CliRunner()
    where = ["--name", "shop", "--index-root", str(root)]
    log.append([Patch("sku-3", fields={"price": 3.5}), Delete("sku-4")])
    shown = runner.invoke(app, ["index", "log", *where])
    assert shown.exit_code == 0, shown.output
    assert "last sequence 2" in shown.output and "2 pending" in shown.output and "sku-4" in shown.output
    folded = runner.invoke(app, ["index", "compact", *where])
    assert folded.exit_code == 0, folded.output
    shown = runner.invoke(app, ["index", "log", *where])
    assert "holds up to 2; 0 pending" in shown.output, shown.output
    nothing = runner.invoke(app, ["index", "compact", *where])
    assert nothing.exit_code == 0 and "nothing pending" in nothing.output
    missing = runner.invoke(app, ["index", "compact", "--name", "nowhere", "--index-root", str(root)])
    assert missing.exit_code == 2 and "nowhere" in missing.output
