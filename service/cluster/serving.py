"""Running the Serve application: ``ccrk serve --engine ray [--address HEAD:PORT]``, and the application
builder ``serve deploy`` / ``serve run`` import (``service.cluster.serving:app``, deploy/ray/serve.yaml)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ccrk_settings import Settings, SettingsError, settings_with
from service.cluster.deployments import ClusterOptions, build_application
from service.runtime import served_index_names
from store.errors import IndexFormatError, IndexNotFoundError
from store.layout import MANIFEST_FILE, index_dir
from store.version.manifest import IndexManifest
from store.version.sharding import Sharding
from store.version.versions import current_version

log = logging.getLogger(__name__)

APP_NAME = "ccrk"

# What Ray Serve reads at process start on every node (so: the environment of `ray start`, or of the process
# that starts a local Ray): HAProxy in place of the Python HTTP proxy, gRPC in place of Ray actor calls
# between deployments. bench/cluster_scaling.py measures both against the defaults.
FAST_PATH_ENV: dict[str, str] = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    # HAProxy's default (20,000 connections) needs more file descriptors than common limits allow.
    "RAY_SERVE_HAPROXY_MAXCONN": "4000",
}


def _shards_of(root: Path, name: str) -> int:
    version = current_version(root, name)
    if version is None:
        raise IndexNotFoundError(f"index {name!r} has no published version under {root}")
    manifest = IndexManifest.load(index_dir(root, name) / version / MANIFEST_FILE)
    return Sharding.from_dict(manifest.sharding).shard_count if manifest.is_sharded else 0


def shard_count_of(settings: Settings) -> int:
    """Shards of the version CURRENT names: one deployment each (0 for an unsharded version, which the
    ingress reads itself). The ingress refuses a later version with another shard count until the app is
    deployed again (``redeploy_if_resharded``)."""
    return _shards_of(settings.index_root, settings.index_name)


def shard_counts_of(settings: Settings, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """``shard_count_of`` of every served index (``extra_indexes`` too), the default one first: each has
    deployments of its own. An extra index whose version cannot be read (none published yet, a publish in
    progress) counts as in ``known`` (the counts deployed), else 0: its routes answer 503 as `ccrk serve`'s
    do, and once it has a sharded version the app is deployed again for it."""
    counts = {settings.index_name: shard_count_of(settings)}
    for name in served_index_names(settings)[1:]:
        try:
            counts[name] = _shards_of(settings.index_root, name)
        except (OSError, IndexFormatError) as exc:
            log.warning("extra index %s: %s", name, exc)
            counts[name] = (known or {}).get(name, 0)
    return counts


def app(args: Mapping[str, Any]) -> Any:
    """The application builder of ``serve deploy`` / ``serve run service.cluster.serving:app``: the settings
    of the replica's environment (``CCRK_*``, from the config's ``runtime_env``) with ``args`` (setting
    names, e.g. ``index_root``, ``ray_shard_replicas``) applied and validated as a command line's are."""
    try:
        settings = settings_with(dict(args))
    except SettingsError as exc:  # named as the config file names them: args.<setting>
        raise SettingsError(list(exc.problems), options={field: f"args.{field}" for field in args}) from None
    return build_application(settings, shard_counts_of(settings))


def redeploy_if_resharded(
    settings: Settings, deployed: Mapping[str, int], options: ClusterOptions
) -> dict[str, int]:
    """Deploy the app again when the CURRENT of a served index names a version with another shard count
    than ``deployed`` has for it (the ingress refuses to open it over the deployments it has): Serve starts
    the new shard deployments and new ingress replicas, which open the new version, before it stops the old
    ones. Returns the counts now deployed. ``serve deploy`` users deploy the config again instead."""
    from ray import serve

    try:
        counts = shard_counts_of(settings, known=deployed)
    except (OSError, IndexFormatError) as exc:  # a publish in progress, a vanished index: keep serving
        log.warning("cannot read the current version of %s: %s", settings.index_name, exc)
        return dict(deployed)
    # An index that appeared under the root since (`*`) and is sharded triggers too: an ingress replica
    # started later (a restart) lists the root itself and would serve it over no shard deployments (503).
    # An unsharded one needs no deployment: the running ingress replicas' pollers pick it up themselves
    # (``Runtime._discover``), with no rolling restart of every shard replica.
    if all(counts.get(name, 0) == deployed.get(name, 0) for name in {*counts, *deployed}):
        return dict(deployed)
    log.info(
        "CURRENT names other shard counts (%s) than the app's (%s): deploying it again", counts, deployed
    )
    try:
        serve.run(build_application(settings, counts, options), name=APP_NAME, route_prefix="/")
    except Exception:  # a failed rollout: Serve keeps the old replicas serving; try again at the next poll
        log.exception("deploying the app for %s shard(s) failed; trying again at the next poll", counts)
        return dict(deployed)
    return counts


def _wanted_cpus(options: ClusterOptions, shard_count: int) -> float:
    return (
        options.ingress_replicas * options.ingress_cpus
        + shard_count * options.shard_replicas * options.shard_cpus
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (Kubernetes, systemd) tears down as Ctrl-C does


def serve_on_ray(settings: Settings, options: ClusterOptions | None = None) -> None:
    """Connect to the cluster (``ray_address``; unset: RAY_ADDRESS, a `ray start` cluster on this machine, or
    a local Ray started here, which gets ``FAST_PATH_ENV`` when ``ray_serve_fast_path``), start Serve's HTTP
    proxy on ``host:port``, deploy the app and block until interrupted (Ctrl-C or SIGTERM); the app is
    deleted on the way out, and a Ray started here is stopped."""
    import ray
    from ray import serve

    counts = shard_counts_of(settings)  # before starting anything: a missing index fails fast
    count = sum(counts.values())
    options = options or ClusterOptions.from_settings(settings)
    if settings.ray_serve_fast_path:
        for key, value in FAST_PATH_ENV.items():
            os.environ.setdefault(key, value)  # inherited by a Ray that ray.init starts here
    ray.init(address=settings.ray_address, log_to_driver=False)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # after ray.init, which installs its own (sys.exit)
    try:
        wanted, available = _wanted_cpus(options, count), ray.cluster_resources().get("CPU", 0.0)
        if wanted > available:  # an autoscaling cluster may add nodes; a fixed one waits forever
            log.warning(
                "the app asks for %.2f CPUs (%d shard(s) x %d replica(s) x %.2f + %d ingress x %.2f), the"
                " cluster has %.2f: replicas stay pending until nodes join (lower --shard-cpus or"
                " CCRK_RAY_INGRESS_CPUS on a small cluster)",
                wanted, count, options.shard_replicas, options.shard_cpus, options.ingress_replicas,
                options.ingress_cpus, available,
            )  # fmt: skip
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(build_application(settings, counts, options), name=APP_NAME, route_prefix="/")
        log.info("serving %s on http://%s:%d (Ray Serve)", ", ".join(counts), settings.host, settings.port)
        while True:
            time.sleep(max(settings.index_poll_s, 1.0))
            try:
                counts = redeploy_if_resharded(settings, counts, options)
            except Exception:  # a supervisor serves on: one failed check must not end it (and delete the app)
                log.exception("checking the served indexes for a new shard count failed; serving on")
    except KeyboardInterrupt:
        log.info("interrupted: deleting the Serve application")
    finally:
        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
