"""Search analytics (``service.analytics``): the shoppers' events on search results
(``POST /v1/events``, ``/v1/indexes/{name}/events``: a key of scope events) and the report of an index's
query log (``GET /v1/analytics``, ``/v1/indexes/{name}/analytics``: admin)."""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Query

from service.analytics import QueryRecorder
from service.analytics.schemas import AnalyticsResponse, EventsRequest, EventsResponse
from service.api.deps import AdminDep, EventsCallerDep, IndexName, RuntimeDep
from service.api.routes.search import key_id_of
from service.errors import InvalidInputError, NotFoundError, ScopeError, WriteUnavailableError
from service.keys import KeyRecord
from service.runtime import Caller, Runtime
from store.analytics import AnalyticsError, ExpiredQueryIdError, UnknownQueryIdError, analytics_report

router = APIRouter(tags=["analytics"])

EVENT_BODY_LIMIT = 64 * 1024
EVENT_ERRORS = {
    401: {"description": "No API key, or an unknown or revoked one."},
    403: {"description": "The key's scope is not events (or admin), or it is not valid for this index."},
    404: {"description": "The index is not served here, or analytics are off (CCRK_ANALYTICS)."},
    422: {"description": "Invalid input, an unknown or expired query_id; the error names the field."},
    429: {"description": "Rate limit or daily quota of the key; see Retry-After."},
    503: {"description": "The query log cannot be written now (nothing was written): send them again."},
}
REPORT_ERRORS = {
    401: {"description": "Missing or wrong admin key."},
    403: {"description": "An admin key restricted to other indexes."},
    404: {"description": "The index is not served here, or analytics are off (CCRK_ANALYTICS)."},
    422: {"description": "Invalid input; the error names the field."},
    503: {"description": "The query log cannot be read now."},
}
Since = Annotated[
    float | None,
    Query(
        ge=0,
        le=1e10,
        allow_inf_nan=False,
        description="From this time (seconds since the epoch); default: a day ago.",
    ),
]
Until = Annotated[
    float | None,
    Query(ge=0, le=1e10, allow_inf_nan=False, description="Up to this time (exclusive); default: now."),
]
Top = Annotated[int, Query(ge=1, le=100, description="Top queries per language.")]
Bucket = Annotated[
    float, Query(ge=60, le=30 * 86400, description="Seconds per point of the none rate over time.")
]


def _recorder(runtime: Runtime, name: str) -> QueryRecorder:
    runtime.catalogue_holder(name)  # 404 for an index not served here
    recorder = runtime.recorder(name)
    if recorder is None:
        why = (
            "analytics are off (CCRK_ANALYTICS=false)"
            if not runtime.settings.analytics
            else ("the query log cannot be opened now (see the server's log)")
        )
        raise NotFoundError(f"no query log for index {name!r}: {why}", loc=("path", "name"))
    return recorder


async def _events(runtime: Runtime, name: str, body: EventsRequest, caller: Caller) -> EventsResponse:
    recorder = _recorder(runtime, name)
    checked = []
    for i, event in enumerate(body.events):
        try:
            recorder.check(event.query_id)
        except (UnknownQueryIdError, ExpiredQueryIdError) as exc:
            raise InvalidInputError(str(exc), loc=("body", "events", i, "query_id")) from None
        checked.append((event.kind, event.query_id, event.product_id))
    try:
        accepted = await anyio.to_thread.run_sync(recorder.events, checked, key_id_of(caller))
    except AnalyticsError as exc:
        raise WriteUnavailableError(f"the events were not written: {exc}") from None
    return EventsResponse(accepted=accepted)


@router.post(
    "/v1/events", response_model=EventsResponse, responses=EVENT_ERRORS, max_body_size=EVENT_BODY_LIMIT
)
async def post_events(body: EventsRequest, runtime: RuntimeDep, caller: EventsCallerDep) -> EventsResponse:
    """Shoppers' clicks, adds to cart and purchases on the default index's results, each naming the
    query_id of its search and the product: all written, durably, or none (at most 100 a request)."""
    return await _events(runtime, runtime.settings.index_name, body, caller)


@router.post(
    "/v1/indexes/{name}/events",
    response_model=EventsResponse,
    responses=EVENT_ERRORS,
    max_body_size=EVENT_BODY_LIMIT,
)
async def post_index_events(
    name: IndexName, body: EventsRequest, runtime: RuntimeDep, caller: EventsCallerDep
) -> EventsResponse:
    """Events on one served index's results (as ``/v1/events``)."""
    return await _events(runtime, name, body, caller)


async def _report(
    runtime: Runtime,
    admin: KeyRecord | None,
    name: str,
    loc: tuple[str, str],
    window: tuple[float | None, float | None, int, float],
) -> AnalyticsResponse:
    """Index ``name``'s report for the admin (403 naming ``loc`` for a key of other indexes); ``window``:
    since, until, top, bucket_s."""
    if admin is not None and not admin.allows_index(name):
        raise ScopeError(f"this API key may not administer index {name!r}", loc=loc)
    since, until, top, bucket_s = window
    recorder = _recorder(runtime, name)
    end = time.time() if until is None else until
    start = end - 86400.0 if since is None else since
    if start >= end:
        raise InvalidInputError("since must be before until", loc=("query", "since"))
    try:
        report = await anyio.to_thread.run_sync(
            lambda: analytics_report(recorder.log, since=start, until=end, top=top, bucket_s=bucket_s)
        )
    except AnalyticsError as exc:
        raise WriteUnavailableError(f"the query log cannot be read now: {exc}") from None
    return AnalyticsResponse(
        index=name,
        **dataclasses.asdict(report),
        buffered=recorder.buffered(),
        dropped=recorder.dropped,
        problem=recorder.problem,
    )


@router.get("/v1/analytics", response_model=AnalyticsResponse, responses=REPORT_ERRORS)
async def get_analytics(
    admin: AdminDep,
    runtime: RuntimeDep,
    since: Since = None,
    until: Until = None,
    top: Top = 10,
    bucket_s: Bucket = 3600.0,
) -> AnalyticsResponse:
    """The default index's search analytics: per language the searches, their 'none' rate, the top
    queries and top 'none' queries, CTR and MRR of the clicks and their gap to the best language; photo
    searches; the 'none' rate over time."""
    return await _report(
        runtime, admin, runtime.settings.index_name, ("header", "x-api-key"), (since, until, top, bucket_s)
    )


@router.get("/v1/indexes/{name}/analytics", response_model=AnalyticsResponse, responses=REPORT_ERRORS)
async def get_index_analytics(
    name: IndexName,
    admin: AdminDep,
    runtime: RuntimeDep,
    since: Since = None,
    until: Until = None,
    top: Top = 10,
    bucket_s: Bucket = 3600.0,
) -> AnalyticsResponse:
    """One served index's search analytics (as ``/v1/analytics``)."""
    return await _report(runtime, admin, name, ("path", "name"), (since, until, top, bucket_s))
