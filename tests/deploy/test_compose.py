"""docker-compose.yml, parsed (no Docker engine here): valid against the Compose specification's schema,
and every command, port, path, health endpoint and CCRK_ variable it names exists in the code."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from importlib.resources import files
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import psycopg.conninfo
import pytest

from tests.deploy.deployment import (
    REPO,
    app_client,
    ccrk_calls,
    check_ccrk,
    check_settings_env,
    compose,
    dockerfile_stages,
    exec_form,
    is_route,
)

CCRK_SERVICES = ("indexer", "api")
# The official image's data folder (its VOLUME) and its postgres user in the alpine variant.
POSTGRES_DATA = PurePosixPath("/var/lib/postgresql/data")
POSTGRES_UID = 70


def image_env() -> dict[str, str]:
    return dockerfile_stages(REPO / "Dockerfile")[-1].env()


def interpolate(value: str, host: Mapping[str, str]) -> str:
    """A value as compose passes it on, given the environment of the machine running compose: ``$$`` is a
    literal ``$``, ``${NAME:-default}`` the default when NAME is unset or empty, ``${NAME-default}`` when
    unset. A variable without a default would make the file depend on that machine: refused."""

    def value_of(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1), m.group(2), m.group(3)
        assert op is not None, f"{value!r}: ${{{name}}} has no default"
        given = host.get(name)
        return default if given is None or (op == ":-" and not given) else given

    pattern = r"\$\$|\$\{(\w+)(:?-)?([^}]*)\}"
    assert "$" not in re.sub(pattern, "", value), f"{value!r}: a form of interpolation not read here"
    return re.sub(pattern, value_of, value)


def service_env(name: str, host: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the container sees: the image's ENV (ours, for the ccrk services) overlaid by the service's
    environment, interpolated as compose does on a machine whose environment is HOST (none: defaults)."""
    env = dict(compose()["services"][name].get("environment", {}))
    given = host or {}
    base = image_env() if name in CCRK_SERVICES else {}
    return {**base, **{k: interpolate(str(v), given) for k, v in env.items()}}


def argv(name: str) -> list[str]:
    """The container's command line: entrypoint (the service's, else the image's) + command."""
    service = compose()["services"][name]
    final = dockerfile_stages(REPO / "Dockerfile")[-1]
    entrypoint = service.get("entrypoint") or exec_form(final.values("ENTRYPOINT")[-1])
    command = service.get("command") or exec_form(final.values("CMD")[-1])
    # Compose reads $$ as a literal $ (left for the container's shell); a single $ would be
    # interpolated from the machine running compose, which these files never rely on.
    return [unescape(word) for word in [*entrypoint, *command]]


def unescape(word: str) -> str:
    assert not re.search(r"(?<!\$)\$(?!\$)", word.replace("$$", "")), f"host interpolation in {word!r}"
    return word.replace("$$", "$")


def mounts(name: str) -> dict[PurePosixPath, tuple[str, bool]]:
    """Container path -> (volume, read-only) for a service's named-volume mounts."""
    out = {}
    for spec in compose()["services"][name].get("volumes", []):
        volume, path, *mode = spec.split(":")
        out[PurePosixPath(path)] = (volume, mode == ["ro"])
    return out


def volume_of(name: str, path: str) -> tuple[str, bool] | None:
    target = PurePosixPath(path)
    for mount, value in mounts(name).items():
        if target == mount or mount in target.parents:
            return value
    return None


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    # The Compose specification's JSON schema, as vendored (and kept current) by check-jsonschema.
    schema_text = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    schema: dict[str, Any] = json.loads(schema_text)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_services_and_start_order() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "postgres", "indexer", "api"}
    assert services["api"]["depends_on"] == {
        "indexer": {"condition": "service_completed_successfully"},
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
    }
    assert services["indexer"]["restart"] == "no", "a one-shot job"
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name in CCRK_SERVICES:
        assert services[name]["build"] == {"context": ".", "dockerfile": "Dockerfile"}
        assert (REPO / services[name]["build"]["dockerfile"]).is_file()


def test_environment_is_settings_and_validates() -> None:
    for name in CCRK_SERVICES:
        settings = check_settings_env(service_env(name), f"docker-compose.yml {name}")
        assert settings.index_name == "demo"
        redis = urlsplit(settings.redis_url or "")
        assert (redis.scheme, redis.hostname, redis.port) == ("redis", "redis", 6379), settings.redis_url


def test_every_ccrk_command_parses() -> None:
    seen = []
    for name in CCRK_SERVICES:
        calls = ccrk_calls(argv(name), service_env(name))
        assert calls, f"{name} runs no ccrk command: {argv(name)}"
        for call in calls:
            check_ccrk(call)
            seen.append(call[:2])
    assert seen == [["data", "synth"], ["probe", "make-set"], ["index", "build"], ["serve"]]


def test_indexer_writes_where_the_api_reads() -> None:
    env = service_env("api")
    settings = check_settings_env(env, "api")
    index_root = settings.index_root.as_posix()
    assert volume_of("indexer", index_root) == ("indexes", False)
    assert volume_of("api", index_root) == ("indexes", True), "the api reads the index volume read-only"
    # Every path a command names is on a volume the api sees at the same place: the index stores the
    # images' absolute paths, and the probe set is read by the api.
    for call in ccrk_calls(argv("indexer"), service_env("indexer")):
        for word in call:
            if word.startswith("/var/lib/ccrk/"):
                shared = volume_of("indexer", word)
                assert shared is not None and volume_of("api", word) == (shared[0], True), word
    assert settings.probe_set is not None
    assert volume_of("api", settings.probe_set.as_posix()) == ("catalogue", True)
    # The model is the image's own copy (not a volume here): indexer and api load the same model.
    assert service_env("indexer")["CCRK_MODEL_DIR"] == env["CCRK_MODEL_DIR"] == image_env()["CCRK_MODEL_DIR"]


def test_api_port_and_health_check() -> None:
    api = compose()["services"]["api"]
    settings = check_settings_env(service_env("api"), "api")
    (mapping,) = api["ports"]
    host_ip, host_port, container_port = mapping.split(":")
    assert host_ip == "127.0.0.1" and host_port == "8000"
    assert int(container_port) == settings.port == 8000
    test = api["healthcheck"]["test"]
    (url,) = re.findall(r"'(http://[^']+)'", test[-1])
    parts = urlsplit(url)
    assert parts.port == settings.port and parts.path == "/readyz"
    assert is_route(app_client(), parts.path)


def test_probe_schedule_is_set_for_the_api() -> None:
    settings = check_settings_env(service_env("api"), "api")
    assert settings.probe_interval_min > 0, "the api probes itself every N minutes"
    make_set = next(
        c for c in ccrk_calls(argv("indexer"), service_env("indexer")) if c[:2] == ["probe", "make-set"]
    )
    assert make_set[make_set.index("--out") + 1] == settings.probe_set.as_posix()


@pytest.mark.parametrize("host", [{}, {"POSTGRES_PASSWORD": "s3cret-Pass_1"}], ids=["default", "set"])
def test_api_writes_its_change_log_to_the_postgres_service(host: dict[str, str]) -> None:
    # The api's index volume is read-only (test_indexer_writes_where_the_api_reads): the default SQLite log
    # in the index folder could not be written, so product writes need the PostgreSQL log.
    settings = check_settings_env(service_env("api", host), "api")
    assert settings.live_dsn, "the api has no CCRK_LIVE_DSN"
    dsn = psycopg.conninfo.conninfo_to_dict(settings.live_dsn)  # as the api's psycopg reads it
    db = service_env("postgres", host)
    assert (dsn["host"], dsn["port"]) == ("postgres", "5432"), settings.live_dsn
    assert (dsn["user"], dsn["password"], dsn["dbname"]) == (
        db["POSTGRES_USER"],
        db["POSTGRES_PASSWORD"],
        db["POSTGRES_DB"],
    ), "the api logs in as the user, password and database postgres creates"
    assert db["POSTGRES_PASSWORD"] == host.get("POSTGRES_PASSWORD", db["POSTGRES_PASSWORD"])
    # Only the api writes products; the indexer's environment (x-ccrk-env) has no log.
    assert "CCRK_LIVE_DSN" not in service_env("indexer")


def test_postgres_service_is_healthy_only_when_serving_keeps_its_data_and_is_not_published() -> None:
    postgres = compose()["services"]["postgres"]
    assert postgres["image"] == "postgres:17-alpine"
    assert "ports" not in postgres, "reached by the api on the compose network only"
    env = service_env("postgres")
    test = postgres["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    flags = dict(zip(test[2::2], test[3::2], strict=True))
    # TCP, not the socket: the image's first-start set-up server listens on the socket only.
    assert flags["-h"] == "127.0.0.1" and flags["-p"] == "5432"
    assert (flags["-U"], flags["-d"]) == (env["POSTGRES_USER"], env["POSTGRES_DB"])
    # The database on a named volume at the image's data folder (PGDATA left at the image's default).
    assert "PGDATA" not in env
    assert mounts("postgres")[POSTGRES_DATA] == ("postgres", False)
    assert "postgres" in compose()["volumes"]
    # Hardened as the ccrk services: its own user from the start (no root step needing capabilities),
    # read-only root with memory-backed folders for the socket and the entrypoint's scripts.
    assert postgres["user"] == f"{POSTGRES_UID}:{POSTGRES_UID}"
    assert postgres["cap_drop"] == ["ALL"] and "no-new-privileges:true" in postgres["security_opt"]
    assert postgres["read_only"] is True
    assert {"/var/run/postgresql", "/tmp"} <= set(postgres["tmpfs"])
    assert postgres["restart"] == "unless-stopped"
