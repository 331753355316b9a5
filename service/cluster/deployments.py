"""The Ray Serve application of ``ccrk serve --engine ray``: one deployment per shard (``ShardServer``,
named ``shard-000`` ...) and the service's FastAPI app (``service.app.create_app``) as the ingress, whose
index holders open sharded versions as ``RemoteShardedIndex`` over handles to the shard deployments. Every
served index (``index_name`` and ``extra_indexes``) has deployments of its own for the shards of its
version: ``shard-000`` ... for the default index, ``NAME-shard-000`` ... for an extra one.

The ingress keeps everything the service does per query (language detection, query encoding, caches,
metrics, re-ranking, responses); the shards only search and read rows. Index root and model directory must
be at the same paths on every node (a shared file system), as for ``--engine ray`` builds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ccrk_settings import Settings
from service.app import create_app
from service.cluster.remote_index import remote_opener
from service.cluster.shard import ShardServer
from store.opening import open_version

INGRESS = "ingress"


def shard_deployment_name(index: int, name: str | None = None) -> str:
    """Shard ``index``'s deployment of the default index (``name`` None), or of the extra index ``name``."""
    return f"shard-{index:03d}" if name is None else f"{name}-shard-{index:03d}"


@dataclass
class ClusterOptions:
    """How the deployments are placed (``serve.deployment`` options)."""

    shard_replicas: int = 1
    ingress_replicas: int = 1
    shard_cpus: float = 0.5
    ingress_cpus: float = 1.0
    shard_memory: int | None = None  # bytes Ray reserves per shard replica
    max_replicas_per_node: int | None = None  # per shard deployment: spreads a shard's replicas over nodes
    retries: int = 2  # per shard call, on a replica that died or is unreachable
    timeout_s: float = 30.0  # per shard call

    @classmethod
    def from_settings(cls, settings: Settings) -> ClusterOptions:
        memory = settings.ray_shard_memory_mb
        return cls(
            shard_replicas=settings.ray_shard_replicas,
            ingress_replicas=settings.ray_ingress_replicas,
            shard_cpus=settings.ray_shard_cpus,
            ingress_cpus=settings.ray_ingress_cpus,
            shard_memory=memory * 1024 * 1024 if memory else None,
            max_replicas_per_node=settings.ray_max_replicas_per_node,
            retries=settings.ray_shard_retries,
            timeout_s=settings.ray_shard_timeout_s,
        )


class ShardDeployment(ShardServer):
    """A shard replica's body: every call in a worker thread. Ray Serve runs a deployment's sync methods on
    the replica's event loop, one after another; faiss, numpy and SQLite release the GIL, so threads let a
    replica serve its ``max_ongoing_requests`` calls at once."""

    async def open(self, version: str) -> dict[str, Any]:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.open, self, version)

    async def release(self, version: str) -> None:  # type: ignore[override]
        ShardServer.release(self, version)

    async def search(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.search, self, *args)

    async def search_exact(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.search_exact, self, *args)

    async def filter_rows(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.filter_rows, self, *args)

    async def items(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.items, self, *args)

    async def row_of(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.row_of, self, *args)

    async def rerank_tokens(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.rerank_tokens, self, *args)

    async def embeddings(self, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.to_thread(ShardServer.embeddings, self, *args)


def _retry_errors() -> tuple[type[BaseException], ...]:
    """A replica that died or cannot be reached: the call is sent again (Serve routes it to another)."""
    from ray.exceptions import ActorUnavailableError, NodeDiedError, RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError

    return (RayActorError, ActorUnavailableError, ReplicaUnavailableError, NodeDiedError)


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """Any other failure of Ray or Serve (no replica of a deployment, back pressure, lost objects): a 503."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import RayServeException

    return (RayError, RayServeException)


INGRESS_SEARCH_SLOTS = 4


class Ingress:
    """The ingress deployment's body: the service app, built on the replica (``__serve_build_asgi_app__``)."""

    def __init__(
        self,
        settings: Settings,
        shards: list[Any],
        options: ClusterOptions,
        extra_shards: Mapping[str, list[Any]] | None = None,
    ) -> None:
        # The ingress's searches mostly wait on the shards' replies, not on its own cores: the slots it
        # had before they followed the cores (CCRK_SEARCH_WORKERS, where set, still rules).
        if not settings.search_workers:
            settings = settings.model_copy(update={"search_workers": INGRESS_SEARCH_SLOTS})
        self.settings = settings
        self.shards = list(shards)  # DeploymentHandles, one per shard of the default index
        self.options = options
        self.extra_shards = {name: list(handles) for name, handles in (extra_shards or {}).items()}
        self._app: Any = None
        self._ready = False  # passed the health check once (``check_health``)

    @staticmethod
    def _call(handles: list[Any], shard: int, method: str, *args: Any) -> Any:
        return getattr(handles[shard], method).remote(*args)

    def _opener(self, names: tuple[str, ...]) -> Any:
        """The index holders' opener: a version of index NAME over NAME's own shard deployments (a shard
        server serves the shards of one index: a version of another is not under its folder). An index
        without deployments (unsharded when the app was deployed) reads an unsharded version itself and
        refuses a sharded one until the app is deployed again (``redeploy_if_resharded``); so does an index
        that joins after the start (``*``: ``Runtime._discover``)."""
        handles = {**self.extra_shards, self.settings.index_name: self.shards}

        def of(name: str) -> Any:
            return remote_opener(
                partial(self._call, handles.get(name, [])),
                len(handles.get(name, [])),
                open_version,
                retries=self.options.retries,
                timeout_s=self.options.timeout_s,
                retry_on=_retry_errors(),
                unreachable_on=_unreachable_errors(),
            )

        openers = {name: of(name) for name in dict.fromkeys((*names, *handles))}

        def opener(root: Any, name: str, version: str | None = None, **kwargs: Any) -> Any:
            if name not in openers:
                openers[name] = of(name)
            return openers[name](root, name, version, **kwargs)

        return opener

    def check_health(self) -> None:
        """Serve's health check, the first one included: a replica is not ready until every index it serves
        has a version served (its shards still loading or starting), the default index's even when it cannot
        be opened; an extra index whose loading gave up (none published, a version that cannot be opened:
        ``Runtime.loading``) answers 503 instead of failing the replica for good. So a rolling update keeps
        the old ingress replicas until the new ones serve every index. Once ready, a replica stays ready: a
        later failure of one index is its routes' 503s, not a reason for Serve to restart the replica."""
        if self._ready or self._app is None:
            return
        waiting = self._app.state.runtime.loading()
        if waiting:
            raise RuntimeError(f"no version served yet: {'; '.join(waiting)}")
        self._ready = True

    def __serve_build_asgi_app__(self) -> Any:
        app = self._app = create_app(self.settings)
        app.state.runtime.index_opener = self._opener(app.state.runtime.index_names)
        return app


def _bound_shards(settings: Settings, name: str, count: int, options: ClusterOptions) -> list[Any]:
    """The deployments of index ``name``'s ``count`` shards, bound."""
    from ray import serve

    shards = []
    for i in range(count):
        actor: dict[str, Any] = {"num_cpus": options.shard_cpus}
        if options.shard_memory:
            actor["memory"] = options.shard_memory
        placement: dict[str, Any] = {}
        if options.max_replicas_per_node:
            placement["max_replicas_per_node"] = options.max_replicas_per_node
        deployment = serve.deployment(
            ShardDeployment,
            name=shard_deployment_name(i, None if name == settings.index_name else name),
            num_replicas=options.shard_replicas,
            ray_actor_options=actor,
            **placement,
        )
        shards.append(deployment.bind(str(settings.index_root), name, i))
    return shards


def build_application(
    settings: Settings, shard_counts: int | Mapping[str, int], options: ClusterOptions | None = None
) -> Any:
    """The bound Serve application (``serve.run`` it). ``shard_counts``: the shards of each served index's
    version by name (``service.cluster.serving.shard_counts_of``; 0 or absent: unsharded), or of the
    default index's alone."""
    from ray import serve

    options = options or ClusterOptions.from_settings(settings)
    counts = {settings.index_name: shard_counts} if isinstance(shard_counts, int) else dict(shard_counts)
    shards = _bound_shards(settings, settings.index_name, counts.pop(settings.index_name, 0), options)
    extra = {name: _bound_shards(settings, name, count, options) for name, count in counts.items() if count}
    ingress_class = serve.ingress()(Ingress)
    ingress = serve.deployment(
        ingress_class,
        name=INGRESS,
        num_replicas=options.ingress_replicas,
        ray_actor_options={"num_cpus": options.ingress_cpus},
    )
    return ingress.bind(settings, shards, options, extra)
