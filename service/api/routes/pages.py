"""The search page and the local copies of the pages' assets (nothing comes from a CDN)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from service.api.deps import RuntimeDep

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
async def search_page(request: Request, runtime: RuntimeDep) -> Response:
    return templates().TemplateResponse(
        request,
        "search.html",
        {"languages": runtime.languages, "rerank_default": runtime.settings.rerank},
    )


@router.get("/vendor/plotly.min.js")
async def plotly_asset() -> Response:
    return FileResponse(
        plotly_js(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
    )
