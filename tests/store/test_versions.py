"""The version lifecycle: publishing (atomic, CURRENT followed by readers), pruning, and the quality gate's
verdict deciding which kept versions count as good."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.errors import IndexFormatError, IndexNotFoundError
from store.layout import MANIFEST_FILE
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.versions import (
    current_version,
    list_versions,
    prune_versions,
    publish_version,
    refused_by_gate,
    version_approved,
    version_refused,
)
from tests.store.writing import write_version


def test_publish_is_atomic_and_open_follows_current(tmp_path: Path) -> None:
    v1 = write_version(tmp_path, "shop", seed=0)
    v2 = write_version(tmp_path, "shop", seed=1)
    assert v1 < v2 and list_versions(tmp_path, "shop") == [v1, v2]
    assert current_version(tmp_path, "shop") == v2
    with IndexVersion.open(tmp_path, "shop") as idx:
        assert idx.manifest.version == v2 and idx.path == tmp_path / "shop" / v2
    with IndexVersion.open(tmp_path, "shop", v1) as idx:
        assert idx.manifest.version == v1
    # Publishing a version that does not exist leaves CURRENT untouched and no temp file behind.
    with pytest.raises(IndexNotFoundError):
        publish_version(tmp_path, "shop", "20990101T000000Z-abcdef")
    assert current_version(tmp_path, "shop") == v2
    publish_version(tmp_path, "shop", v1)
    assert (tmp_path / "shop" / "CURRENT").read_text().strip() == v1
    assert [p.name for p in (tmp_path / "shop").iterdir() if p.name.endswith(".tmp")] == []


def test_prune_keeps_newest_and_current(tmp_path: Path) -> None:
    versions = [write_version(tmp_path, "shop", seed=s) for s in range(4)]
    publish_version(tmp_path, "shop", versions[0])  # rolled back to the oldest
    deleted = prune_versions(tmp_path, "shop", keep=2)
    assert deleted == [versions[1]]
    assert list_versions(tmp_path, "shop") == [versions[0], versions[2], versions[3]]


def test_refused_by_gate_reads_the_builders_verdict(tmp_path: Path) -> None:
    plain = write_version(tmp_path, "shop", n=20)  # gate off
    passed = write_version(tmp_path, "shop", n=20, gate=True)
    refused = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    versions = (plain, passed, refused)
    assert [version_refused(tmp_path, "shop", v) for v in versions] == [False, False, True]
    assert [version_approved(tmp_path, "shop", v) for v in versions] == [True, True, False]
    manifest = IndexManifest.load(tmp_path / "shop" / refused / MANIFEST_FILE)
    assert refused_by_gate(manifest) and list_versions(tmp_path, "shop") == [plain, passed, refused]
    # An unreadable manifest: a typed error when asked directly, never counted as approved.
    (tmp_path / "shop" / passed / MANIFEST_FILE).write_text("{broken", encoding="utf-8")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        version_refused(tmp_path, "shop", passed)
    assert not version_approved(tmp_path, "shop", passed)


def test_prune_counts_refused_versions_apart(tmp_path: Path) -> None:
    """keep=2: the newest two approved versions and the newest two refused ones stay, counted apart (the
    old rule, newest two of all, would have kept r3 and g4 only and deleted g3, the last good fallback)."""
    g1, g2 = (write_version(tmp_path, "shop", n=20, seed=s) for s in (0, 1))
    r1 = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    g3 = write_version(tmp_path, "shop", n=20, gate=True)
    r2, r3 = (write_version(tmp_path, "shop", n=20, gate=False, publish=False) for _ in range(2))
    g4 = write_version(tmp_path, "shop", n=20, gate=True)
    assert current_version(tmp_path, "shop") == g4
    assert prune_versions(tmp_path, "shop", keep=2) == [g1, g2, r1]
    assert list_versions(tmp_path, "shop") == [g3, r2, r3, g4]

    # CURRENT is never deleted, even a refused version published by force, and counts in neither quota.
    publish_version(tmp_path, "shop", r2)
    r4 = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    assert prune_versions(tmp_path, "shop", keep=2) == []
    assert list_versions(tmp_path, "shop") == [g3, r2, r3, g4, r4]
    publish_version(tmp_path, "shop", g4)
    assert prune_versions(tmp_path, "shop", keep=2) == [r2]

    # A version whose manifest cannot be read is pruned with the refused ones, never kept over a good one:
    # rolled back to a1, keep=1 keeps a2 (the newest good) besides CURRENT, not the newer unreadable x.
    a1, a2, x, y = (write_version(tmp_path, "b", n=20, gate=True) for _ in range(4))
    for broken in (x, y):
        (tmp_path / "b" / broken / MANIFEST_FILE).write_text("{broken", encoding="utf-8")
    publish_version(tmp_path, "b", a1)
    assert prune_versions(tmp_path, "b", keep=1) == [x]
    assert list_versions(tmp_path, "b") == [a1, a2, y]


def test_a_hand_edited_gate_record_never_breaks_pruning(tmp_path: Path) -> None:
    """Odd ``reasons`` (a number, a string) in a kept version's manifest: its verdict still reads, and
    pruning still runs (it used to raise TypeError out of prune and rollback)."""
    refused = write_version(tmp_path, "shop", n=20, gate=False, publish=False)
    current = write_version(tmp_path, "shop", n=20)
    path = tmp_path / "shop" / refused / MANIFEST_FILE
    for odd in (7, "too slow"):
        manifest = IndexManifest.load(path)
        manifest.build_params["quality_gate"]["reasons"] = odd
        manifest.save(path)
        assert version_refused(tmp_path, "shop", refused)
        assert prune_versions(tmp_path, "shop", keep=1) == []
    assert list_versions(tmp_path, "shop") == [refused, current]
