"""Checking one installed version: its files against the manifest's checksums, its counts and shapes
against each other (through the reader's public accessors), and its model against the one in use."""

from __future__ import annotations

from pathlib import Path

from store.errors import IndexFormatError, ModelMismatchError
from store.layout import MANIFEST_FILE, index_dir, sha256_file
from store.manifest import IndexManifest, check_model, model_fingerprint, model_name_of
from store.reader import IndexVersion
from store.versions import current_version


def verify_version(
    root: Path, name: str, version: str | None = None, *, model_dir: Path | None = None
) -> list[str]:
    """Problems found in one version (checksums, counts, shapes, model compatibility); [] when sound."""
    chosen = version or current_version(root, name)
    if chosen is None:
        return [f"index {name!r} has no published version"]
    path = index_dir(root, name) / chosen
    try:
        manifest = IndexManifest.load(path / MANIFEST_FILE)
    except IndexFormatError as exc:
        return [str(exc)]
    problems: list[str] = []
    for fname, expected in manifest.checksums.items():
        fpath = path / fname
        if not fpath.is_file():
            problems.append(f"{fname}: missing")
        elif sha256_file(fpath) != expected:
            problems.append(f"{fname}: checksum mismatch")
    if problems:
        return problems
    try:
        with IndexVersion(path, manifest) as opened:
            if len(opened) != manifest.count:
                problems.append(f"manifest count {manifest.count} but {len(opened)} live items")
            if opened.rerank_rows is not None and opened.rerank_rows != opened.total_rows:
                problems.append(f"re-rank store has {opened.rerank_rows} rows, index {opened.total_rows}")
            if opened.metadata_rows != opened.total_rows:
                problems.append(f"metadata has {opened.metadata_rows} rows, index {opened.total_rows}")
    except IndexFormatError as exc:
        problems.append(str(exc))
    if model_dir is not None:
        try:
            check_model(
                manifest,
                expect_fingerprint=model_fingerprint(model_dir),
                expect_model_name=model_name_of(model_dir),
            )
        except ModelMismatchError as exc:
            problems.append(str(exc))
    return problems
