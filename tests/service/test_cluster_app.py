"""The Ray Serve application without a cluster: options from settings, the ``serve deploy`` builder
(``service.cluster.serving:app``) over a sharded version, and the errors a wrong setting or a missing
index gives before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as cli
from ccrk_settings import SettingsError
from service.cluster.deployments import ClusterOptions, shard_deployment_name
from service.cluster.serving import app, shard_count_of
from store.errors import IndexNotFoundError
from tests.fixtures import make_settings
from tests.store.writing import vectors, write_rows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.serve._private.config")

NAME = "sharded"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexes")
    write_rows(root, NAME, vectors(60, seed=1), [f"p-{i}" for i in range(60)], shard_count=3)
    write_rows(root, "flat", vectors(10, seed=2), [f"f-{i}" for i in range(10)])
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
