"""Product writes racing a full build from a manifest (``indexer.build.build``, what ``ccrk index build``
runs), on real builds with the demo model and a real SQLite change log: the build takes the log's last
sequence before it reads its sources and its version records it (``manifest.live_sequence``); the writes
up to it are superseded (the manifest's values are served again, and they are folded), those after it
apply over the new version, each once, in order; a rollback serves the older version with every write
made over it, and going forward again supersedes them again. A re-run already published publishes nothing
and supersedes nothing."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from ccrk_settings import Settings
from indexer.build import build
from indexer.live_compact import compact
from indexer.maintenance import rollback
from store.live import Change, Delete, Entry, Patch, SqliteChangeLog
from store.live.overlay import LiveOverlay
from store.live.view import LiveIndex
from store.opening import open_version
from store.version.versions import current_version
from tests.indexer.test_live_fold import answers, random_changes

N = 24  # products of the first manifest
CATEGORIES = ("shoe", "bag", "hat")
SUPERSEDED = [f"sku-{i}" for i in range(4)]  # what the writes before the build touch; no racing write does
RACED = [f"sku-{i}" for i in range(4, N + 1)]  # what the racing writes touch (sku-N: the second manifest's)


def record(catalogue: Path, images: list[str], i: int, price: float) -> dict[str, Any]:
    return {
        "id": f"sku-{i}",
        "path": str(catalogue / images[i % len(images)]),
        "category": CATEGORIES[i % 3],
        "price": price,
        "in_stock": i % 2 == 0,
    }


def manifests(catalogue: Path, out: Path) -> dict[Path, dict[str, dict[str, Any]]]:
    """The first manifest (sku-0..N-1) and the second (sku-7 gone, sku-5's price changed, sku-N new), each
    with its records by id."""
    lines = (catalogue / "test.jsonl").read_text().splitlines()
    images = [json.loads(line)["image"] for line in lines if line.strip()]
    first = [record(catalogue, images, i, 10.0 + i) for i in range(N)]
    second = [r for r in first if r["id"] != "sku-7"] + [record(catalogue, images, N, 99.5)]
    second[5] = {**second[5], "price": 55.5}
    written: dict[Path, dict[str, dict[str, Any]]] = {}
    for path, recs in ((out / "first.jsonl", first), (out / "second.jsonl", second)):
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        written[path] = {r["id"]: r for r in recs}
    return written


def served(root: Path) -> LiveIndex:
    """What a server serves after loading CURRENT: the version, the log after what it holds applied."""
    base = open_version(root, "shop")
    index = LiveIndex(base, LiveOverlay(base, applied=base.manifest.live_sequence))
    with SqliteChangeLog.for_index(root, "shop") as opened:
        index.overlay.apply(list(opened.iter_changes(index.live_sequence)))
    return index


def reference(root: Path, version: str, acked: list[tuple[int, Change]], after: int) -> LiveIndex:
    """``version``'s own files with exactly the acknowledged changes after ``after`` applied, once, in
    order: what a server must serve."""
    base = open_version(root, "shop", version)
    index = LiveIndex(base)
    index.overlay.apply([Entry(seq, 0.0, change) for seq, change in sorted(acked) if seq > after])
    return index


def compare(index: LiveIndex, other: LiveIndex) -> None:
    try:
        assert answers(index) == answers(other)
    finally:
        index.close()
        other.close()


@pytest.mark.parametrize("how", ["changed manifest", "same manifest, --force"])
def test_writes_racing_a_full_build_are_superseded_before_it_and_kept_after(
    how: str, settings: Settings, catalogue: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    root = settings.index_root
    written = manifests(catalogue, tmp_path)
    first_path, second_path = written
    # The second build: from the changed manifest, or from the same one again with --force.
    source = second_path if how == "changed manifest" else first_path
    expected = written[source]
    first = build("shop", [first_path], settings=settings)
    assert first.published
    v1 = current_version(root, "shop")
    assert v1 is not None
    log = SqliteChangeLog.for_index(root, "shop")
    request.addfinalizer(log.close)
    # Made before the build starts: the manifest is the truth as of then. The first two are compacted into
    # a version of their own (a patched field and a tombstone in its metadata), the others pending.
    superseded = [
        Patch("sku-0", fields={"price": 0.25}),
        Delete("sku-1"),
        Patch("sku-2", fields={"category": None, "colour": "green"}),
        Patch("sku-3", fields={"in_stock": False}),
    ]
    acked: list[tuple[int, Change]] = list(zip(log.append(superseded[:2]), superseded[:2], strict=True))
    compacted = compact("shop", settings=settings)
    assert compacted.published and log.folded_sequence() == 2
    acked += zip(log.append(superseded[2:]), superseded[2:], strict=True)
    before = log.last_sequence()
    assert before == 4 and log.pending() == 2

    batches: list[list[int]] = []  # the racing writer's batches, their acknowledged sequences
    stop = threading.Event()
    wrote = threading.Condition()
    rng = random.Random(11)

    def writer() -> None:
        writes = SqliteChangeLog.for_index(root, "shop")
        try:
            while not stop.is_set():
                batch = random_changes(rng, rng.randrange(1, 8), RACED)
                seqs = writes.append(batch)
                with wrote:
                    acked.extend(zip(seqs, batch, strict=True))
                    batches.append(seqs)
                    wrote.notify_all()
                stop.wait(0.001)  # writes keep coming, a little slower than SQLite takes them
        finally:
            writes.close()

    def batches_past(count: int) -> None:
        with wrote:
            assert wrote.wait_for(lambda: len(batches) >= count, timeout=60)

    # Writes made while the build encodes: after its start, whenever the racing writer's land.
    during: list[int] = []

    def progress(done: int, total: int) -> None:
        change = Patch(RACED[len(during) % len(RACED)], fields={"price": 1000.0 + done})
        seqs = log.append([change])
        with wrote:
            acked.append((seqs[0], change))
        during.extend(seqs)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        batches_past(3)  # some racing writes certainly come before the build's start
        report = build(
            "shop", [source], settings=settings, progress=progress, force=how != "changed manifest"
        )
        # Made after the build returned: certainly after its start, as are the racing writer's that follow.
        post = Patch(RACED[0], fields={"price": 2000.0})
        posted = log.append([post])[0]
        with wrote:
            acked.append((posted, post))
            so_far = len(batches)
        batches_past(so_far + 3)  # at most one was in flight: two at least come after ``posted``
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()

    assert (
        report.published
        and report.version not in (v1, compacted.version)
        and current_version(root, "shop") == report.version
    )
    with open_version(root, "shop") as version:
        held = version.manifest.live_sequence
        # The version's own files hold the manifest, none of the writes.
        rows = range(version.total_rows)
        items = [
            it for r, it in zip(rows, version.items(list(rows)), strict=True) if version.row_of(it["id"]) == r
        ]
        assert {it["id"]: it for it in items} == expected
    # The start sequence: the log's last at a moment between two commits, after the writes made before the
    # build and before any made while it encoded.
    assert held in {before, *(b[-1] for b in batches)}
    assert during and before < held < min(during)
    assert sum(b[0] > posted for b in batches) >= 2
    seqs = sorted(seq for seq, _ in acked)
    assert seqs == list(range(1, len(seqs) + 1))  # every write acknowledged once, none lost in between
    assert len([s for s in seqs if s > held]) >= len(during) + 1 + 2
    # The superseded writes are folded; the log keeps every entry (the first version, which holds none of
    # them, is kept), and exactly those after the build's start are pending.
    assert log.folded_sequence() == held and log.last_sequence() == seqs[-1]
    assert [e.seq for e in log.iter_changes(0)] == seqs
    assert log.pending() == len(seqs) - held

    # Served: the new version with exactly the writes after its start, once, in order; the superseded
    # ones are gone (sku-0..3 are the manifest's again: no racing write touches them).
    now = served(root)
    assert now.live_sequence == seqs[-1]
    for item_id in SUPERSEDED:
        assert now.items([now.row_of(item_id)]) == [expected[item_id]]
    compare(now, reference(root, report.version, acked, held))

    # A rollback to the first version serves it with every write made over it, the superseded ones too;
    # forward again, they are superseded again.
    back = rollback("shop", settings=settings, to=v1)
    assert back.version == v1
    older = served(root)
    assert older.items([older.row_of("sku-0")])[0]["price"] == 0.25 and older.row_of("sku-1") is None
    compare(older, reference(root, v1, acked, 0))
    rollback("shop", settings=settings, to=report.version)
    compare(served(root), reference(root, report.version, acked, held))


def test_a_rerun_already_published_supersedes_nothing(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    root = settings.index_root
    first_path, _ = manifests(catalogue, tmp_path)
    assert build("shop", [first_path], settings=settings).published
    v1 = current_version(root, "shop")
    assert v1 is not None
    changes: list[Change] = [Patch("sku-0", fields={"price": 0.25}), Delete("sku-1")]
    with SqliteChangeLog.for_index(root, "shop") as log:
        acked = list(zip(log.append(changes), changes, strict=True))
        again = build("shop", [first_path], settings=settings)
        assert not again.published and again.already_current and current_version(root, "shop") == v1
        assert log.folded_sequence() == 0 and log.pending() == 2  # nothing published: nothing folded
    compare(served(root), reference(root, v1, acked, 0))
