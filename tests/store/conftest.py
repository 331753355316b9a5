"""Fixtures shared by the store's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def hashed_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files ``store.version.writer`` hashes from now on, in order (its checksums still
    computed):
    what tells a copy checked against its recorded checksum from a hard link taken as it is."""
    from store.version import writer as writer_module

    hashed: list[str] = []
    real_sha = writer_module.sha256_file

    def sha(path: Path) -> str:
        hashed.append(Path(path).name)
        return real_sha(path)

    monkeypatch.setattr(writer_module, "sha256_file", sha)
    return hashed
