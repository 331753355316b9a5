"""Text and image search."""

from __future__ import annotations

import json
from typing import Annotated

import anyio
from fastapi import APIRouter, File, Form, Request, Response, UploadFile
from pydantic import TypeAdapter, ValidationError

from service.api.deps import RuntimeDep, SearcherDep, ServedDep
from service.errors import BusyError, InvalidInputError
from service.schemas import MAX_OFFSET, MAX_TOP_K, Filters, ImageSearchResponse, SearchRequest, SearchResponse

router = APIRouter(prefix="/v1/search", tags=["search"])

JSON_BODY_LIMIT = 1024 * 1024
ERRORS = {
    422: {"description": "Invalid input; the error names the field."},
    503: {"description": "No index loaded (the message says why)."},
}
_filters = TypeAdapter(Filters)
IMAGE_SLOT_WAIT_S = 10.0  # how long an image search waits for a decoding slot before a 503


@router.post("", response_model=SearchResponse, responses=ERRORS, max_body_size=JSON_BODY_LIMIT)
async def search(body: SearchRequest, runtime: RuntimeDep, request: Request) -> Response:
    """Text search in any language: dual-encoder ANN, optional fusion re-ranking, metadata filters."""
    # One dependency, the index leased in the worker thread: solving the served (a generator, with its
    # exit stack) and searcher dependencies cost ~0.05-0.1 ms of the ~0.35 ms of event-loop CPU per query
    # (in-process, 100k items).
    result = await anyio.to_thread.run_sync(runtime.search, body, limiter=runtime.limiter)
    request.state.lang = runtime.lang_label(result.language.code)
    runtime.monitor.observe_search(request.state.lang, body, result)  # live traffic per language
    if body.offset == 0:  # one count per query, not per page
        runtime.metrics.search_match.labels(request.state.lang, result.match or "unknown").inc()
    # Serialised here: the model was built by our own code, re-validating it would only cost time.
    return Response(result.model_dump_json(), media_type="application/json")


@router.post(
    "/image",
    response_model=ImageSearchResponse,
    responses={
        **ERRORS,
        413: {"description": "Image too large."},
        415: {"description": "Not JPEG/PNG/WebP."},
    },
)
async def search_image(
    file: Annotated[UploadFile, File(description="A JPEG, PNG or WebP image (at most CCRK_MAX_UPLOAD_MB).")],
    served: ServedDep,
    searcher: SearcherDep,
    runtime: RuntimeDep,
    top_k: Annotated[int, Form(ge=1, le=MAX_TOP_K)] = 20,
    offset: Annotated[int, Form(ge=0, le=MAX_OFFSET)] = 0,
    filters: Annotated[
        str | None, Form(description="Metadata filters as a JSON object (see /v1/search).")
    ] = None,
) -> Response:
    """Catalogue images similar to an uploaded one."""
    parsed = None
    if filters:
        try:
            parsed = _filters.validate_python(json.loads(filters))
        except (ValueError, ValidationError) as exc:
            raise InvalidInputError(
                f"filters must be a JSON object of filters: {exc}", loc=("body", "filters")
            ) from None
    data = await file.read(searcher.max_upload_bytes + 1)
    try:
        with anyio.fail_after(IMAGE_SLOT_WAIT_S):
            await runtime.image_slots.acquire()
    except TimeoutError:
        raise BusyError(
            f"too many image searches at once; retry in a moment (waited {IMAGE_SLOT_WAIT_S:.0f} s)",
            loc=("body", "file"),
        ) from None
    try:
        result = await anyio.to_thread.run_sync(
            searcher.search_image,
            served,
            data,
            file.content_type,
            top_k,
            offset,
            parsed,
            limiter=runtime.limiter,
        )
    finally:
        runtime.image_slots.release()
    return Response(result.model_dump_json(), media_type="application/json")
