"""A version's manifest (``manifest.json``: what was built, with which model, how to search it) and the
model compatibility check that compares it with the model in use.

An unsharded version's manifest is format 1, written exactly as before sharding existed (no ``sharding``
key). A sharded version's own manifest is format 2 and carries the ``sharding`` block
(``store.version.sharding``);
each of its shards has an ordinary format-1 manifest. Code that reads only format 1 refuses format 2 with
"format_version 2 is not supported (this code reads up to 1)"."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from store.errors import IndexFormatError, IndexNotFoundError, ModelMismatchError
from store.layout import FORMAT_VERSION, MAX_FORMAT_VERSION, SHARDED_FORMAT_VERSION, write_atomic


@dataclass
class IndexManifest:
    format_version: int
    name: str
    version: str
    created_at: str
    model_name: str
    model_fingerprint: str
    embed_dim: int
    preprocessing: dict[str, Any]
    count: int
    index_factory: str
    search_params: dict[str, Any]
    measured_recall_at_10: float | None
    language_recall_at_10: dict[str, float]
    build_seconds: float
    skipped: list[dict[str, str]]
    checksums: dict[str, str]
    rerank: dict[str, Any]
    parent_version: str | None
    # Additions beyond the shared contract (all defaulted, so older manifests still load).
    total_rows: int = 0  # rows in the files, deleted ones included (count is live rows)
    build_params: dict[str, Any] = field(default_factory=dict)  # e.g. efConstruction, training size
    recall_measured_on: int = 0  # held-out queries behind measured_recall_at_10
    # indexer.match_calibration.MatchCalibration.to_dict(): thresholds of "strong / weak / no match".
    match_calibration: dict[str, Any] = field(default_factory=dict)
    # Format 2 only: the shards of a sharded version (``store.version.sharding.Sharding.to_dict()``); left
    # out of
    # the JSON when empty, so unsharded manifests are written exactly as before.
    sharding: dict[str, Any] = field(default_factory=dict)
    # The live catalogue (``store.live``): the last change-log sequence number this version holds (its
    # builder folded every change up to it, or a full build started after it); a server applies only the
    # changes after it. Left out of the JSON when 0 (a version that holds none), as ``sharding`` is.
    live_sequence: int = 0

    @property
    def is_sharded(self) -> bool:
        return bool(self.sharding)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if not data["sharding"]:
            del data["sharding"]
        if not data["live_sequence"]:
            del data["live_sequence"]
        return json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> IndexManifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise IndexFormatError(f"manifest is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise IndexFormatError("manifest must be a JSON object")
        fmt = data.get("format_version")
        if not isinstance(fmt, int) or fmt > MAX_FORMAT_VERSION:
            newest = MAX_FORMAT_VERSION
            raise IndexFormatError(
                f"manifest format_version {fmt!r} is not supported (this code reads up to {newest})"
            )
        sharded = bool(data.get("sharding"))
        if fmt == SHARDED_FORMAT_VERSION and not sharded:
            raise IndexFormatError(f"manifest format_version {fmt} (sharded) lacks its sharding block")
        if sharded and fmt == FORMAT_VERSION:
            raise IndexFormatError(f"manifest format_version {fmt} has a sharding block (needs version 2)")
        known = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - data.keys())
        if missing:
            raise IndexFormatError(f"manifest lacks field(s) {', '.join(missing)}")
        held = data.get("live_sequence", 0)
        if not isinstance(held, int) or isinstance(held, bool) or held < 0:
            raise IndexFormatError(f"manifest live_sequence {held!r} is not an integer >= 0")
        # Unknown keys come from newer writers of the same format version: ignored, not fatal.
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> IndexManifest:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise IndexNotFoundError(f"manifest not found: {path}") from None
        except UnicodeDecodeError as exc:  # a ValueError: its callers handle IndexFormatError
            raise IndexFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            return cls.from_json(text)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{path}: {exc}") from None


# -- the model an index was built with -----------------------------------------------------------------------


@lru_cache(maxsize=16)
def _fingerprint_cached(paths: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for path, _, _ in paths:
        digest.update(Path(path).name.encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over config.json + model.safetensors (whichever exist; cached per file size and mtime)."""
    model_dir = Path(model_dir)
    files = [model_dir / n for n in ("config.json", "model.safetensors") if (model_dir / n).is_file()]
    if not files:
        raise IndexFormatError(f"{model_dir} holds neither config.json nor model.safetensors")
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _fingerprint_cached(key)


def model_name_of(model_dir: Path) -> str:
    """The name a manifest records for a model: its folder name (e.g. ``ccrk-demo``)."""
    return Path(model_dir).resolve().name


def check_model(
    manifest: IndexManifest,
    *,
    expect_fingerprint: str | None = None,
    expect_model_name: str | None = None,
) -> None:
    """Raise ModelMismatchError (naming both models) when the index was built with another model.

    The fingerprint decides when given (same weights under another folder name are compatible); the name
    (``model_name_of(model_dir)``, the folder name) is compared only without a fingerprint."""
    if expect_fingerprint is not None:
        bad = expect_fingerprint != manifest.model_fingerprint
    else:
        bad = expect_model_name is not None and expect_model_name != manifest.model_name
    if bad:
        theirs = f"{expect_model_name or '?'}" + (
            f" (fingerprint {expect_fingerprint[:12]})" if expect_fingerprint else ""
        )
        raise ModelMismatchError(
            f"index {manifest.name}/{manifest.version} was built with model {manifest.model_name!r} "
            f"(fingerprint {manifest.model_fingerprint[:12]}), but the model in use is {theirs}; "
            "rebuild the index with this model or use the model it was built with"
        )
