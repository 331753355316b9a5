"""Running the Serve application: ``ccrk serve --engine ray [--address HEAD:PORT]``."""

from __future__ import annotations

import logging
import time

from ccrk_settings import Settings
from service.cluster.deployments import ClusterOptions, build_application
from store.layout import MANIFEST_FILE, index_dir
from store.manifest import IndexManifest
from store.sharding import Sharding
from store.versions import current_version

log = logging.getLogger(__name__)

APP_NAME = "ccrk"


def shard_count_of(settings: Settings) -> int:
    """Shards of the version CURRENT names: one deployment each (0 for an unsharded version, which the
    ingress reads itself). A later version with another shard count is refused until a restart."""
    version = current_version(settings.index_root, settings.index_name)
    if version is None:
        raise SystemExit(
            f"index {settings.index_name!r} has no published version under {settings.index_root}"
        )
    manifest = IndexManifest.load(
        index_dir(settings.index_root, settings.index_name) / version / MANIFEST_FILE
    )
    return Sharding.from_dict(manifest.sharding).shard_count if manifest.is_sharded else 0


def serve_on_ray(settings: Settings, options: ClusterOptions | None = None) -> None:
    """Connect to the cluster (``ray_address``; unset: RAY_ADDRESS or a local Ray), start Serve's HTTP proxy
    on ``host:port``, deploy the app and block until interrupted; the app is deleted on the way out."""
    import ray
    from ray import serve

    ray.init(address=settings.ray_address, log_to_driver=False)
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        app = build_application(settings, shard_count_of(settings), options)
        serve.run(app, name=APP_NAME, route_prefix="/")
        log.info("serving %s on http://%s:%d (Ray Serve)", settings.index_name, settings.host, settings.port)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
