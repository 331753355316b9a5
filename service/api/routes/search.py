"""Text and image search of the default index (``/v1/search``); ``service.api.routes.catalogues`` answers
the same for any served index (``/v1/indexes/{name}/search``) with these handlers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, Response, UploadFile

from service.api.deps import ExpensiveCallerDep, RuntimeDep, SearchCallerDep
from service.runtime import Caller, Runtime
from service.schemas import MAX_OFFSET, MAX_TOP_K, ImageSearchResponse, SearchRequest, SearchResponse
from service.search.facade import SearchFacade

router = APIRouter(prefix="/v1/search", tags=["search"])

JSON_BODY_LIMIT = 1024 * 1024
ERRORS = {
    401: {"description": "No API key where CCRK_SEARCH_REQUIRES_KEY, or an unknown or revoked one."},
    403: {"description": "The API key is not valid for this index."},
    422: {"description": "Invalid input; the error names the field."},
    429: {"description": "Rate limit, daily quota or expensive-work cap of the caller; see Retry-After."},
    503: {"description": "No index loaded (the message says why)."},
}
IMAGE_ERRORS = {
    **ERRORS,
    413: {"description": "Image too large."},
    415: {"description": "Not JPEG/PNG/WebP."},
}
UploadFileField = Annotated[
    UploadFile, File(description="A JPEG, PNG or WebP image (at most CCRK_MAX_UPLOAD_MB).")
]
TopK = Annotated[int, Form(ge=1, le=MAX_TOP_K)]
Offset = Annotated[int, Form(ge=0, le=MAX_OFFSET)]
FiltersField = Annotated[str | None, Form(description="Metadata filters as a JSON object (see /v1/search).")]
FacetsField = Annotated[
    str | None,
    Form(
        description="Facets as a JSON array (see /v1/search), counted over the first max(50, offset + "
        "top_k) similar products (photo similarity has no calibrated cut)."
    ),
]


async def text_search(
    facade: SearchFacade, runtime: Runtime, caller: Caller, body: SearchRequest, request: Request
) -> Response:
    # One dependency, the index leased in the worker thread (by the facade): a lease as a generator
    # dependency, with its exit stack, cost ~0.05-0.1 ms of the ~0.35 ms of event-loop CPU per query
    # (in-process, 100k items).
    rerank = body.rerank if body.rerank is not None else runtime.settings.rerank
    async with runtime.in_line(caller):
        if rerank and runtime.expensive_slots.per_caller:
            async with runtime.expensive(caller):
                answer = await facade.text(body)
        else:
            answer = await facade.text(body)
    request.state.lang = answer.lang  # the request metrics' language label (service.middleware)
    response = answer.response
    recorder = runtime.recorder(facade.holder.name)
    if recorder is not None:  # logged off the request's path: a buffered row (service.analytics)
        response = response.model_copy(update={"query_id": recorder.text(body, response, key_id_of(caller))})
    # Serialised here: the model was built by our own code, re-validating it would only cost time.
    return Response(response.model_dump_json(), media_type="application/json")


def key_id_of(caller: Caller) -> str | None:
    """What the query log keeps of the caller: the API key's id, 'admin', or nothing (never the key, never
    the address)."""
    if caller.record is not None:
        return caller.record.id
    return "admin" if caller.admin else None


async def image_search(
    facade: SearchFacade,
    runtime: Runtime,
    caller: Caller,
    file: UploadFile,
    top_k: int,
    offset: int,
    filters: str | None,
    facets: str | None = None,
) -> Response:
    # No search slot here: an upload waits for its memory budget and an image slot (CCRK_IMAGE_*), which
    # bound image searches on their own, and holding a slot through those waits would idle it.
    recorder = runtime.recorder(facade.holder.name)
    logged = None
    if recorder is not None:
        key_id = key_id_of(caller)

        def logged(data: bytes, response: ImageSearchResponse) -> ImageSearchResponse:
            return response.model_copy(update={"query_id": recorder.photo(data, response, offset, key_id)})

    result = await facade.image(
        file, top_k=top_k, offset=offset, filters=filters, facets=facets, logged=logged
    )
    return Response(result.model_dump_json(), media_type="application/json")


@router.post("", response_model=SearchResponse, responses=ERRORS, max_body_size=JSON_BODY_LIMIT)
async def search(
    body: SearchRequest, runtime: RuntimeDep, caller: SearchCallerDep, request: Request
) -> Response:
    """Text search in any language: dual-encoder ANN, optional fusion re-ranking, metadata filters."""
    return await text_search(runtime.search, runtime, caller, body, request)


@router.post("/image", response_model=ImageSearchResponse, responses=IMAGE_ERRORS)
async def search_image(
    file: UploadFileField,
    runtime: RuntimeDep,
    caller: ExpensiveCallerDep,
    top_k: TopK = 20,
    offset: Offset = 0,
    filters: FiltersField = None,
    facets: FacetsField = None,
) -> Response:
    """Catalogue images similar to an uploaded one."""
    return await image_search(runtime.search, runtime, caller, file, top_k, offset, filters, facets)
