"""Cross-language consistency of one intent asked in several languages."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import RuntimeDep, SearchCallerDep
from service.schemas import ConsistencyRequest, ConsistencyResponse

router = APIRouter(prefix="/v1/consistency", tags=["consistency"])


@router.post(
    "",
    response_model=ConsistencyResponse,
    max_body_size=1024 * 1024,
    responses={
        401: {"description": "No API key where CCRK_SEARCH_REQUIRES_KEY, or an unknown or revoked one."},
        403: {"description": "The API key is not valid for this index."},
        422: {"description": "Invalid input; the error names the field."},
        429: {"description": "Rate limit or daily quota of the caller; see Retry-After."},
        503: {"description": "No index loaded."},
    },
)
async def consistency(
    body: ConsistencyRequest, runtime: RuntimeDep, _: SearchCallerDep
) -> ConsistencyResponse:
    """Per-language result lists, per-item ranks and variance, MRV / mrv_std over the union, mean pairwise
    overlap@k and Kendall tau per language pair (an item missing from a list counts as rank top_k)."""
    return await runtime.search.consistency(body)
