"""Request and response models of the product write routes (``service.api.routes.products``; they are the
OpenAPI schema), with their limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from service.schemas import FieldName

MAX_PATCH_FIELDS = 64


class ProductPatch(BaseModel):
    """Fields of one product to change: each named field takes its new value; ``null`` removes it (JSON
    merge patch, RFC 7396, at the top level). A value must be of the kind the catalogue's products hold
    in that field (a number where prices are numbers). Text fields and photos are not changed here."""

    model_config = ConfigDict(extra="forbid")
    fields: Annotated[dict[FieldName, JsonValue], Field(min_length=1, max_length=MAX_PATCH_FIELDS)] = Field(
        description='The fields to change, e.g. {"price": 7.5, "in_stock": false}.'
    )


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
