"""Reader of the reference catalogue format (one JSON object per line), used by the trainer.

Each line: {"id": "test-000123", "image": "images/test/test-000123.png",
            "captions": {"en": ["...", ...], "de": [...], ...}, "attributes": {...}}
`image` is relative to the jsonl's folder (an absolute path is kept as is); `attributes` is optional.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CatalogueFormatError(ValueError):
    """A catalogue file is malformed; the message names the file and the line."""


@dataclass(frozen=True)
class CatalogueRecord:
    id: str
    image: Path  # absolute
    captions: dict[str, list[str]]
    attributes: dict[str, Any] | None = None


def _fail(path: Path, lineno: int, message: str) -> CatalogueFormatError:
    return CatalogueFormatError(f"{path}:{lineno}: {message}")


def _captions(value: object, path: Path, lineno: int) -> dict[str, list[str]]:
    if not isinstance(value, dict) or not value:
        raise _fail(path, lineno, "field 'captions' must be a non-empty object: language -> list of strings")
    captions: dict[str, list[str]] = {}
    for lang, texts in value.items():
        if not isinstance(texts, list) or not texts:
            raise _fail(path, lineno, f"captions[{lang!r}] must be a non-empty list of strings")
        for text in texts:
            if not isinstance(text, str) or not text.strip():
                raise _fail(path, lineno, f"captions[{lang!r}] holds {text!r}, not a non-empty string")
        captions[lang] = list(texts)
    return captions


def _string_field(obj: dict[str, Any], name: str, path: Path, lineno: int) -> str:
    if name not in obj:
        raise _fail(path, lineno, f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, str) or not value:
        raise _fail(path, lineno, f"field {name!r} must be a non-empty string, got {value!r}")
    return value


def parse_record(line: str, path: Path, lineno: int) -> CatalogueRecord:
    """One jsonl line -> record; `path` and `lineno` only serve error messages and resolving `image`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _fail(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    record_id = _string_field(obj, "id", path, lineno)
    image = Path(_string_field(obj, "image", path, lineno))
    if "captions" not in obj:
        raise _fail(path, lineno, "missing field 'captions'")
    captions = _captions(obj["captions"], path, lineno)
    attributes = obj.get("attributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise _fail(path, lineno, "field 'attributes' must be an object when present")
    if not image.is_absolute():
        # Joined, not resolved per record: resolving 20k paths costs a second of syscalls.
        image = Path(os.path.normpath(path.parent.absolute() / image))
    return CatalogueRecord(id=record_id, image=image, captions=captions, attributes=attributes)


def load_split(path: Path) -> list[CatalogueRecord]:
    """Read a catalogue jsonl; blank lines are skipped, duplicate ids are an error."""
    path = Path(path).resolve()
    records: list[CatalogueRecord] = []
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = parse_record(line, path, lineno)
            if record.id in first_line:
                first = first_line[record.id]
                raise _fail(path, lineno, f"duplicate id {record.id!r} (first on line {first})")
            first_line[record.id] = lineno
            records.append(record)
    return records
