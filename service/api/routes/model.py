"""The served model: its name, fingerprint, languages and what it can do (re-ranking or not)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import PipelineDep, RuntimeDep
from service.schemas import ModelInfo

router = APIRouter(prefix="/v1/model", tags=["model"])


@router.get("", response_model=ModelInfo)
async def model_info(runtime: RuntimeDep, pipeline: PipelineDep) -> ModelInfo:
    encoder = pipeline.encoder
    return ModelInfo(
        name=pipeline.model_name,
        fingerprint=pipeline.model_fingerprint,
        architecture=encoder.config.architecture,
        embed_dim=encoder.config.embed_dim,
        languages=list(runtime.languages),
        rerank=pipeline.can_rerank,
        rerank_default=pipeline.default_rerank,
        backend=encoder.backend,
        device=encoder.device,
    )
