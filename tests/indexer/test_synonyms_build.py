"""Synonyms given at build time (``ccrk index build --synonyms FILE``): checked before anything is built
(a cycle names the file and the entry, nothing is published), stored in the version and checksummed with
it, part of the build's key, and carried over by ``add`` and ``delete``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import Settings
from indexer.build import add, build, delete
from store.layout import index_dir
from store.synonyms import SYNONYMS_FILE, read_document
from store.verify import verify_version
from store.version.versions import current_version
from tests.indexer.files import write_photo

runner = CliRunner()


def _photos(root: Path, n: int, start: int = 0) -> Path:
    for i in range(start, start + n):
        write_photo(root / f"p{i}.jpg", i)
    return root


def test_a_cycle_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "synonyms.json"
    bad.write_text(json.dumps({"synonyms": [{"from": "a", "to": ["b"]}, {"from": "b", "to": ["a"]}]}))
    photos = _photos(tmp_path / "photos", 2)
    result = runner.invoke(
        app,
        [
            "index",
            "build",
            "--name",
            "x",
            "--index-root",
            str(tmp_path / "root"),
            "--synonyms",
            str(bad),
            str(photos),
        ],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert f"{bad}: synonyms[1]" in result.output and "cycle" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "root" / "x").exists()  # checked before anything was created


def test_the_version_holds_the_build_synonyms_and_keeps_them(settings: Settings, tmp_path: Path) -> None:
    file = tmp_path / "synonyms.json"
    file.write_text(json.dumps({"synonyms": [{"terms": ["sneakers", "trainers"], "lang": "en"}]}))
    photos = _photos(tmp_path / "photos", 3)
    first = build("shop", [photos], settings=settings, synonyms=file)
    assert first.published
    root, base = settings.index_root, index_dir(settings.index_root, "shop")
    version = base / current_version(root, "shop")
    assert read_document(version / SYNONYMS_FILE) == read_document(file)
    assert verify_version(root, "shop") == []  # checksummed with the version's files
    # The same build again is CURRENT already; with other synonyms it is not (the key holds them).
    assert build("shop", [photos], settings=settings, synonyms=file).already_current
    file.write_text(json.dumps({"synonyms": [{"from": "tee", "to": ["t-shirt"]}]}))
    other = build("shop", [photos], settings=settings, synonyms=file)
    assert other.published and not other.already_current
    kept = read_document(base / current_version(root, "shop") / SYNONYMS_FILE)
    assert kept == read_document(file)
    # add and delete carry the parent's set over.
    _photos(photos, 1, start=3)
    assert add("shop", [photos], settings=settings).published
    assert read_document(base / current_version(root, "shop") / SYNONYMS_FILE) == kept
    assert delete("shop", ["p0.jpg"], settings=settings).published
    assert read_document(base / current_version(root, "shop") / SYNONYMS_FILE) == kept
    assert verify_version(root, "shop") == []
    # A build without --synonyms: a version without any.
    build("shop", [photos], settings=settings, force=True)
    assert not (base / current_version(root, "shop") / SYNONYMS_FILE).exists()
