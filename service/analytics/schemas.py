"""Request and response models of the analytics routes (``service.api.routes.analytics``; they are the
OpenAPI schema), with their limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.schemas import UnicodeText

MAX_EVENTS = 100  # events per request: one transaction, all or nothing
EventKind = Literal["click", "add_to_cart", "purchase"]
QueryIdText = Annotated[str, StringConstraints(min_length=1, max_length=64)]
ProductIdText = Annotated[UnicodeText, StringConstraints(min_length=1, max_length=512)]


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: EventKind = Field(description="What the shopper did with the product.")
    query_id: QueryIdText = Field(description="The query_id of the search response the product came from.")
    product_id: ProductIdText = Field(description="The product's id, as the search returned it.")


class EventsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[Event] = Field(min_length=1, max_length=MAX_EVENTS)


class EventsResponse(BaseModel):
    accepted: int = Field(description="Events written (durably: they are on disk when this answers).")


class QueryCountOut(BaseModel):
    query: str
    count: int


class LanguageAnalytics(BaseModel):
    lang: str = Field(description="The queries' detected language ('und': unknown).")
    queries: int = Field(description="First pages of searches (a shopper paging on is counted once).")
    none: int = Field(
        description="Searches whose top label was 'none': nothing in the catalogue matches well."
    )
    none_rate: float
    clicked: int = Field(description="Searches with at least one click on their results.")
    ctr: float = Field(description="clicked / queries.")
    mrr: float = Field(description="Mean of 1 / the best clicked rank over the searches (0: no click).")
    ctr_gap: float = Field(
        description="How far below the best language's CTR (those with 20 searches or more)."
    )
    mrr_gap: float = Field(description="How far below the best language's MRR.")
    top_queries: list[QueryCountOut]
    top_none_queries: list[QueryCountOut] = Field(
        description="The most asked queries among those labelled 'none': the synonyms to write, the products "
        "to stock."
    )


class PhotoAnalytics(BaseModel):
    queries: int
    none: int = Field(description="Photo searches that found nothing (photos have no calibrated label).")
    none_rate: float
    clicked: int
    ctr: float
    mrr: float
    top_products: list[QueryCountOut] = Field(description="Products found first most often (query: the id).")


class NoneRatePointOut(BaseModel):
    start: float = Field(description="The bucket's start, seconds since the epoch.")
    lang: str
    queries: int
    none: int
    none_rate: float


class AnalyticsResponse(BaseModel):
    index: str
    since: float
    until: float
    languages: list[LanguageAnalytics] = Field(description="Most searched first.")
    photos: PhotoAnalytics
    none_rate_over_time: list[NoneRatePointOut]
    events: dict[str, int] = Field(description="Events in the window by kind.")
    log: dict[str, int] = Field(description="The query log: queries and events held, bytes on disk.")
    buffered: int = Field(description="Searches this process holds, not yet written.")
    dropped: int = Field(
        description="Searches this process left out since it started (buffer full, write failed)."
    )
    problem: str | None = Field(None, description="Why the last write failed (null: it did not).")
