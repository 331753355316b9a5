"""The change log's records: exact round trips, canonical bytes, the field named on bad input, and damaged
or foreign records refused with a typed error."""

from __future__ import annotations

import json
import math

import pytest

from store.errors import ChangeLogCorruptError, ChangeLogError, InvalidChangeError
from store.live import Delete, Patch, PhotoRef, Upsert, decode_change, encode_change

DIGEST = "0123456789abcdef0123456789abcdef"

CHANGES = [
    Upsert(
        id="sku-1/ä",
        fields={"price": 2.49, "in_stock": True, "tags": ["bio", "vegan"], "dims": {"w": 3, "h": None}},
        text={"title": "Apfelsaft naturtrüb", "title_ja": "りんごジュース"},
        photos=(PhotoRef(DIGEST, "photos/ab/0123.jpg"), PhotoRef("f" * 32, "s3://bucket/x")),
    ),
    Upsert(id="bare"),
    Patch(id="sku-1/ä", fields={"price": 1.99, "stock": 0}),
    Patch(id="sku-2", text={"title": "juice"}),
    Delete(id="sku-3"),
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: f"{c.kind}-{c.id}")
def test_a_record_reads_back_as_the_change_written(change: object) -> None:
    record = encode_change(change)  # type: ignore[arg-type]
    back = decode_change(record, seq=1)
    assert back == change and type(back) is type(change)
    assert encode_change(back) == record, "the same change is the same bytes"
    body = json.loads(record)
    assert body["format"] == 1 and body["kind"] == change.kind  # type: ignore[attr-defined]


def test_a_photo_list_is_kept_as_a_tuple_and_key_order_does_not_change_the_record() -> None:
    a = Upsert(id="x", fields={"b": 1, "a": 2}, photos=[PhotoRef(DIGEST, "p")])  # type: ignore[arg-type]
    b = Upsert(id="x", fields={"a": 2, "b": 1}, photos=(PhotoRef(DIGEST, "p"),))
    assert a.photos == b.photos and encode_change(a) == encode_change(b)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (Delete(id=""), "id"),
        (Delete(id="x" * 513), "id"),
        (Upsert(id="a", fields={"price": math.nan}), "fields.price"),
        (Upsert(id="a", fields={"price": math.inf}), "fields.price"),
        (Upsert(id="a", fields={"when": object()}), "fields.when"),
        (Upsert(id="a", fields={"dims": {"w": [1, math.nan]}}), "fields.dims.w[1]"),
        (Upsert(id="a", fields={"": 1}), "fields"),
        (Upsert(id="a", text={"title": 3}), "text.title"),  # type: ignore[dict-item]
        (Upsert(id="a", photos=(PhotoRef("ABC", "p"),)), "photos[0].digest"),
        (Upsert(id="a", photos=(PhotoRef(DIGEST.upper(), "p"),)), "photos[0].digest"),
        (Upsert(id="a", photos=(PhotoRef(DIGEST, "p"), PhotoRef(DIGEST, ""))), "photos[1].location"),
        (Patch(id="a"), "fields"),
    ],
)
def test_a_change_that_cannot_be_recorded_names_its_field(change: object, field: str) -> None:
    with pytest.raises(InvalidChangeError) as caught:
        encode_change(change)  # type: ignore[arg-type]
    assert caught.value.field == field


GOOD = encode_change(CHANGES[0])


@pytest.mark.parametrize(
    "record",
    [
        "",
        "{",
        GOOD[:-1],
        "[]",
        '"upsert"',
        GOOD.replace('"format":1', '"format":0'),
        GOOD.replace('"format":1', '"format":"1"'),
        GOOD.replace('"format":1', '"format":true'),
        GOOD.replace('"kind":"upsert"', '"kind":"merge"'),
        GOOD.replace('"kind":"upsert"', '"kind":"delete"'),  # a delete's keys are not these
        GOOD.replace('"id":"sku-1/ä"', '"id":""'),
        GOOD.replace('"id":"sku-1/ä"', '"id":7'),
        GOOD.replace(DIGEST, "zz"),
        GOOD.replace('"photos":[', '"photos":[1,'),
        GOOD.replace('"text":{', '"text":{"n":1,'),
        GOOD.replace('"fields":{', '"fields":{"x":NaN,'),  # json.loads takes NaN; a writer never writes it
        json.dumps({"format": 1, "kind": "patch", "id": "a", "fields": {}, "text": {}}),
        json.dumps({"format": 1, "kind": "delete", "id": "a", "extra": 1}),
    ],
)
def test_a_damaged_record_is_a_typed_error_naming_its_sequence(record: str) -> None:
    with pytest.raises(ChangeLogCorruptError, match=r"record 42 is damaged"):
        decode_change(record, seq=42)


def test_a_record_of_a_newer_format_is_refused_as_such() -> None:
    with pytest.raises(ChangeLogError, match="format 2, newer") as caught:
        decode_change(GOOD.replace('"format":1', '"format":2'), seq=3)
    assert not isinstance(caught.value, ChangeLogCorruptError)
