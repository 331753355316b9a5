"""Languages the model was trained for, with the recall the index build measured for each."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import PipelineDep, RuntimeDep
from service.schemas import LanguagesResponse, LanguageSupport

router = APIRouter(prefix="/v1/languages", tags=["languages"])


@router.get("", response_model=LanguagesResponse)
async def languages(runtime: RuntimeDep, pipeline: PipelineDep) -> LanguagesResponse:
    served = runtime.holder.served
    recall = served.index.manifest.language_recall_at_10 if served is not None else {}
    return LanguagesResponse(
        model=pipeline.model_name,
        languages=[LanguageSupport(code=c, recall_at_10=recall.get(c)) for c in runtime.languages],
    )
