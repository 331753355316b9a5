"""The version lifecycle of one index: naming, installing, publishing (``CURRENT``), pruning, and the
quality gate's verdict that decides whether an installed version may ever be published by default."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from store.errors import IndexFormatError, IndexNotFoundError
from store.layout import (
    BUILDS_DIR,
    CURRENT_FILE,
    MANIFEST_FILE,
    STAMP_FORMAT,
    fsync_dir,
    index_dir,
    is_version_name,
    write_atomic,
)
from store.version.manifest import IndexManifest

GATE_KEY = "quality_gate"  # build_params key of the builder's gate verdict


def new_version_name(root: Path, name: str, now: datetime | None = None) -> str:
    """A fresh version name that sorts after every existing one (the stamp is bumped on a clash)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    existing = list_versions(root, name)
    builds = index_dir(root, name) / BUILDS_DIR
    if existing:
        last = datetime.strptime(existing[-1][:16], STAMP_FORMAT).replace(tzinfo=UTC)
        if last >= now:
            now = last + timedelta(seconds=1)
    candidate = f"{now.strftime(STAMP_FORMAT)}-{secrets.token_hex(3)}"
    while (index_dir(root, name) / candidate).exists() or (builds / candidate).exists():
        candidate = f"{now.strftime(STAMP_FORMAT)}-{secrets.token_hex(3)}"
    return candidate


def current_version(root: Path, name: str) -> str | None:
    """The version CURRENT names; None when none is published (no CURRENT, an empty one). A CURRENT that
    cannot be read raises ``OSError``, one that is not UTF-8 text too (EILSEQ): every caller handles an
    unreadable CURRENT, while a ``UnicodeDecodeError`` (a ``ValueError``) escaped them (the Ray driver's
    poll loop ended and deleted the app; shard calls failed)."""
    path = index_dir(root, name) / CURRENT_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        reason = f"CURRENT is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise OSError(errno.EILSEQ, reason, str(path)) from None
    return text or None


def list_versions(root: Path, name: str) -> list[str]:
    """Installed versions, oldest first: published ones and those the quality gate refused (kept, never
    published; ``refused_by_gate``)."""
    base = index_dir(root, name)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if is_version_name(p.name) and (p / MANIFEST_FILE).is_file())


# -- the quality gate's verdict ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRecord:
    """The quality gate's verdict as a manifest records it (``build_params["quality_gate"]``, the builder's
    ``indexer.quality_gate.GateVerdict.to_dict()``): read here, so nobody pokes at the dict."""

    passed: bool | None  # None: recorded without a readable verdict (never counts as refused)
    reasons: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return self.passed is False

    @classmethod
    def of(cls, manifest: IndexManifest) -> GateRecord | None:
        """The recorded verdict; None when the version was built with the gate off."""
        raw = manifest.build_params.get(GATE_KEY)
        if not isinstance(raw, dict):
            return None
        passed, reasons = raw.get("passed"), raw.get("reasons")
        # A hand-edited manifest must not make pruning or rollback crash: odd reasons are dropped.
        kept = tuple(str(r) for r in reasons) if isinstance(reasons, list) else ()
        return cls(passed if isinstance(passed, bool) else None, kept)


def record_gate(manifest: IndexManifest, verdict: dict[str, Any]) -> None:
    """Store the gate's verdict (``GateVerdict.to_dict()``) in the manifest's build parameters."""
    manifest.build_params = {**manifest.build_params, GATE_KEY: verdict}


def refused_by_gate(manifest: IndexManifest) -> bool:
    """Whether the builder's quality gate refused this version: it was installed (kept for inspection) but
    never published, so nothing may publish it by default or count it as a good version."""
    gate = GateRecord.of(manifest)
    return gate is not None and gate.refused


def version_refused(root: Path, name: str, version: str) -> bool:
    """``refused_by_gate`` of a kept version; IndexFormatError when its manifest cannot be read."""
    return refused_by_gate(IndexManifest.load(index_dir(root, name) / version / MANIFEST_FILE))


def version_approved(root: Path, name: str, version: str) -> bool:
    """Not refused by the quality gate (a version built with the gate off counts as approved). An unreadable
    manifest counts as not approved: it must never be picked over, or keep its place instead of, a good
    version."""
    try:
        return not version_refused(root, name, version)
    except IndexFormatError:
        return False


# -- installing, publishing, pruning -------------------------------------------------------------------------


def publish_version(root: Path, name: str, version: str) -> None:
    """Switch CURRENT to ``version`` atomically; the version folder must be complete already."""
    base = index_dir(root, name)
    if not (base / version / MANIFEST_FILE).is_file():
        raise IndexNotFoundError(f"cannot publish {name}/{version}: no such complete version under {base}")
    write_atomic(base / CURRENT_FILE, (version + "\n").encode("utf-8"))


def install_version(root: Path, name: str, staged_dir: Path, version: str) -> Path:
    """Move a fully written version folder into place (one rename, same filesystem) without publishing it."""
    base = index_dir(root, name)
    base.mkdir(parents=True, exist_ok=True)
    staged_dir = Path(staged_dir)
    for p in sorted(staged_dir.rglob("*"), reverse=True):  # a sharded version's shard folders too
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        elif p.is_dir():
            fsync_dir(p)
    fsync_dir(staged_dir)
    target = base / version
    os.rename(staged_dir, target)
    fsync_dir(base)
    return target


def discard_installed(root: Path, name: str, version: str) -> None:
    """Remove a version installed but never published (CURRENT could not be switched to it), so that
    nothing takes it for a good version later. Renamed first, as pruning does: never half listed."""
    base = index_dir(root, name)
    trash = base / BUILDS_DIR / f"trash-{version}"
    with contextlib.suppress(OSError):  # the publish error is the one to report
        os.rename(base / version, trash)
        shutil.rmtree(trash, ignore_errors=True)


def prune_versions(root: Path, name: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` approved versions, the newest ``keep`` versions the quality gate refused
    (or whose manifest is unreadable), and CURRENT whatever it is; delete the rest. Returns the deleted
    names, oldest first. Counted separately so that refused builds never push good versions out.

    A reader may still have a deleted version open: its memory maps and open files stay valid (POSIX)."""
    current = current_version(root, name)
    versions = list_versions(root, name)
    ok = {v: version_approved(root, name, v) for v in versions}
    approved = [v for v in versions if ok[v]]
    refused = [v for v in versions if not ok[v]]
    kept = {current, *approved[max(0, len(approved) - keep) :], *refused[max(0, len(refused) - keep) :]}
    doomed = [v for v in versions if v not in kept]
    base = index_dir(root, name)
    for v in doomed:
        # Renamed first so list_versions never reports a half-deleted folder.
        trash = base / BUILDS_DIR / f"trash-{v}-{secrets.token_hex(3)}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(base / v, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed
