"""What a product write route does, blocking (run in a worker thread): check the write against the served
version (the product exists, each field's value is of the catalogue's kind), append it to the index's
change log, and with ``wait`` apply the log here until the write shows.

Nothing is acknowledged before the log has it durably; a log that does not answer is a 503 with
``Retry-After`` and nothing written, and a write the log refuses is a 422 naming the field.
"""

from __future__ import annotations

from typing import Any

from service.errors import InvalidInputError, NotFoundError, WriteUnavailableError
from service.index_holder import Served
from service.live.feed import LiveFeed
from service.live.schemas import ProductPatch, WriteReceipt
from store.errors import ChangeLogError, InvalidChangeError
from store.live import Change, Delete, Patch
from store.metadata import kind_of


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


def _append(feed: LiveFeed, change: Change) -> int:
    try:
        (seq,) = feed.write([change])
    except InvalidChangeError as exc:
        where = tuple(exc.field.split(".")) if exc.field else ()
        raise InvalidInputError(str(exc), loc=("body", *where)) from None
    except ChangeLogError as exc:  # unavailable (busy, down) or unreadable: nothing was written
        raise WriteUnavailableError(
            f"the change log of index {feed.name!r} did not take the write: {exc}"
        ) from None
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
