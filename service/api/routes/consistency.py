"""Cross-language consistency of one intent asked in several languages."""

from __future__ import annotations

import anyio
from fastapi import APIRouter

from monitoring.consistency import consistency_report
from service.api.deps import RuntimeDep, SearcherDep, ServedDep
from service.index_holder import Served
from service.schemas import ConsistencyRequest, ConsistencyResponse, LanguageResults
from service.searching import Searcher, normalise_query

router = APIRouter(prefix="/v1/consistency", tags=["consistency"])


def _report(searcher: Searcher, served: Served, body: ConsistencyRequest) -> ConsistencyResponse:
    rerank = searcher.resolve_rerank(body.rerank)
    per_language = []
    for lang, text in body.queries.items():
        query = normalise_query(text)
        ids = searcher.ranked_ids(served, query, body.top_k, rerank, body.filters)
        per_language.append(
            LanguageResults(lang=lang, query=query, ids=ids, language=searcher.language_of(query, lang))
        )
    report = consistency_report({r.lang: r.ids for r in per_language}, body.top_k)
    return ConsistencyResponse(
        top_k=body.top_k,
        index_version=served.version,
        model=searcher.model_name,
        languages=per_language,
        **report,
    )


@router.post(
    "",
    response_model=ConsistencyResponse,
    max_body_size=1024 * 1024,
    responses={
        422: {"description": "Invalid input; the error names the field."},
        503: {"description": "No index loaded."},
    },
)
async def consistency(
    body: ConsistencyRequest, served: ServedDep, searcher: SearcherDep, runtime: RuntimeDep
) -> ConsistencyResponse:
    """Per-language result lists, per-item ranks and variance, MRV / mrv_std over the union, mean pairwise
    overlap@k and Kendall tau per language pair (an item missing from a list counts as rank top_k)."""
    return await anyio.to_thread.run_sync(_report, searcher, served, body, limiter=runtime.limiter)
