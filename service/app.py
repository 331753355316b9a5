"""The app factory: ``create_app(settings)``. Nothing loads at import; the lifespan loads the model and
the index (``service.runtime``)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp

from ccrk_settings import Settings, get_settings
from service.api import fast_search
from service.api.routes import (
    admin,
    analytics,
    catalogues,
    consistency,
    dashboard,
    docs,
    health,
    images,
    index,
    items,
    languages,
    model,
    pages,
    products,
    rules,
    search,
    synonyms,
)
from service.api.routes import metrics as metrics_route
from service.errors import install_error_handlers
from service.metrics import Metrics
from service.middleware import LastResortMiddleware, MetricsMiddleware
from service.runtime import Runtime
from service.security import Redactor, SecurityHeadersMiddleware
from service.upload_budget import UploadBodyMiddleware

# Multipart framing around the largest accepted image.
UPLOAD_OVERHEAD = 64 * 1024


class ImageSearchPaths:
    """The image search routes of every index the runtime serves, read at each request: an index that joins
    later (``*``, ``Runtime._discover``) has its uploads bounded as the others' are."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def __contains__(self, path: object) -> bool:
        if path == "/v1/search/image":
            return True
        head, tail = "/v1/indexes/", "/search/image"
        if not isinstance(path, str) or not path.startswith(head) or not path.endswith(tail):
            return False
        return path[len(head) : -len(tail)] in self.runtime.index_names


class ServiceApp(FastAPI):
    """FastAPI with two layers outside Starlette's own error handler (``ServerErrorMiddleware``, whose 500s
    no user middleware sees): the security headers, so a 500 carries them too, and the last-resort handler
    (``service.middleware.LastResortMiddleware``), so the connection stays usable after one."""

    def build_middleware_stack(self) -> ASGIApp:
        return LastResortMiddleware(SecurityHeadersMiddleware(super().build_middleware_stack()))


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    metrics = Metrics(settings.worker_dir)
    runtime = Runtime(settings, metrics)
    app = ServiceApp(
        # The API docs are served from local copies of their assets (service.api.routes.docs).
        docs_url=None,
        redoc_url=None,
        title="ccrk-search",
        summary="Multilingual image search (CCRk): text and image queries, re-ranking, consistency.",
        version="0.1.0",
        lifespan=runtime.lifespan,
        # The service's telemetry is its Prometheus metrics (MetricsMiddleware); FastAPI's native
        # OpenTelemetry would time every request a second time.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.runtime = runtime
    app.state.redact = Redactor([(settings.index_root, "<index root>"), (settings.model_dir, "<model dir>")])
    max_body_size = settings.max_upload_mb * 1024 * 1024 + UPLOAD_OVERHEAD
    install_error_handlers(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "X-API-Key", "Authorization"],
            expose_headers=["Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
        )
    app.add_middleware(
        UploadBodyMiddleware,
        paths=ImageSearchPaths(runtime),
        max_body=max_body_size,
        budget=runtime.upload_budget,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    for module in (
        search,
        catalogues,
        analytics,
        consistency,
        images,
        index,
        items,
        products,
        model,
        languages,
        health,
        metrics_route,
        admin,
        synonyms,
        rules,
        dashboard,
        pages,
        docs,
    ):
        # The body limit is set per route, not on the app too: an app-wide limit wraps every request in a
        # second limiter (app middleware and route) for the same check.
        app.include_router(module.router, max_body_size=max_body_size)
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")  # the pages' own assets
    fast_search.install(app)  # POST /v1/search without FastAPI's request machinery (same answers)
    return app
