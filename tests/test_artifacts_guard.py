"""The guard that keeps the suite off the checkout's ``artifacts/`` (``tests/artifacts_guard.py``): after
``make demo``, a service test read the demo's probe runs from ``artifacts/monitoring.sqlite`` and failed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import conftest
from tests.artifacts_guard import artifact_access, listing, listing_change

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts"


def test_paths_under_artifacts_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO)
    assert artifact_access("open", ("artifacts/monitoring.sqlite", "r", 0), ARTIFACTS)
    assert artifact_access("sqlite3.connect", (ARTIFACTS / "indexes" / "demo.monitoring.sqlite",), ARTIFACTS)
    assert artifact_access("sqlite3.connect", (f"file:{ARTIFACTS}/h.sqlite?mode=ro",), ARTIFACTS)
    assert artifact_access("os.rename", (str(tmp_path / "a"), str(ARTIFACTS / "b"), None, None), ARTIFACTS)
    assert artifact_access("os.scandir", (str(ARTIFACTS),), ARTIFACTS)
    for event, args in (
        ("open", (str(tmp_path / "artifacts" / "x"), "w", 0)),  # a tmp clone's artifacts/: fine
        ("open", (str(REPO / "artifacts-other"), "r", 0)),
        ("open", (3, "r", 0)),  # a descriptor
        ("sqlite3.connect", (":memory:",)),
        ("exec", (ARTIFACTS,)),  # not a path event
    ):
        assert artifact_access(event, args, ARTIFACTS) is None, (event, args)


def test_the_hook_of_this_process_records_a_touch() -> None:
    """Raised by hand (opening the file would touch it): the installed hook records it, and the autouse
    fixture would fail this test with it; taken back here."""
    sys.audit("open", str(ARTIFACTS / "monitoring.sqlite"), "r", 0)
    hits, conftest._ARTIFACT_HITS[:] = list(conftest._ARTIFACT_HITS), []
    assert hits == [f"open {ARTIFACTS / 'monitoring.sqlite'}"]


def test_a_session_listing_names_what_it_created(tmp_path: Path) -> None:
    (tmp_path / "indexes" / "demo").mkdir(parents=True)
    (tmp_path / "indexes" / "demo" / "CURRENT").write_text("v1")
    (tmp_path / "indexes" / "demo.monitoring.sqlite").write_bytes(b"")
    before = listing(tmp_path)
    (tmp_path / "indexes" / "demo.monitoring.sqlite-wal").write_bytes(b"")  # a running demo's: ignored
    (tmp_path / "monitoring.sqlite").write_bytes(b"")
    (tmp_path / "indexes" / "demo" / "CURRENT").unlink()
    assert listing_change(before, listing(tmp_path)) == ["+ monitoring.sqlite", "- indexes/demo/CURRENT"]
