"""Build inputs: folders of images, manifests (JSONL or CSV) and the synthetic catalogue's jsonl.

Every source yields ``SourceItem``s: the catalogue's own string id, an absolute image path, metadata
fields, and captions by language when the source has them (the synthetic catalogue). Reading a source
never opens images; bad images are found by the decoder and skipped there. A malformed source file is a
``SourceError`` naming the file and line, raised before any work starts; so is a value the version's
metadata cannot hold (``_refused``: text that is not Unicode, as a lone surrogate or bytes that are not
UTF-8; numbers JSON has not, as NaN and Infinity; nesting past ``MAX_DEPTH``), naming its field too.
Symbolic links are judged as the service judges them: a folder's links out of it, and a manifest's photos
that are links out of their own folder, are skipped and listed unless ``follow_external_links``.

Over 400 lines: the folder scan and the two manifest readers share their checks (field names, values,
links), which read best beside them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.errors import SourceError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif"})
_INT_RE = re.compile(r"^-?(0|[1-9][0-9]*)$")
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): a lone one decodes to text no encoder writes.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_DEPTH = 64  # nesting of a metadata value (SQLite's JSON refuses deeper; a catalogue needs a few)
_FLOAT_RE = re.compile(r"^-?(0|[1-9][0-9]*)?\.[0-9]+([eE][-+]?[0-9]+)?$|^-?(0|[1-9][0-9]*)[eE][-+]?[0-9]+$")


@dataclass(frozen=True)
class SourceItem:
    id: str
    path: Path  # absolute (joined, not resolved: the file may be missing, which the decoder reports)
    fields: dict[str, Any] = field(default_factory=dict)
    captions: dict[str, list[str]] = field(default_factory=dict)
    source: str = ""  # where the item came from, for the build report (file, or file:line)
    # A product's further photos (a manifest row's ``paths`` after the first); ``path`` is its first photo,
    # the version's own image of the item.
    extra_paths: tuple[Path, ...] = ()


@dataclass
class SourceScan:
    items: list[SourceItem]
    ignored: int = 0  # files in folders that are not images by suffix
    # Symbolic links in folders that were not followed: {"path", "target", "reason"} (the build report).
    skipped_links: list[dict[str, str]] = field(default_factory=list)


LINK_OUTSIDE = "leads outside the source folder (CCRK_FOLLOW_EXTERNAL_LINKS=true indexes it)"
LINK_TO_INSIDE_FOLDER = (
    "a link to a folder inside the source folder: its images are indexed under their own paths"
)
LINK_LOOP = "a link to a folder that is indexed already"
LINK_OUT_OF_FOLDER = (
    "a manifest's photo that is a link out of its own folder (CCRK_FOLLOW_EXTERNAL_LINKS=true indexes it)"
)


# A folder's Path extended by one file name without parsing the whole path again (CPython's own helper
# for listing folders; 3.11 and 3.12 have it): pathlib's parsing was most of reading a 100,000-row
# manifest. Where it is missing, ``Path(text)`` as before.
_CHILD = getattr(Path, "_make_child_relpath", None)


def _absolute(base: str, value: str, folders: dict[str, Path] | None = None) -> Path:
    """``value`` made absolute against ``base``, an absolute, normalised folder (``os.path.abspath``, once
    per source file: not per row). ``folders``: Paths of the folders seen so far in this source."""
    text = os.path.expanduser(value) if value.startswith("~") else value
    if not os.path.isabs(text):
        # Joined, not resolved per item: resolving a million paths costs seconds of syscalls. On strings:
        # pathlib's parsing per item was 2/3 of reading a 100,000-row manifest. Normalised only when it
        # may change something (".", "..", "//" or a trailing "/"): a plain relative path joins as it is.
        text = os.path.join(base, text)
        if os.sep != "/" or "/." in text or "//" in text or text.endswith("/"):
            text = os.path.normpath(text)
    if _CHILD is None or folders is None or os.sep != "/":
        return Path(text)
    folder, _, name = text.rpartition("/")
    if not folder or name in ("", "."):  # pathlib drops these: parse them as it does
        return Path(text)
    parent = folders.get(folder)
    if parent is None:
        parent = folders[folder] = Path(folder)
    return _CHILD(parent, name)  # type: ignore[no-any-return]


def _coerce_csv(value: str) -> Any:
    """CSV cells are text: numbers become numbers (so range filters work); '00123'-style codes stay text,
    as do numbers no float holds (1e999) and integers too long to read."""
    text = value.strip()
    try:
        if _INT_RE.match(text):
            return int(text)
        if _FLOAT_RE.match(text):
            number = float(text)
            return number if math.isfinite(number) else value
    except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
        return value
    return value


class _Refused(ValueError):
    """A JSON number the metadata cannot hold (NaN, Infinity, a float past its range)."""


class _Constant:
    """Such a number where it stood, so that its field can be named."""

    def __init__(self, text: str) -> None:
        self.text = text


def _refuse_constant(text: str) -> Any:
    raise _Refused(text)


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _Refused(text)
    return number


def _unicode_error(text: str) -> str | None:
    """Why ``text`` is not writable Unicode (a lone surrogate: from a JSON escape, or standing for a byte
    that is not UTF-8 in a file read with ``surrogateescape``), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if 0xDC80 <= code <= 0xDCFF:
            return f"invalid UTF-8 (byte 0x{code - 0xDC00:02x})"
        return f"a lone surrogate \\u{code:04x} (not a character; UTF-8 cannot hold it)"
    return None


def _refused(value: Any, depth: int = 0) -> tuple[list[str], str] | None:
    """(field path, reason) of the first part of a metadata value that metadata.sqlite cannot hold."""
    if isinstance(value, str):
        why = _unicode_error(value)
        return ([], why) if why else None
    if isinstance(value, _Constant):
        return [], f"{value.text} is not a number JSON or the metadata can hold (leave the field out)"
    if isinstance(value, float) and not math.isfinite(value):
        return [], f"{value} is not a number the metadata can hold"
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return [], f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for key, inner in value.items():
            why = _unicode_error(key)
            if why:
                return [key], f"its name holds {why}"
            found = _refused(inner, depth + 1)
            if found:
                return [key, *found[0]], found[1]
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found = _refused(inner, depth + 1)
            if found:
                return [f"[{i}]", *found[0]], found[1]
    return None


def field_name(parts: list[str]) -> str:
    """A field path for a message: 'attrs.colour[2]', quoted; escaped where it is not writable text."""
    text = "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(parts))
    return ascii(text) if _unicode_error(text) else repr(text)


def _check_values(obj: dict[str, Any], where: str) -> None:
    """SourceError naming the field of the first value ``_refused`` finds."""
    found = _refused(obj)
    if found:
        raise SourceError(f"{where}: field {field_name(found[0])}: {found[1]}")


def _check_field_names(names: Iterable[str], where: str, valid: set[str] | None = None) -> None:
    """``valid``: names checked already (a manifest repeats its field names on every row), extended."""
    for name in names:
        if valid is not None and name in valid:
            continue
        if not name or '"' in name or any(ord(c) < 32 for c in name) or _unicode_error(name):
            raise SourceError(f"{where}: invalid metadata field name {name!r}")
        if valid is not None:
            valid.add(name)


def _inside(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def scan_folder(folder: Path, *, follow_external_links: bool = False) -> SourceScan:
    """Every image (by suffix) under ``folder``, recursively, in sorted order (a folder's files, then its
    subfolders, depth first); id = relative posix path. Hidden files and folders are left out.

    Symbolic links are resolved and judged by where they lead. A link to a file inside ``folder`` is
    indexed under the link's own path; a link that leads outside is skipped and listed in
    ``skipped_links`` unless ``follow_external_links``: indexing a folder must not expose other files of
    the machine (the service serves indexed images by path). A link to a folder inside is not followed
    (its images are indexed under their own paths; following it would index them twice, or loop); one to
    a folder outside is followed only with ``follow_external_links``, each folder once."""
    folder = Path(folder)
    root = os.path.realpath(folder)
    items: list[SourceItem] = []
    links: list[dict[str, str]] = []
    ignored = 0
    followed = {root}

    def skip_link(path: Path, target: str, reason: str) -> None:
        links.append({"path": str(path), "target": target, "reason": reason})

    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # an unreadable folder yields nothing (as os.walk did)
        subdirs: list[Path] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                target = os.path.realpath(path)
                inside = _inside(target, root)
                if os.path.isdir(target):
                    if inside:
                        skip_link(path, target, LINK_TO_INSIDE_FOLDER)
                    elif not follow_external_links:
                        skip_link(path, target, LINK_OUTSIDE)
                    elif target in followed:
                        skip_link(path, target, LINK_LOOP)
                    else:
                        followed.add(target)
                        subdirs.append(path)
                    continue
                if path.suffix.lower() in IMAGE_SUFFIXES and not inside and not follow_external_links:
                    skip_link(path, target, LINK_OUTSIDE)
                    continue
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(path)
                continue
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                ignored += 1
                continue
            rel = path.relative_to(folder).as_posix()
            items.append(SourceItem(id=rel, path=path.absolute(), source=str(path)))
        stack.extend(reversed(subdirs))
    return SourceScan(items, ignored, links)


@dataclass
class _Reading:
    """What every row of one source file shares: its name, its folder (absolute, normalised) and the field
    names found valid so far."""

    path: Path
    name: str = ""
    base: str = ""
    valid_names: set[str] = field(default_factory=set)
    folders: dict[str, Path] = field(default_factory=dict)  # ``_absolute``'s

    def __post_init__(self) -> None:
        self.name = str(self.path)
        self.base = os.path.abspath(self.path.parent)


def _item_from_object(obj: dict[str, Any], source: _Reading, lineno: int) -> SourceItem:
    where = f"{source.name}:{lineno}"
    item_id = obj.get("id")
    if isinstance(item_id, int) and not isinstance(item_id, bool):
        item_id = str(item_id)
    if not isinstance(item_id, str) or not item_id.strip():
        raise SourceError(f"{where}: field 'id' must be a non-empty string, got {item_id!r}")
    if "captions" in obj and "image" in obj and "path" not in obj:
        # The synthetic catalogue's reference format: image, captions, attributes.
        image = obj["image"]
        captions = obj["captions"]
        if not isinstance(captions, dict) or not all(
            isinstance(v, list) and all(isinstance(t, str) for t in v) for v in captions.values()
        ):
            raise SourceError(f"{where}: field 'captions' must map language -> list of strings")
        attributes = obj.get("attributes") or {}
        if not isinstance(attributes, dict):
            raise SourceError(f"{where}: field 'attributes' must be an object")
        # Its other top-level fields (a shop title, ``ccrk data synth --shop-titles``) are metadata too.
        extra = {k: v for k, v in obj.items() if k not in ("id", "image", "captions", "attributes")}
        fields = {**attributes, **extra}
        caps = {str(k): list(v) for k, v in captions.items() if v}
    else:
        image, extra = _photo_paths(obj, where)
        fields = {k: v for k, v in obj.items() if k not in ("id", "path", "paths")}
        caps = {}
    if not isinstance(image, str) or not image.strip() or "\0" in image:
        key = "image" if "image" in obj and "path" not in obj else "path"
        raise SourceError(f"{where}: field {key!r} must be a non-empty string without NUL, got {image!r}")
    _check_field_names(fields, where, source.valid_names)
    return SourceItem(
        id=item_id,
        path=_absolute(source.base, image, source.folders),
        fields=fields,
        captions=caps,
        source=where,
        extra_paths=tuple(_absolute(source.base, p, source.folders) for p in extra)
        if "image" not in obj
        else (),
    )


MAX_PHOTOS = 512  # photos of one product


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\0" not in value


def _photo_paths(obj: dict[str, Any], where: str) -> tuple[Any, list[str]]:
    """A manifest row's first photo and its further ones: ``path`` (one photo), ``paths`` (a list, first
    photo first), or both (``path`` first, then ``paths`` without it)."""
    paths = obj.get("paths")
    if paths is None:
        return obj.get("path"), []
    if not isinstance(paths, list) or not paths or not all(_is_path(p) for p in paths):
        raise SourceError(f"{where}: field 'paths' must be a non-empty list of non-empty strings without NUL")
    if len(paths) > MAX_PHOTOS:
        raise SourceError(f"{where}: field 'paths' lists {len(paths)} photos; at most {MAX_PHOTOS}")
    first = obj.get("path", paths[0])
    rest = [p for p in dict.fromkeys(paths) if p != first]
    return first, rest


def _kept_float(text: str) -> Any:
    number = float(text)
    return number if math.isfinite(number) else _Constant(text)


# Built once: json.loads with hooks builds a decoder per call (a third of reading a 100,000-row manifest).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _parse_line(line: str, where: str) -> Any:
    """One JSONL line parsed; SourceError naming what is refused (``_refused``) and where."""
    if not line.isascii():
        why = _unicode_error(line)  # read with surrogateescape: bytes that are not UTF-8
        if why:
            column = next(i for i, c in enumerate(line, start=1) if _unicode_error(c))
            raise SourceError(f"{where}: {why} at column {column}")
    refused = False
    try:
        try:
            obj = _DECODER.decode(line)
        except _Refused:  # again, keeping such numbers where they stood, to name their field
            obj, refused = json.loads(line, parse_constant=_Constant, parse_float=_kept_float), True
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise SourceError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more digits than int() reads
        raise SourceError(f"{where}: invalid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    # The whole row is walked only when something in it may be refused: a number refused above, a
    # surrogate escape, or enough brackets to nest past MAX_DEPTH.
    if refused or _SURROGATE_ESCAPE.search(line) or line.count("[") + line.count("{") > MAX_DEPTH:
        _check_values(obj, where)
    return obj


def read_jsonl(path: Path) -> Iterator[SourceItem]:
    """A manifest (id, path, metadata...) or the synthetic catalogue (id, image, captions, attributes)."""
    source = _Reading(Path(path))
    # surrogateescape: bytes that are not UTF-8 are named with their line (``_parse_line``), not a traceback.
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            obj = _parse_line(line, f"{path}:{lineno}")
            yield _item_from_object(obj, source, lineno)


def read_csv(path: Path) -> Iterator[SourceItem]:
    """A CSV manifest with a header naming at least ``id`` and ``path``; other columns are metadata."""
    # surrogateescape: bytes that are not UTF-8 are named with their line and column, not a traceback.
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames or []
            for name in header:
                why = _unicode_error(name)
                if why:
                    raise SourceError(f"{path}:{reader.line_num}: header column {name!a} holds {why}")
            missing = [c for c in ("id", "path") if c not in header]
            if missing:
                raise SourceError(
                    f"{path}: CSV header lacks column(s) {', '.join(missing)} (header: {header})"
                )
            _check_field_names([h for h in header if h not in ("id", "path")], str(path))
            source = _Reading(Path(path))
            for row in reader:
                lineno = reader.line_num
                if None in row:
                    raise SourceError(f"{path}:{lineno}: more cells than header columns")
                for name, cell in row.items():
                    why = _unicode_error(cell) if cell else None
                    if why:
                        raise SourceError(f"{path}:{lineno}: field {field_name([name])}: {why}")
                fields = {
                    k: _coerce_csv(v)
                    for k, v in row.items()
                    if k not in ("id", "path") and v not in ("", None)
                }
                yield _item_from_object({"id": row["id"], "path": row["path"], **fields}, source, lineno)
        except csv.Error as exc:  # e.g. a cell past csv.field_size_limit
            raise SourceError(f"{path}:{reader.line_num}: unreadable CSV ({exc})") from None


def _link_out_of_folder(path: Path) -> str | None:
    """Where ``path`` leads when it is a symbolic link out of its own folder (the service refuses to serve
    such a file, ``service.item_images``), else None."""
    if not os.path.islink(path):
        return None
    target = os.path.realpath(path)
    return None if _inside(target, os.path.realpath(path.parent)) else target


def _without_links_out(items: list[SourceItem], links: list[dict[str, str]]) -> list[SourceItem]:
    """A manifest's items without their photos that are links out of their folder (listed in ``links``),
    as a folder's scan leaves them out: a product keeps its other photos (the first left is its first);
    an item with none left is not indexed."""
    kept: list[SourceItem] = []
    for item in items:
        photos = [item.path, *item.extra_paths]
        good = []
        for photo in photos:
            target = _link_out_of_folder(photo)
            if target is None:
                good.append(photo)
            else:
                links.append({"path": str(photo), "target": target, "reason": LINK_OUT_OF_FOLDER})
        if len(good) == len(photos):
            kept.append(item)
        elif good:
            kept.append(dataclasses.replace(item, path=good[0], extra_paths=tuple(good[1:])))
    return kept


def read_sources(sources: Sequence[Path], *, follow_external_links: bool = False) -> SourceScan:
    """All items of all sources, in order; duplicate ids across or within sources are an error.

    ``follow_external_links``: symbolic links that lead out of a folder (``scan_folder``), and a manifest's
    photos that are links out of their own folder (``_without_links_out``), are indexed; else skipped and
    listed in ``skipped_links``."""
    if not sources:
        raise SourceError("no source given: pass image folders, manifests (.jsonl/.csv) or a catalogue jsonl")
    items: list[SourceItem] = []
    ignored = 0
    links: list[dict[str, str]] = []
    for source in sources:
        source = Path(source)
        if source.is_dir():
            scan = scan_folder(source, follow_external_links=follow_external_links)
            items.extend(scan.items)
            ignored += scan.ignored
            links.extend(scan.skipped_links)
        elif not source.exists():
            raise SourceError(f"source not found: {source}")
        elif source.suffix.lower() in (".jsonl", ".csv"):
            read = read_jsonl if source.suffix.lower() == ".jsonl" else read_csv
            rows = list(read(source))
            items.extend(rows if follow_external_links else _without_links_out(rows, links))
        else:
            raise SourceError(f"{source}: not a folder, .jsonl or .csv manifest")
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            raise SourceError(f"duplicate id {item.id!r}: {seen[item.id]} and {item.source}")
        seen[item.id] = item.source
    return SourceScan(items, ignored, links)
