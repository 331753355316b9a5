"""Request and response models of the product write routes (``service.api.routes.products``; they are the
OpenAPI schema), with their limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, StringConstraints

from service.schemas import FieldName, Filters, UnicodeText

MAX_PATCH_FIELDS = 64
MAX_BATCH_LINES = 1_000  # changes per batch request: one transaction, all or nothing
MAX_BATCH_BYTES = 4 * 1024 * 1024
MAX_FILTER_DELETES = 10_000  # products one delete by filter may remove (the log's batch bound)
ProductIdText = Annotated[UnicodeText, StringConstraints(min_length=1, max_length=512)]
PatchFields = Annotated[dict[FieldName, JsonValue], Field(min_length=1, max_length=MAX_PATCH_FIELDS)]


class ProductPatch(BaseModel):
    """Fields of one product to change: each named field takes its new value; ``null`` removes it (JSON
    merge patch, RFC 7396, at the top level). A value must be of the kind the catalogue's products hold
    in that field (a number where prices are numbers). Text fields and photos are not changed here."""

    model_config = ConfigDict(extra="forbid")
    fields: PatchFields = Field(description='The fields to change, e.g. {"price": 7.5, "in_stock": false}.')


MAX_UPSERT_FIELDS = 256
# A field name, or a text field's name tagged with its language (``title@de``, ``title@zh-hant``).
UpsertFieldName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}(@[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*)?$")
]
MAX_UPSERT_PHOTOS = 8
# A whole upsert's body: its photos in base64 (4/3 of their bytes), each also within CCRK_MAX_UPLOAD_MB.
MAX_UPSERT_BYTES = 48 * 1024 * 1024


class PhotoUpload(BaseModel):
    """One photo of a product, its bytes in base64 (JPEG, PNG or WebP; never fetched from a URL)."""

    model_config = ConfigDict(extra="forbid")
    data: Annotated[str, StringConstraints(min_length=1)] = Field(description="The photo's bytes, base64.")


class ProductUpsert(BaseModel):
    """The whole product: its fields (metadata, and the index's searched text fields such as ``title`` or
    ``title@de``, embedded and indexed for search) and its photos, the first one its own image. Replaces
    every earlier state of the product, or adds it."""

    model_config = ConfigDict(extra="forbid")
    fields: Annotated[dict[UpsertFieldName, JsonValue], Field(max_length=MAX_UPSERT_FIELDS)] = Field(
        default_factory=dict, description='e.g. {"title": "Red mug", "title@de": "Rote Tasse", "price": 7.5}'
    )
    photos: Annotated[list[PhotoUpload], Field(max_length=MAX_UPSERT_PHOTOS)] = Field(default_factory=list)


class PatchLine(BaseModel):
    """One line of a batch: ``{"op": "patch", "id": ..., "fields": {...}}``."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["patch"]
    id: ProductIdText
    fields: PatchFields


class DeleteLine(BaseModel):
    """One line of a batch: ``{"op": "delete", "id": ...}``."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["delete"]
    id: ProductIdText


class UpsertLine(ProductUpsert):
    """One line of a batch: ``{"op": "upsert", "id": ..., "fields": {...}, "photos": [{"data": ...}]}`` (the
    whole batch within 4 MiB: large photos go one product at a time, ``PUT``)."""

    op: Literal["upsert"]
    id: ProductIdText


BatchLine = Annotated[UpsertLine | PatchLine | DeleteLine, Discriminator("op")]


class DeleteByFilter(BaseModel):
    """Delete every product matching the filters (the search filters' syntax), at most
    ``MAX_FILTER_DELETES`` at once."""

    model_config = ConfigDict(extra="forbid")
    filters: Annotated[Filters, Field(min_length=1)] = Field(description='e.g. {"brand": "Acme"}')


class BatchReceipt(BaseModel):
    """A batch (or a delete by filter) recorded in the index's change log in one transaction."""

    count: int = Field(description="Changes written (0: the filter matched nothing; nothing written).")
    first_seq: int | None = Field(description="The first change's sequence number (null when none).")
    last_seq: int | None = Field(description="The last change's sequence number (null when none).")
    visible: bool = Field(
        description="Whether every process serving the index showed every change when it answered."
    )


class WriteReceipt(BaseModel):
    """A write recorded in the index's change log (durable: it survives a crash of every process)."""

    id: str = Field(description="The product written.")
    kind: Literal["upsert", "patch", "delete"]
    seq: int = Field(description="The write's sequence number in the index's change log.")
    visible: bool = Field(
        description="Whether every process serving the index showed the write when it answered: true with "
        "wait (the default) unless that took longer than CCRK_LIVE_WAIT_S (a process not heard of for 5 s is "
        "not waited for). Without wait, false: each process shows it within CCRK_LIVE_POLL_S."
    )
