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


BatchLine = Annotated[PatchLine | DeleteLine, Discriminator("op")]


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
    visible: bool = Field(description="Whether this process's searches showed every change when it answered.")


class WriteReceipt(BaseModel):
    """A write recorded in the index's change log (durable: it survives a crash of every process)."""

    id: str = Field(description="The product written.")
    kind: Literal["patch", "delete"]
    seq: int = Field(description="The write's sequence number in the index's change log.")
    visible: bool = Field(
        description="Whether this process's searches showed the write when it answered: true with wait "
        "(the default) unless it took longer than CCRK_LIVE_WAIT_S. Every process serving the index shows "
        "it within CCRK_LIVE_POLL_S of that."
    )
