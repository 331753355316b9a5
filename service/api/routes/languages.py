"""Languages the model was trained for, with the recall the index build measured for each."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import RuntimeDep, SearcherDep
from service.schemas import LanguagesResponse, LanguageSupport

router = APIRouter(prefix="/v1/languages", tags=["languages"])


@router.get("", response_model=LanguagesResponse)
async def languages(runtime: RuntimeDep, searcher: SearcherDep) -> LanguagesResponse:
    served = runtime.holder.served
    recall = served.index.manifest.language_recall_at_10 if served is not None else {}
    return LanguagesResponse(
        model=searcher.model_name,
        languages=[LanguageSupport(code=c, recall_at_10=recall.get(c)) for c in runtime.languages],
    )
