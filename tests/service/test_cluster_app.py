"""The Ray Serve application without a cluster: options from settings, the ``serve deploy`` builder
(``service.cluster.serving:app``) over a sharded version, the shard deployments of each served index and
the ingress opening each index over its own, and the errors a wrong setting or a missing index gives
before anything starts."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as cli
from ccrk_settings import SettingsError
from service.cluster.deployments import ClusterOptions, Ingress, shard_deployment_name
from service.cluster.remote_index import RemoteShardedIndex
from service.cluster.serving import app, shard_count_of, shard_counts_of
from service.cluster.shard import ShardServer
from service.errors import IndexUnavailableError, ReloadFailedError
from store.errors import IndexFormatError, IndexNotFoundError, IndexUnreachableError
from store.opening import open_version
from store.version.reader import IndexVersion
from store.version.versions import current_version
from tests.fixtures import make_settings
from tests.store.writing import D, vectors, write_rows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.serve._private.config")

NAME = "sharded"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexes")
    write_rows(root, NAME, vectors(60, seed=1), [f"p-{i}" for i in range(60)], shard_count=3)
    write_rows(root, "flat", vectors(10, seed=2), [f"f-{i}" for i in range(10)])
    write_rows(root, "other", vectors(30, seed=3), [f"o-{i}" for i in range(30)], shard_count=2)
    return root


def test_options_come_from_the_settings(root: Path) -> None:
    settings = make_settings(
        root, ray_shard_replicas=3, ray_shard_cpus=0.25, ray_shard_memory_mb=512, ray_max_replicas_per_node=1,
        ray_ingress_replicas=2, ray_ingress_cpus=2.0, ray_shard_retries=4, ray_shard_timeout_s=5.0,
    )  # fmt: skip
    options = ClusterOptions.from_settings(settings)
    assert options == ClusterOptions(
        shard_replicas=3, ingress_replicas=2, shard_cpus=0.25, ingress_cpus=2.0,
        shard_memory=512 * 1024 * 1024, max_replicas_per_node=1, retries=4, timeout_s=5.0,
    )  # fmt: skip
    assert ClusterOptions.from_settings(make_settings(root)).shard_memory is None


def test_shard_count_of_the_current_version(root: Path) -> None:
    assert shard_count_of(make_settings(root, index_name=NAME)) == 3
    assert shard_count_of(make_settings(root, index_name="flat")) == 0
    with pytest.raises(IndexNotFoundError, match="'missing' has no published version"):
        shard_count_of(make_settings(root, index_name="missing"))


def test_the_serve_deploy_builder(root: Path) -> None:
    """args are setting names, validated as a command line's: one deployment per shard with the replicas
    and CPUs asked for, the ingress binding them all."""
    from ray.serve import Application

    built = app(
        {"index_root": str(root), "index_name": NAME, "ray_shard_replicas": 2, "ray_shard_cpus": 0.25}
    )
    assert isinstance(built, Application)
    ingress = built._bound_deployment  # Serve's own build step reads the same attribute
    assert ingress.name == "ingress" and ingress.num_replicas == 1
    shards = [shard._bound_deployment for shard in ingress.init_args[1]]
    assert [s.name for s in shards] == [shard_deployment_name(i) for i in range(3)]
    assert [s.init_args for s in shards] == [(str(root), NAME, i) for i in range(3)]
    assert {s.num_replicas for s in shards} == {2}
    assert {s.ray_actor_options["num_cpus"] for s in shards} == {0.25}
    with pytest.raises(SettingsError, match=r"args\.ray_shard_replicas: Input should be greater"):
        app({"index_root": str(root), "index_name": NAME, "ray_shard_replicas": 0})
    with pytest.raises(TypeError, match="not settings: shard_replicas"):
        app({"index_root": str(root), "shard_replicas": 2})
    with pytest.raises(IndexNotFoundError):
        app({"index_root": str(root), "index_name": "missing"})


def test_serve_on_ray_refuses_a_missing_index_before_starting_ray(root: Path) -> None:
    import ray

    result = CliRunner().invoke(
        cli, ["serve", "--engine", "ray", "--index-root", str(root), "--index-name", "missing"]
    )
    assert result.exit_code == 2
    assert "'missing' has no published version" in result.output
    assert not ray.is_initialized()
    result = CliRunner().invoke(cli, ["serve", "--engine", "ray", "--shard-replicas", "0"])
    assert result.exit_code == 2 and "--shard-replicas" in result.output


def test_every_served_index_has_shard_deployments_of_its_own(root: Path) -> None:
    """``--index-name sharded,flat,other,missing``: the default index's shards are ``shard-000`` ...,
    other's ``other-shard-000`` ..., each serving its own index; unsharded and unpublished ones have none."""
    settings = make_settings(root, index_name=NAME, extra_indexes=["flat", "other", "missing"])
    assert shard_counts_of(settings) == {NAME: 3, "flat": 0, "other": 2, "missing": 0}
    built = app({"index_root": str(root), "index_name": NAME, "extra_indexes": "flat,other"})
    ingress = built._bound_deployment
    shards, extra = ingress.init_args[1], ingress.init_args[3]
    assert [s._bound_deployment.name for s in shards] == ["shard-000", "shard-001", "shard-002"]
    assert list(extra) == ["other"]
    other = [s._bound_deployment for s in extra["other"]]
    assert [s.name for s in other] == [shard_deployment_name(i, "other") for i in range(2)]
    assert [s.name for s in other] == ["other-shard-000", "other-shard-001"]
    assert [s.init_args for s in other] == [(str(root), "other", i) for i in range(2)]


class _Done:
    def __init__(self, value: object) -> None:
        self.value = value

    def result(self, timeout_s: float | None = None) -> object:
        return self.value


class _Handle:
    """A deployment handle's stand-in: ``handle.method.remote(*args)`` answered by a shard server here."""

    def __init__(self, server: ShardServer) -> None:
        self.server = server

    def __getattr__(self, method: str) -> Any:
        server = self.__dict__["server"]
        return SimpleNamespace(remote=lambda *args: _Done(getattr(server, method)(*args)))


def test_the_ingress_opens_each_index_over_its_own_shards(root: Path) -> None:
    """A sharded extra index is opened over its own deployments (before, every index went to the default
    index's shards, which have no such version: the extra index never served), and answers as
    ``ShardedIndex``; an unsharded one is read in the ingress."""
    settings = make_settings(root, index_name=NAME, extra_indexes=["flat", "other"])
    servers = {
        name: [ShardServer(str(root), name, i) for i in range(n)] for name, n in ((NAME, 3), ("other", 2))
    }
    handles = {name: [_Handle(s) for s in found] for name, found in servers.items()}
    ingress = Ingress(settings, handles[NAME], ClusterOptions(), {"other": handles["other"]})
    opener = ingress._opener((NAME, "flat", "other"))
    q = np.random.default_rng(0).standard_normal((3, D)).astype(np.float32)
    for name in (NAME, "other"):
        version = current_version(root, name)
        with opener(root, name, version) as remote, open_version(root, name) as local:
            assert isinstance(remote, RemoteShardedIndex) and len(remote) == len(local)
            for a, b in zip(remote.search(q, 7), local.search(q, 7), strict=True):
                np.testing.assert_array_equal(a, b)
        assert all(s.loaded() == [version] for s in servers[name])
    with opener(root, "flat", current_version(root, "flat")) as flat:
        assert isinstance(flat, IndexVersion) and len(flat) == 10
    # An index that joins after the start (``*``): read here when unsharded, refused when sharded (the app
    # is deployed again for its shards); before, its name was unknown to the opener.
    late = ingress._opener((NAME,))
    with late(root, "flat", current_version(root, "flat")) as flat:
        assert isinstance(flat, IndexVersion)
    alone = Ingress(settings, handles[NAME], ClusterOptions())._opener((NAME,))
    with pytest.raises(IndexFormatError, match="0 shard deployments"):
        alone(root, "other", current_version(root, "other"))


def test_the_app_is_deployed_again_when_a_served_index_changes_its_shard_count(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll step: the extra index's shard count changed, the app is deployed again for it; nothing
    changed, or an extra index's version cannot be read a moment (a publish in progress), it is not."""
    from ray import serve

    from service.cluster import serving

    runs: list[dict[str, int]] = []
    monkeypatch.setattr(serving, "build_application", lambda settings, counts, options: counts)
    monkeypatch.setattr(serve, "run", lambda built, **kwargs: runs.append(built))
    settings = make_settings(root, index_name=NAME, extra_indexes=["flat", "other", "missing"])
    deployed = {NAME: 3, "flat": 0, "other": 2, "missing": 0}
    assert serving.redeploy_if_resharded(settings, deployed, ClusterOptions()) == deployed and runs == []
    assert serving.redeploy_if_resharded(settings, {**deployed, "other": 3}, ClusterOptions()) == deployed
    assert runs == [deployed]
    # A sharded index that appeared under the root since the deploy (served as `*`) is deployed too.
    assert serving.redeploy_if_resharded(settings, {NAME: 3, "flat": 0, "missing": 0}, ClusterOptions()) == (
        deployed
    )
    assert runs == [deployed, deployed]
    shards_of = serving._shards_of

    def flaky(index_root: Path, name: str) -> int:
        if name == "other":
            raise OSError("a publish in progress")
        return shards_of(index_root, name)

    monkeypatch.setattr(serving, "_shards_of", flaky)
    assert serving.redeploy_if_resharded(settings, deployed, ClusterOptions()) == deployed and len(runs) == 2


def test_the_ingress_is_ready_when_every_index_serves_or_gave_up(root: Path) -> None:
    """Serve's health check: not ready while an extra index may still load (its shard deployments still
    starting: unreachable, tried again at each poll), ready once it serves; an extra index without a published
    version, or whose version cannot be opened, does not hold the replica back (its routes answer 503), the
    default index does. Once ready, a replica stays ready."""
    from service.app import create_app

    settings = make_settings(root, index_name="flat", extra_indexes=[NAME, "other", "missing"])
    ingress = Ingress(settings, [], ClusterOptions())
    ingress._app = app = create_app(settings)
    runtime = app.state.runtime
    with pytest.raises((RuntimeError, IndexUnavailableError), match="starting"):
        ingress.check_health()  # before the lifespan's start
    failing = {
        "other": IndexUnreachableError("shard deployments still starting"),
        NAME: IndexFormatError("bad"),
    }

    def opener(index_root: Path, name: str, version: str | None = None, **kwargs: Any) -> Any:
        if name in failing:
            raise failing[name]
        return open_version(index_root, name, version, **kwargs)

    runtime.index_opener = opener
    for name in runtime.index_names:
        runtime.holders[name] = holder = runtime._new_holder(name)
        with suppress(ReloadFailedError):
            holder.reload()
    assert [runtime.holders[n].served is not None for n in runtime.index_names] == [True, False, False, False]
    with pytest.raises(RuntimeError, match=r"no version served yet: other: .*still starting$"):
        ingress.check_health()
    del failing["other"]
    assert runtime.holders["other"].check()
    ingress.check_health()  # NAME (cannot be opened) and missing (none published) answer 503 meanwhile
    assert runtime.loading() == []
    runtime.holders["other"] = runtime._new_holder("other")  # never loaded: a ready replica stays ready
    ingress.check_health()
    # The default index holds a replica back even when its version cannot be opened.
    fresh = Ingress(settings, [], ClusterOptions())
    fresh._app = app
    failing["flat"] = IndexFormatError("another model")
    runtime.holders["flat"] = runtime._new_holder("flat")
    with pytest.raises(ReloadFailedError):
        runtime.holders["flat"].reload()
    with pytest.raises(RuntimeError, match=r"flat: cannot open .*another model"):
        fresh.check_health()


def test_an_extra_index_out_of_reach_holds_the_ingress_back_only_for_a_while(root: Path) -> None:
    """An extra index whose shards stay out of reach holds a replica back for ``UNREACHABLE_WAIT_S`` of time
    (from the first failing try), then counts as given up: the replica is ready, the index answers 503 and
    is served once its shards answer. Each open waits out a 120 s timeout (as ``open_timeout_s`` on Ray), the
    poll is 30 s: the third try ends 420 s after the first began, so the replica is ready then (a count of
    tries, 1 + 300 / 30, kept it back for 11 tries, over 20 minutes)."""
    from service import runtime as runtime_module
    from service.app import create_app

    assert runtime_module.UNREACHABLE_WAIT_S == 300.0
    settings = make_settings(root, index_name="flat", extra_indexes=["other"], index_poll_s=30.0)
    ingress = Ingress(settings, [], ClusterOptions())
    ingress._app = app = create_app(settings)
    runtime = app.state.runtime
    unreachable = {"other"}
    now = [1000.0]

    def opener(index_root: Path, name: str, version: str | None = None, **kwargs: Any) -> Any:
        if name in unreachable:
            now[0] += 120.0  # the open's timeout
            raise IndexUnreachableError("shard deployments never placed")
        return open_version(index_root, name, version, **kwargs)

    runtime.index_opener = opener
    runtime.clock = lambda: now[0]
    for name in runtime.index_names:
        runtime.holders[name] = holder = runtime._new_holder(name)
        with suppress(ReloadFailedError):
            holder.reload()
    with pytest.raises(RuntimeError, match=r"other: .*never placed"):
        ingress.check_health()
    now[0] += settings.index_poll_s
    assert runtime.holders["other"].check() is False  # began at 150 s, failed at 270 s
    with pytest.raises(RuntimeError, match=r"other: .*never placed"):
        ingress.check_health()
    now[0] += settings.index_poll_s
    assert runtime.holders["other"].check() is False  # began at 300 s, failed at 420 s: given up
    ingress.check_health()
    assert runtime.loading() == [] and runtime.holders["other"].served is None
    unreachable.clear()
    assert runtime.holders["other"].check() is True


def test_the_drivers_poll_serves_on_over_a_current_that_is_not_utf8(tmp_path: Path) -> None:
    """A binary CURRENT of the default index or of an extra one: the Ray driver's poll step keeps the counts
    deployed (an unreadable CURRENT, as a publish in progress); a UnicodeDecodeError ended its loop, whose
    ``finally`` deleted the whole app."""
    from service.cluster.serving import redeploy_if_resharded

    for name in ("main", "extra"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "CURRENT").write_bytes(b"\xff\xfe\x00v1")
    settings = make_settings(tmp_path, index_name="main", extra_indexes=["extra"])
    options = ClusterOptions.from_settings(settings)
    deployed = {"main": 2, "extra": 3}
    assert redeploy_if_resharded(settings, deployed, options) == deployed
