"""The change log's records: what one product change is, and its versioned JSON form on disk.

Three kinds, each naming one product by its id::

    upsert   the whole product: fields (metadata: price, stock, ...), text fields, photos
    patch    changed fields and/or text fields only (photos untouched, so they are not re-encoded)
    delete   the product is gone

A record is one JSON object with a ``format`` field (``RECORD_FORMAT``) and a ``kind``; keys are sorted
and the separators fixed, so the same change is always the same bytes (its checksum is stable). Photos are
never inside a record: a record holds each photo's content digest (blake2b-128, ``store.version.reuse``'s
image
digest, so a photo already in a version is known by it) and where its bytes are stored.

Records are validated twice: when written (``InvalidChangeError`` names the field, nothing is written) and
when read (``ChangeLogCorruptError`` names the sequence number): a log is read by other processes and
other releases, and a damaged or foreign record must stop the reader with a typed error rather than be
applied half-understood.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from store.errors import ChangeLogCorruptError, ChangeLogError, InvalidChangeError
from store.version.reuse import DIGEST_BYTES

RECORD_FORMAT = 1  # the newest record format this code writes and reads
MAX_ID_CHARS = 512
_DIGEST_RE = re.compile(rf"^[0-9a-f]{{{2 * DIGEST_BYTES}}}$")

JsonValue = Any  # what json.loads returns: None, bool, int, float, str, list, dict (checked at write)


@dataclass(frozen=True)
class PhotoRef:
    """A product photo by its content digest (hex blake2b-128 of its bytes) and where those bytes are kept
    (a path or key in the photo store the write route chose; the log never holds image bytes)."""

    digest: str
    location: str


@dataclass(frozen=True)
class Upsert:
    """The whole product: replaces any earlier state of ``id`` (or adds it)."""

    kind: ClassVar[str] = "upsert"
    id: str
    fields: Mapping[str, JsonValue] = field(default_factory=dict)
    text: Mapping[str, str] = field(default_factory=dict)
    photos: tuple[PhotoRef, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "photos", tuple(self.photos))  # a list given is kept as a tuple


@dataclass(frozen=True)
class Patch:
    """Some fields of an existing product: only those named change (a text field named is analysed and
    embedded again; the photos stay)."""

    kind: ClassVar[str] = "patch"
    id: str
    fields: Mapping[str, JsonValue] = field(default_factory=dict)
    text: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delete:
    kind: ClassVar[str] = "delete"
    id: str


Change = Upsert | Patch | Delete
KINDS: dict[str, type[Upsert] | type[Patch] | type[Delete]] = {c.kind: c for c in (Upsert, Patch, Delete)}


@dataclass(frozen=True)
class Entry:
    """One committed change: its sequence number (assigned at commit, increasing, never reused) and the
    commit's wall time (seconds since the epoch: what apply lag is measured from)."""

    seq: int
    committed_at: float
    change: Change


# -- validation ------------------------------------------------------------------------------------------


def _check_json(value: JsonValue, where: str) -> None:
    """``value`` is plain JSON (no NaN or infinity, which JSON has not; string keys only)."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # SQLite holds 64-bit integers: a filter would read a float
            raise InvalidChangeError(f"{where}: {value} is outside the 64-bit integers", field=where)
        return
    if isinstance(value, str):
        _check_text(value, where)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidChangeError(f"{where}: {value} is not a JSON number", field=where)
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidChangeError(f"{where}: key {key!r} is not a string", field=where)
            _check_text(key, where)
            _check_json(item, f"{where}.{key}")
        return
    raise InvalidChangeError(f"{where}: a {type(value).__name__} is not a JSON value", field=where)


def _check_text(text: str, where: str) -> None:
    """``text`` is UTF-8 encodable (a lone surrogate, which JSON's escapes allow, is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidChangeError(f"{where}: not valid Unicode text (a lone surrogate)", field=where) from None


def _check_names(mapping: object, where: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        raise InvalidChangeError(f"{where}: must be an object of named values", field=where)
    for name in mapping:
        if not isinstance(name, str) or not name:
            raise InvalidChangeError(f"{where}: field name {name!r} must be a non-empty string", field=where)
        _check_text(name, where)
    return mapping


def validate_change(change: object) -> Change:
    """``change`` itself when it is a change this log can record; else ``InvalidChangeError`` naming the
    field at fault."""
    if not isinstance(change, Upsert | Patch | Delete):
        raise InvalidChangeError(f"not a change: {type(change).__name__}")
    if not isinstance(change.id, str) or not change.id or len(change.id) > MAX_ID_CHARS:
        raise InvalidChangeError(f"id must be a non-empty string of at most {MAX_ID_CHARS} characters", "id")
    _check_text(change.id, "id")
    if isinstance(change, Delete):
        return change
    for name, value in _check_names(change.fields, "fields").items():
        _check_json(value, f"fields.{name}")
    for name, value in _check_names(change.text, "text").items():
        if not isinstance(value, str):
            raise InvalidChangeError(f"text.{name}: a text field must be a string", field=f"text.{name}")
        _check_text(value, f"text.{name}")
    if isinstance(change, Patch) and not change.fields and not change.text:
        raise InvalidChangeError("a patch must change at least one field", field="fields")
    if isinstance(change, Upsert):
        for i, photo in enumerate(change.photos):
            where = f"photos[{i}]"
            if not isinstance(photo, PhotoRef):
                raise InvalidChangeError(f"{where}: not a photo reference", field=where)
            if not isinstance(photo.digest, str) or not _DIGEST_RE.match(photo.digest):
                raise InvalidChangeError(
                    f"{where}.digest: must be {2 * DIGEST_BYTES} lowercase hex digits",
                    field=f"{where}.digest",
                )
            if not isinstance(photo.location, str) or not photo.location:
                raise InvalidChangeError(
                    f"{where}.location: must be a non-empty string", field=f"{where}.location"
                )
    return change


# -- the JSON form ---------------------------------------------------------------------------------------


def _as_object(change: Change) -> dict[str, Any]:
    body: dict[str, Any] = {"format": RECORD_FORMAT, "kind": change.kind, "id": change.id}
    if isinstance(change, Upsert | Patch):
        body["fields"] = dict(change.fields)
        body["text"] = dict(change.text)
    if isinstance(change, Upsert):
        body["photos"] = [{"digest": p.digest, "location": p.location} for p in change.photos]
    return body


def encode_change(change: Change) -> str:
    """The record of ``change``: canonical JSON (sorted keys, fixed separators, UTF-8 kept as is)."""
    validate_change(change)
    return json.dumps(_as_object(change), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_KEYS = {
    "upsert": {"format", "kind", "id", "fields", "text", "photos"},
    "patch": {"format", "kind", "id", "fields", "text"},
    "delete": {"format", "kind", "id"},
}


def decode_change(record: str, seq: int, where: str = "change log") -> Change:
    """The change a record holds. A record that does not parse, or holds anything but what
    ``encode_change`` writes, raises ``ChangeLogCorruptError`` (naming ``where`` and ``seq``); one of a
    newer format raises ``ChangeLogError`` (written by a newer release)."""

    def damaged(why: str) -> ChangeLogCorruptError:
        return ChangeLogCorruptError(f"{where}: record {seq} is damaged: {why}")

    try:
        body = json.loads(record)
    except (TypeError, ValueError) as exc:  # JSONDecodeError, and bytes that are not text
        raise damaged(f"not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise damaged("not a JSON object")
    fmt = body.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise damaged(f"format {fmt!r}")
    if fmt > RECORD_FORMAT:
        raise ChangeLogError(f"{where}: record {seq} has format {fmt}, newer than this release reads")
    kind = body.get("kind")
    if kind not in _KEYS:
        raise damaged(f"unknown kind {kind!r}")
    if set(body) != _KEYS[kind]:
        raise damaged(f"keys {sorted(body)} are not those of a {kind}")
    try:
        change: Change
        if kind == "delete":
            change = Delete(id=body["id"])
        elif kind == "patch":
            change = Patch(id=body["id"], fields=body["fields"], text=body["text"])
        else:
            photos = body["photos"]
            if not isinstance(photos, list) or not all(
                isinstance(p, dict) and set(p) == {"digest", "location"} for p in photos
            ):
                raise damaged("photos are not digest and location pairs")
            change = Upsert(
                id=body["id"],
                fields=body["fields"],
                text=body["text"],
                photos=tuple(PhotoRef(p["digest"], p["location"]) for p in photos),
            )
        return validate_change(change)
    except InvalidChangeError as exc:
        raise damaged(str(exc)) from None
