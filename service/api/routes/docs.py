"""The API docs (Swagger UI, ReDoc) with their JavaScript and CSS served by the service itself: FastAPI's
default pages load them from a CDN, which an offline or locked-down deployment cannot reach. The assets come
from the ``fastapi-offline`` package (MIT; Swagger UI Apache-2.0, ReDoc MIT)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from service.errors import NotFoundError

router = APIRouter(include_in_schema=False)
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js")


@cache
def asset_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} - API",
        swagger_js_url="/docs-assets/swagger-ui-bundle.js",
        swagger_css_url="/docs-assets/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} - API",
        redoc_js_url="/docs-assets/redoc.standalone.js",
        redoc_favicon_url="/static/favicon.svg",
        with_google_fonts=False,
    )


@router.get("/docs-assets/{name}")
async def docs_asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise NotFoundError(f"no docs asset {name!r}", loc=("path", "name"))
    return FileResponse(asset_dir() / name, headers={"Cache-Control": "public, max-age=86400"})
