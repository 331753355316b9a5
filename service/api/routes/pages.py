"""The search page and the local copies of the pages' assets (nothing comes from a CDN)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from service.api.deps import RuntimeDep
from service.errors import InvalidInputError
from service.schemas import MAX_FACETS, MAX_QUERY_CHARS, LangCode

router = APIRouter(include_in_schema=False)
WEB_DIR = Path(__file__).resolve().parents[2] / "web"
STATIC_DIR = WEB_DIR / "static"


@cache
def templates() -> Jinja2Templates:
    return Jinja2Templates(directory=WEB_DIR / "templates")


@cache
def plotly_js() -> Path:
    """plotly.js as bundled in the plotly PyPI package (the version the figures are built for)."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


@router.get("/", response_class=HTMLResponse)
async def search_page(
    request: Request,
    runtime: RuntimeDep,
    q: Annotated[str | None, Query(max_length=MAX_QUERY_CHARS, description="Query to run on load.")] = None,
    lang: Annotated[LangCode | None, Query(description="Language hint of q.")] = None,
    mode: Annotated[Literal["image", "text", "hybrid"] | None, Query(description="What q searches.")] = None,
    typos: Annotated[int | None, Query(ge=0, le=2, description="Typo tolerance of q (0: as typed).")] = None,
    synonyms: Annotated[bool, Query(description="Whether the index's synonyms expand q.")] = True,
) -> Response:
    """The search page; ``/?q=...&lang=...`` (what the page puts in the address bar after a search, with
    ``mode``, ``typos`` and ``synonyms`` where they are not the defaults) fills the form in and runs that
    search on load, so a search can be shared as a link: search analytics' top 'none' queries link to
    theirs as typed, and with typos corrected and synonyms."""
    if lang is not None and runtime.languages and lang not in runtime.languages:
        raise InvalidInputError(
            f"language {lang!r} is not one of the model's: {', '.join(runtime.languages)}",
            loc=("query", "lang"),
        )
    served = runtime.search.holder.served  # an attribute read: no lease, no I/O
    products = getattr(served.index, "products", None) if served is not None else None
    context = {
        "facet_fields": page_facet_fields(served, runtime.settings.page_facets),
        "has_text": bool(products is not None and products.info.texts),
        "languages": runtime.languages,
        "rerank_default": runtime.pipeline.default_rerank,
        "can_rerank": runtime.pipeline.can_rerank,
        "price_field": runtime.settings.page_price_field,
        "currency": runtime.settings.page_currency or "",
        "q": (q or "").strip(),
        "lang": lang or "",
        "mode": "" if mode == "hybrid" else (mode or ""),
        "typos": 0 if typos == 0 else None,  # the page offers as typed (0) or corrected (the default)
        "synonyms": synonyms,
    }
    return templates().TemplateResponse(request, "search.html", context)


def page_facet_fields(served: Any, chosen: list[str]) -> list[str]:
    """The fields the search page counts as facets: ``chosen`` (CCRK_PAGE_FACETS), else the served version's
    metadata fields that are not searched text (a title or a description counts nothing useful, and a long
    one is refused) nor a product's photo list."""
    if chosen:
        return chosen[:MAX_FACETS]
    if served is None:
        return []
    products = getattr(served.index, "products", None)
    searched = set(products.info.fields) if products is not None else set()
    return [
        name
        for name in sorted(served.index.fields)
        if name.split("@")[0] not in searched and name not in ("paths", "path", "id")
    ][:MAX_FACETS]


@router.get("/vendor/plotly.min.js")
async def plotly_asset() -> Response:
    return FileResponse(
        plotly_js(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
    )
