"""``ccrk serve``: the search service on uvicorn."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ccrk_settings import Settings

# prometheus_client's own switch to multiprocess mode, read when a worker process imports it.
PROMETHEUS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# An operator-chosen admin key shorter than this is warned about (32 random characters are ~190 bits).
ADMIN_KEY_MIN_CHARS = 32


def startup_warnings(settings: Settings) -> list[str]:
    """What ``ccrk serve`` warns about before it starts (it starts anyway)."""
    warnings = []
    key = settings.admin_api_key
    if key and len(key) < ADMIN_KEY_MIN_CHARS:
        warnings.append(
            f"CCRK_ADMIN_API_KEY is {len(key)} characters long, under {ADMIN_KEY_MIN_CHARS}: a short key can"
            " be guessed (wrong keys are throttled per address, not per key); use e.g."
            " `openssl rand -base64 32`"
        )
    return warnings


def serve_command(
    host: Annotated[str | None, typer.Option(help="Bind address [CCRK_HOST].")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port [CCRK_PORT].")] = None,
    index_root: Annotated[Path | None, typer.Option(help="Root folder of indexes [CCRK_INDEX_ROOT].")] = None,
    index_name: Annotated[
        str | None,
        typer.Option(
            help="Index to serve [CCRK_INDEX_NAME]; a,b,c: several, a the default one, b and c at"
            " /v1/indexes/NAME/... [CCRK_EXTRA_INDEXES]."
        ),
    ] = None,
    all_indexes: Annotated[
        bool, typer.Option("--all", help="Also serve every other index under the index root.")
    ] = False,
    model: Annotated[Path | None, typer.Option(help="Model directory [CCRK_MODEL_DIR].")] = None,
    backend: Annotated[str | None, typer.Option(help="onnx or torch [CCRK_BACKEND].")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis for caches [CCRK_REDIS_URL].")] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, max=64, help="Server processes sharing the port [CCRK_WORKERS].")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request (costs throughput).")] = False,
    engine: Annotated[
        str | None,
        typer.Option(help="local (uvicorn) or ray (Ray Serve, a deployment per shard) [CCRK_SERVE_ENGINE]."),
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="With --engine ray: the Ray head [CCRK_RAY_ADDRESS].")
    ] = None,
    shard_replicas: Annotated[
        int | None,
        typer.Option(min=1, help="With --engine ray: replicas per shard [CCRK_RAY_SHARD_REPLICAS]."),
    ] = None,
    shard_cpus: Annotated[
        float | None,
        typer.Option(min=0.01, help="With --engine ray: CPUs per shard replica [CCRK_RAY_SHARD_CPUS]."),
    ] = None,
    max_replicas_per_node: Annotated[
        int | None,
        typer.Option(
            min=1, help="With --engine ray: a shard's replicas per node [CCRK_RAY_MAX_REPLICAS_PER_NODE]."
        ),
    ] = None,
    ingress_replicas: Annotated[
        int | None,
        typer.Option(min=1, help="With --engine ray: ingress replicas [CCRK_RAY_INGRESS_REPLICAS]."),
    ] = None,
) -> None:
    """Serve the search API (OpenAPI at /docs). Options override the CCRK_* settings."""
    # Imported here so that other `ccrk` commands never load the web stack.
    import uvicorn

    from ccrk_settings import SettingsError, settings_with
    from service.app import create_app
    from service.http_guard import uvicorn_options

    # `--index-name a,b,c`: a is the default index, b and c extra ones; `--all`: every index.
    extra: list[str] = []
    if index_name is not None and "," in index_name:
        index_name, *extra = [part.strip() for part in index_name.split(",") if part.strip()] or [""]
    if all_indexes:
        extra.append("*")
    # Only the options given: they are also what travels to the worker processes (_serve_workers).
    overrides = {
        key: value
        for key, value in {
            "host": host,
            "port": port,
            "index_root": index_root,
            "index_name": index_name,
            "extra_indexes": ",".join(extra) if extra else None,
            "model_dir": model,
            "backend": backend,
            "redis_url": redis_url,
            "workers": workers,
            "serve_engine": engine,
            "ray_address": address,
            "ray_shard_replicas": shard_replicas,
            "ray_shard_cpus": shard_cpus,
            "ray_max_replicas_per_node": max_replicas_per_node,
            "ray_ingress_replicas": ingress_replicas,
        }.items()
        if value is not None
    }
    try:
        settings = settings_with(overrides)
    except SettingsError as exc:
        raise typer.BadParameter(exc.describe({"model_dir": "--model"})) from None
    for warning in startup_warnings(settings):
        typer.echo(f"Warning: {warning}", err=True)
    if not settings.model_dir.is_dir():
        raise typer.BadParameter(f"model directory {settings.model_dir} does not exist")
    from model.model_check import ModelDirError, check_model_dir

    try:  # the whole model directory, before a port is bound or a worker started
        check_model_dir(settings.model_dir, backend=settings.backend, int8=settings.int8)
    except ModelDirError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None
    if settings.serve_engine == "ray":
        from service.cluster.serving import serve_on_ray
        from store.errors import IndexNotFoundError

        logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO))
        try:
            serve_on_ray(settings)
        except IndexNotFoundError as exc:
            raise typer.BadParameter(str(exc)) from None
        return
    if settings.workers == 1:
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            access_log=access_log,
            **uvicorn_options(settings),
        )
        return
    _serve_workers(settings, overrides, log_level=log_level, access_log=access_log)


def _serve_workers(
    settings: Settings, overrides: dict[str, Any], *, log_level: str, access_log: bool
) -> None:
    """N processes on one port (``service.workers``). Each builds the app from the environment, so the
    command-line overrides travel as ``CCRK_*`` variables; a fresh folder per run holds the processes'
    metrics files and the probe leader lock."""
    from service.metrics import process_exited
    from service.workers import PortInUseError, WorkerGroup

    level = getattr(logging, log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s:     [ccrk serve] %(message)s")
    with tempfile.TemporaryDirectory(prefix="ccrk-workers-") as group:
        os.environ.update({f"CCRK_{key.upper()}": str(value) for key, value in overrides.items()})
        os.environ["CCRK_WORKER_DIR"] = group
        os.environ[PROMETHEUS_DIR_ENV] = group
        workers = WorkerGroup(
            settings.workers,
            settings.host,
            settings.port,
            log_level=log_level,
            access_log=access_log,
            # A killed process cannot drop its live gauges (e.g. the version it served) itself.
            on_exit=lambda pid: process_exited(Path(group), pid),
        )
        try:
            code = workers.run()
        except PortInUseError as exc:
            typer.echo(f"Error: {exc.strerror}", err=True)
            code = 1
    if code:
        raise typer.Exit(code)
