"""deploy/ray/serve.yaml, the Ray Serve config of `serve deploy` (no cluster here): valid against Ray's own
schema (``ray.serve.schema.ServeDeploySchema``, and no key that schema would silently ignore), its import
path the application builder in the repository, its runtime_env valid for Ray with every variable a setting,
its args settings that validate with them, and the application built from it (bound, not run) named and
placed as the code makes it."""

from __future__ import annotations

import importlib
import inspect
import os
import shlex
import types
import typing
from pathlib import PurePosixPath
from typing import Any

import pytest
from pydantic import BaseModel

from ccrk_settings import Settings, SettingsError, get_settings, settings_with
from tests.deploy.deployment import (
    RAY_SERVE_CONFIG,
    REPO,
    check_settings_env,
    dockerfile_stages,
    ray_serve_config,
)

# Ray's own schema module declares its fields in a way pydantic 2 deprecates (not this project's code).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.serve._private.config")


def application() -> dict[str, Any]:
    (app,) = ray_serve_config()["applications"]
    return app


def unknown_keys(model: type[BaseModel], data: Any, where: str) -> list[str]:
    """Keys of DATA that MODEL has no field for, recursively through its nested schema models: Ray's schemas
    ignore unknown keys, so a misspelt option would pass validation and do nothing."""
    if not isinstance(data, dict):
        return []
    fields = {f.alias or name: f for name, f in model.model_fields.items()} | dict(model.model_fields)
    out = []
    for key, value in data.items():
        if key not in fields:
            out.append(f"{where}.{key}")
            continue
        for nested in schema_models(fields[key].annotation):
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                out += unknown_keys(
                    nested, item, f"{where}.{key}" + (f"[{i}]" if isinstance(value, list) else "")
                )
    return out


def schema_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (Optional[X], List[X], X | None ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        return [m for arg in args for m in schema_models(arg)]
    return []


def config_settings() -> Settings:
    """The replicas' settings: the config's CCRK_ variables (nothing else from this machine) with its args."""
    app = application()
    env = app["runtime_env"]["env_vars"]
    base = check_settings_env(env, "deploy/ray/serve.yaml runtime_env.env_vars")
    return settings_with(app["args"], base=base)


def test_config_validates_against_rays_schema_with_no_ignored_keys() -> None:
    from ray.serve.config import ProxyLocation
    from ray.serve.schema import ServeDeploySchema

    from service.cluster.serving import APP_NAME

    config = ray_serve_config()
    schema = ServeDeploySchema.model_validate(config)
    assert not unknown_keys(ServeDeploySchema, config, "serve.yaml")
    (app,) = schema.applications
    assert app.name == APP_NAME and app.route_prefix == "/"
    # Every node's proxy takes requests, on all interfaces, at the port the images serve on.
    assert schema.proxy_location == ProxyLocation.EveryNode
    image_env = dockerfile_stages(REPO / "Dockerfile")[-1].env()
    assert schema.http_options.host == "0.0.0.0"
    assert schema.http_options.port == int(image_env["CCRK_PORT"])


def test_unknown_keys_are_found() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = ray_serve_config()
    config["http_options"]["prot"] = 8000
    config["applications"][0]["deployments"] = [{"name": "ingress", "num_replica": 2}]
    found = unknown_keys(ServeDeploySchema, config, "serve.yaml")
    assert found == ["serve.yaml.http_options.prot", "serve.yaml.applications[0].deployments[0].num_replica"]


def test_import_path_is_the_application_builder() -> None:
    from service.cluster import serving

    module_name, _, attr = application()["import_path"].partition(":")
    module = importlib.import_module(module_name)
    assert module.__file__ == str((REPO / module_name.replace(".", "/")).with_suffix(".py")), (
        "this repository's"
    )
    builder = getattr(module, attr)
    assert builder is serving.app and callable(builder)
    # An application builder: Serve calls it with the config's args.
    assert list(inspect.signature(builder).parameters) == ["args"]


def test_runtime_env_is_valid_for_ray_and_its_variables_are_settings() -> None:
    from ray.runtime_env import RuntimeEnv

    runtime_env = application()["runtime_env"]
    RuntimeEnv(**runtime_env)  # Ray's own check: env_vars must be str -> str
    assert set(runtime_env) == {"env_vars"}, "nothing to install on the nodes: the image or venv has it all"
    env = runtime_env["env_vars"]
    assert all(name.startswith("CCRK_") for name in env), sorted(env)
    settings = check_settings_env(env, "runtime_env.env_vars")
    # Relative paths would resolve against each worker process's working folder: the same absolute paths on
    # every node instead (a shared file system for the index root).
    for path in (settings.index_root, settings.model_dir, settings.history_db):
        assert PurePosixPath(path.as_posix()).is_absolute(), path
    # Where the images put them: the index volume and the embedded default model.
    image_env = dockerfile_stages(REPO / "Dockerfile")[-1].env()
    assert env["CCRK_INDEX_ROOT"] == image_env["CCRK_INDEX_ROOT"]
    assert env["CCRK_MODEL_DIR"] == image_env["CCRK_MODEL_DIR"]
    assert env["CCRK_HISTORY_DB"] == image_env["CCRK_HISTORY_DB"]
    # Not needed on the replicas: the app runs on the cluster it is deployed to.
    assert not {"CCRK_SERVE_ENGINE", "CCRK_RAY_ADDRESS"} & set(env)


def test_args_are_settings_and_validate_with_the_environment() -> None:
    args = application()["args"]
    assert args and all(name in Settings.model_fields for name in args), sorted(args)
    settings = config_settings()
    for name, value in args.items():
        assert getattr(settings, name) == value, name
    # 2 replicas of every shard, never two of one shard on a node: a lost node or replica costs no shard.
    assert settings.ray_shard_replicas >= 2 and settings.ray_max_replicas_per_node == 1
    assert settings.ray_shard_retries >= 1
    assert settings.ray_ingress_replicas >= 2


def test_application_built_from_the_config_names_and_places_its_deployments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The builder itself, as `serve deploy` runs it on the cluster: the replicas' environment (the config's
    variables only), the args, a version of 3 shards (stubbed: no index here). Deployments are bound, not
    started: no Ray runs."""
    from service.cluster import serving
    from service.cluster.deployments import INGRESS, ClusterOptions, shard_deployment_name

    app = application()
    for key in [k for k in os.environ if k.startswith("CCRK_")]:
        monkeypatch.delenv(key)
    for key, value in app["runtime_env"]["env_vars"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO / "deploy")  # no .env file here
    monkeypatch.setattr(serving, "shard_count_of", lambda settings: 3)
    get_settings.cache_clear()
    try:
        built = serving.app(app["args"])
    finally:
        get_settings.cache_clear()
    settings = config_settings()
    ingress = built._bound_deployment
    assert ingress.name == INGRESS
    assert ingress.num_replicas == settings.ray_ingress_replicas
    assert ingress.ray_actor_options["num_cpus"] == settings.ray_ingress_cpus
    bound_settings, shards, options, extra_shards = ingress.init_args
    assert extra_shards == {}  # the config serves one index
    assert options == ClusterOptions.from_settings(settings)
    assert (bound_settings.index_root, bound_settings.index_name) == (
        settings.index_root,
        settings.index_name,
    )
    names = [shard._bound_deployment.name for shard in shards]
    assert names == [shard_deployment_name(i) for i in range(3)] == ["shard-000", "shard-001", "shard-002"]
    for shard in shards:
        deployment = shard._bound_deployment
        assert deployment.num_replicas == settings.ray_shard_replicas
        assert deployment.ray_actor_options["num_cpus"] == settings.ray_shard_cpus
        assert deployment._replica_config.max_replicas_per_node == settings.ray_max_replicas_per_node
    # Deployment options named in the file (none now) must name deployments the code creates.
    for entry in app.get("deployments", []):
        assert entry["name"] in {INGRESS, *names}, entry["name"]


def test_bad_args_fail_the_build_named_as_in_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cluster import serving

    monkeypatch.setattr(serving, "shard_count_of", lambda settings: 1)
    base = Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.setattr("ccrk_settings.get_settings", lambda: base)
    with pytest.raises(SettingsError, match=r"args\.ray_shard_replicas"):
        serving.app({**application()["args"], "ray_shard_replicas": 0})


def test_comments_start_ray_with_the_fast_path_environment() -> None:
    """`ray start` must have FAST_PATH_ENV in its environment on every node: the usage comment exports it."""
    from service.cluster.serving import FAST_PATH_ENV

    exports = [
        line.lstrip("#").split()
        for line in RAY_SERVE_CONFIG.read_text(encoding="utf-8").splitlines()
        if line.lstrip("# ").startswith("export ")
    ]
    assert len(exports) == 1
    exported = dict(word.split("=", 1) for word in shlex.split(" ".join(exports[0][1:])))
    assert exported == FAST_PATH_ENV
