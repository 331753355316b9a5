"""What a product write route does, blocking (run in a worker thread): check the write against the served
version (the product exists, each field's value is of the catalogue's kind), append it to the index's
change log, and with ``wait`` apply the log here until the write shows.

Nothing is acknowledged before the log has it durably; a log that does not answer is a 503 with
``Retry-After`` and nothing written, and a write the log refuses is a 422 naming the field.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from service.errors import (
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
    WriteUnavailableError,
)
from service.index_holder import Served
from service.json_limits import JsonLimitError, parse_json
from service.live.feed import LiveFeed
from service.live.schemas import (
    MAX_BATCH_LINES,
    MAX_FILTER_DELETES,
    BatchLine,
    BatchReceipt,
    DeleteByFilter,
    DeleteLine,
    PatchLine,
    ProductPatch,
    ProductUpsert,
    UpsertLine,
    WriteReceipt,
)
from service.search.filters import SearchFilters, describe
from service.uploads import decode_upload
from store.errors import ChangeLogError, InvalidChangeError
from store.live import Change, Delete, Patch, PhotoRef, Upsert
from store.version.metadata import kind_of

# What a row's item holds besides its fields (builds strip them from a manifest's fields too).
RESERVED = frozenset({"id", "path", "paths"})
Line = UpsertLine | PatchLine | DeleteLine
_LINE: TypeAdapter[Line] = TypeAdapter(BatchLine)


def _row_of(feed: LiveFeed, served: Served, item_id: str) -> int:
    feed.catch_up(served)  # a product another process deleted a moment ago is gone here too
    row = served.index.row_of(item_id)
    if row is None:
        raise NotFoundError(f"no product {item_id!r} in index {feed.name!r}", loc=("path", "item_id"))
    return row


def check_kinds(served: Served, fields: dict[str, Any]) -> None:
    """A 422 naming the field that is a searched text field (``title``, ``title@de``: its embeddings and
    terms would not follow), or whose new value is of another kind than the catalogue's products hold
    there (text where prices are numbers); a field no product holds yet takes any kind."""
    channels = getattr(served.index, "products", None)
    searched = set(channels.info.fields) if channels is not None else set()
    for name in fields:
        if name in RESERVED:
            raise InvalidInputError(
                f"field {name!r} is the product's own (its id, its photos): not a field a patch may set",
                loc=("body", "fields", name),
            )
        if name.partition("@")[0] in searched:
            raise InvalidInputError(
                f"field {name!r} is a searched text field of this index: its text is embedded and indexed, "
                "and changes through `ccrk index build`, not through a patch of fields",
                loc=("body", "fields", name),
            )
    kinds_of = getattr(served.index, "field_kinds", None)
    if kinds_of is None:
        return
    for name, value in fields.items():
        kind = kind_of(value)
        if kind is None:  # null removes the field
            continue
        held = kinds_of(name)
        if held and kind not in held:
            raise InvalidInputError(
                f"field {name!r} holds {' or '.join(sorted(held))} values in this catalogue, not {kind}",
                loc=("body", "fields", name),
            )


def _append_all(feed: LiveFeed, changes: list[Change]) -> list[int]:
    """Append in one transaction: a 422 naming the field the log refuses, a 503 when it does not answer
    (nothing written either way)."""
    try:
        return feed.write(changes)
    except InvalidChangeError as exc:
        where = tuple(exc.field.split(".")) if exc.field else ()
        raise InvalidInputError(str(exc), loc=("body", *where)) from None
    except ChangeLogError as exc:  # unavailable (busy, down) or unreadable: nothing was written
        raise WriteUnavailableError(
            f"the change log of index {feed.name!r} did not take the write: {exc}"
        ) from None


def _append(feed: LiveFeed, change: Change) -> int:
    (seq,) = _append_all(feed, [change])
    return seq


def _receipt(
    feed: LiveFeed, served: Served, change: Change, seq: int, wait: bool, wait_s: float
) -> WriteReceipt:
    visible = feed.wait_for(served, seq, wait_s) if wait else False
    return WriteReceipt(id=change.id, kind=change.kind, seq=seq, visible=visible)  # type: ignore[arg-type]


def patch_product(
    feed: LiveFeed, served: Served, item_id: str, body: ProductPatch, *, wait: bool, wait_s: float
) -> WriteReceipt:
    _row_of(feed, served, item_id)
    check_kinds(served, body.fields)
    change = Patch(item_id, fields=dict(body.fields))
    return _receipt(feed, served, change, _append(feed, change), wait, wait_s)


def delete_product(
    feed: LiveFeed, served: Served, item_id: str, *, wait: bool, wait_s: float
) -> WriteReceipt:
    _row_of(feed, served, item_id)
    change = Delete(item_id)
    return _receipt(feed, served, change, _append(feed, change), wait, wait_s)


@dataclass(frozen=True)
class PhotoLimits:
    """What an upserted photo may be: the image search upload's limits."""

    max_bytes: int
    max_pixels: int
    image_size: int


def searched_fields(served: Served) -> set[str]:
    """The index's searched text fields (base names), embedded and indexed for search."""
    channels = getattr(served.index, "products", None)
    return set(channels.info.fields) if channels is not None else set()


def upsert_change(
    feed: LiveFeed, served: Served, item_id: str, body: ProductUpsert, limits: PhotoLimits
) -> Upsert:
    """The upsert of ``body``, its photos checked (size, format, pixels, decoding: 413 / 415 / 422 naming
    ``photos[i]``) and stored durably (``store.live.photos``) before anything names them; its searched
    text fields apart from its other fields, whose kinds must be the catalogue's."""
    searched = searched_fields(served)
    text: dict[str, str] = {}
    other: dict[str, Any] = {}
    for name, value in body.fields.items():
        base = name.partition("@")[0]
        if base in searched:
            if not isinstance(value, str):
                raise InvalidInputError(
                    f"field {name!r} is a searched text field of this index: its value must be text",
                    loc=("body", "fields", name),
                )
            text[name] = value
        elif "@" in name:
            held = ", ".join(sorted(searched)) or "none"
            raise InvalidInputError(
                f"field {name!r}: only the index's searched text fields ({held}) take a language tag",
                loc=("body", "fields", name),
            )
        else:
            other[name] = value
    check_kinds(served, other)
    if not body.photos and not any(v.strip() for v in text.values()):
        raise InvalidInputError(
            "a product needs a photo or a searched text field "
            f"({', '.join(sorted(searched)) or 'this index searches photos only'}) to be found",
            loc=("body", "photos"),
        )
    refs: list[PhotoRef] = []
    for i, photo in enumerate(body.photos):
        loc = ("body", "photos", i, "data")
        try:
            data = base64.b64decode(photo.data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInputError(f"photos[{i}].data is not base64", loc=loc) from None
        image = decode_upload(
            data,
            None,
            max_bytes=limits.max_bytes,
            max_pixels=limits.max_pixels,
            image_size=limits.image_size,
            loc=loc,
        )
        try:
            refs.append(feed.photos.put(data, str(image.format)))
        except OSError as exc:
            raise WriteUnavailableError(f"photo {i} could not be stored: {exc}") from None
    return Upsert(item_id, fields=other, text=text, photos=tuple(refs))


def upsert_product(
    feed: LiveFeed,
    served: Served,
    item_id: str,
    body: ProductUpsert,
    limits: PhotoLimits,
    *,
    wait: bool,
    wait_s: float,
) -> WriteReceipt:
    feed.catch_up(served)
    change = upsert_change(feed, served, item_id, body, limits)
    return _receipt(feed, served, change, _append(feed, change), wait, wait_s)


def parse_batch(body: bytes) -> list[Line]:
    """The NDJSON lines of a batch (blank lines skipped), each validated; a 422 naming the line (``body``,
    its 0-based number, the field) for the first that is not a change, or for too many lines."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"the batch is not UTF-8 text ({exc.reason} at byte {exc.start})", loc=("body",)
        ) from None
    # "\n" only: U+2028 and friends may stand unescaped inside a JSON string (str.splitlines splits there).
    lines = [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n")) if line.strip()]
    if not lines:
        raise InvalidInputError("the batch holds no change (one JSON object per line)", loc=("body",))
    if len(lines) > MAX_BATCH_LINES:
        raise InvalidInputError(
            f"the batch holds {len(lines)} changes; at most {MAX_BATCH_LINES} are taken at once",
            loc=("body",),
        )
    out = []
    for n, line in lines:
        try:
            out.append(_LINE.validate_python(parse_json(line)))
        except JsonLimitError as exc:
            raise InvalidInputError(f"line {n + 1}: {exc}", loc=("body", n)) from None
        except ValidationError as exc:
            error = exc.errors(include_url=False, include_input=False)[0]
            raise InvalidInputError(
                f"line {n + 1}: {describe(exc)}",
                loc=("body", n, *[p for p in error["loc"] if p not in ("upsert", "patch", "delete")]),
            ) from None
    return out


def write_batch(
    feed: LiveFeed,
    served: Served,
    lines: list[Line],
    limits: PhotoLimits,
    *,
    wait: bool,
    wait_s: float,
) -> BatchReceipt:
    """Every line checked against the served version (a 404 naming the line's id for a patch or delete of
    an unknown product, a 4xx naming the line's field), its photos stored, then all appended in one
    transaction: all or nothing (a photo stored for a batch refused later is kept unnamed, by content)."""
    feed.catch_up(served)
    changes: list[Change] = []
    upserted: set[str] = set()  # a later line may patch or delete a product an earlier one adds
    for n, line in enumerate(lines):
        try:
            if isinstance(line, UpsertLine):
                changes.append(upsert_change(feed, served, line.id, line, limits))
                upserted.add(line.id)
                continue
            if line.id not in upserted and served.index.row_of(line.id) is None:
                raise NotFoundError(f"no product {line.id!r} in index {feed.name!r}", loc=("body", "id"))
            if isinstance(line, PatchLine):
                check_kinds(served, line.fields)
                changes.append(Patch(line.id, fields=dict(line.fields)))
            else:
                changes.append(Delete(line.id))
        except (InvalidInputError, NotFoundError, PayloadTooLargeError, UnsupportedMediaTypeError) as exc:
            raise type(exc)(f"line {n + 1}: {exc.message}", loc=("body", n, *exc.loc[1:])) from None
    return _batch_receipt(feed, served, _append_all(feed, changes), wait, wait_s)


def delete_matching(
    feed: LiveFeed, served: Served, body: DeleteByFilter, *, wait: bool, wait_s: float
) -> BatchReceipt:
    """Delete every product the filters match now (resolved against what this process shows), in one
    transaction; a 422 naming ``filters`` when more than ``MAX_FILTER_DELETES`` match."""
    feed.catch_up(served)
    filters = SearchFilters.of(body.filters)
    assert filters is not None
    rows = filters.rows(served)
    if rows.size > MAX_FILTER_DELETES:
        raise InvalidInputError(
            f"the filters match {rows.size} products; at most {MAX_FILTER_DELETES} are deleted at once "
            "(narrow the filters and send several)",
            loc=("body", "filters"),
        )
    if not rows.size:
        return BatchReceipt(count=0, first_seq=None, last_seq=None, visible=True)
    ids = [item["id"] for item in served.index.items(rows.tolist())]
    return _batch_receipt(feed, served, _append_all(feed, [Delete(i) for i in ids]), wait, wait_s)


def _batch_receipt(
    feed: LiveFeed, served: Served, seqs: list[int], wait: bool, wait_s: float
) -> BatchReceipt:
    visible = feed.wait_for(served, seqs[-1], wait_s) if wait else False
    return BatchReceipt(count=len(seqs), first_seq=seqs[0], last_seq=seqs[-1], visible=visible)
