"""deploy/k8s, parsed (no cluster here): every manifest valid against the Kubernetes API schemas (strict:
unknown fields fail), and the references between them and into the code hold: commands, ports, probe
paths, volumes, settings."""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import psycopg.conninfo
import pytest
import yaml

from ccrk_settings import Settings
from ccrk_settings.reference import env_names
from tests.deploy.deployment import (
    K8S_DIR,
    K8S_VERSIONS,
    REPO,
    app_client,
    ccrk_calls,
    check_ccrk,
    check_settings_env,
    container_env,
    dockerfile_stages,
    exec_form,
    is_route,
    k8s_documents,
    k8s_find,
    pod_spec,
)

IMAGE = "ccrk-search"
POSTGRES = "ccrk-postgres"  # the Service, the StatefulSet and the operator's Secret
POSTGRES_UID = 70  # the postgres user of the official alpine image


def ccrk_containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload document, container) for every container running the ccrk-search image."""
    out = []
    for _, doc in k8s_documents():
        if doc["kind"] in ("Deployment", "CronJob", "StatefulSet", "Job"):
            for container in pod_spec(doc)["containers"]:
                if container["image"] == IMAGE:
                    out.append((doc, container))
    return out


def container_argv(container: dict[str, Any]) -> list[str]:
    final = dockerfile_stages(REPO / "Dockerfile")[-1]
    command = container.get("command") or exec_form(final.values("ENTRYPOINT")[-1])
    args = container.get("args") if "args" in container else exec_form(final.values("CMD")[-1])
    return [*command, *args]


def full_env(container: dict[str, Any]) -> dict[str, str]:
    return {**dockerfile_stages(REPO / "Dockerfile")[-1].env(), **container_env(container)}


def mount_of(doc: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, bool] | None:
    """(claim name or volume name, read-only) of the mount holding PATH in a container."""
    volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    target = PurePosixPath(path)
    for m in container.get("volumeMounts", []):
        root = PurePosixPath(m["mountPath"])
        if target == root or root in target.parents:
            volume = volumes[m["name"]]
            claim = volume.get("persistentVolumeClaim", {}).get("claimName", m["name"])
            return claim, bool(m.get("readOnly", False))
    return None


def api() -> tuple[dict[str, Any], dict[str, Any]]:
    doc = k8s_find("Deployment", "ccrk-api")
    (container,) = pod_spec(doc)["containers"]
    return doc, container


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_are_valid_kubernetes_objects(version: str) -> None:
    docs = k8s_documents()
    assert docs
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name} {doc['kind']}/{doc['metadata']['name']}: {exc.message}") from None


def test_kustomization_lists_every_manifest_and_sets_the_image() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    assert [i["name"] for i in kustomization["images"]] == [IMAGE]
    kinds = {doc["kind"] for _, doc in k8s_documents()}
    expected = {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "PersistentVolumeClaim"}
    assert expected | {"CronJob", "StatefulSet", "PodDisruptionBudget", "Namespace"} == kinds


def test_every_ccrk_container_command_parses_and_its_environment_validates() -> None:
    seen = []
    for doc, container in ccrk_containers():
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        env = full_env(container)
        check_settings_env(env, where)
        calls = ccrk_calls(container_argv(container), env)
        assert calls, f"{where} runs no ccrk command"
        for call in calls:
            check_ccrk(call)
            seen.append((doc["metadata"]["name"], call[:2]))
    assert ("ccrk-api", ["serve"]) in seen
    assert ("ccrk-index-rebuild", ["index", "build"]) in seen
    assert ("ccrk-probe", ["probe", "run"]) in seen


def test_api_probes_ports_and_resources() -> None:
    _, container = api()
    settings = check_settings_env(full_env(container), "ccrk-api")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port}
    assert settings.host == "0.0.0.0"
    client = app_client()
    for probe, path in (
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path and is_route(client, path), probe
        assert get["port"] in ports, f"{probe} names port {get['port']!r}"
    # What the probes rely on: alive while no index is loaded, but not ready.
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    requests = container["resources"]["requests"]
    assert {"cpu", "memory"} <= set(requests), "requests: the scheduler and the HPA need them"
    assert "memory" in container["resources"]["limits"]


def test_pods_run_as_the_image_user_without_root() -> None:
    uid = int(dockerfile_stages(REPO / "Dockerfile")[-1].values("USER")[-1].split(":")[0])
    for doc, container in ccrk_containers():
        pod = pod_spec(doc)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == uid, doc["metadata"]["name"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # A read-only root: whatever the process writes goes to a mounted volume.
        assert mount_of(doc, container, "/tmp") is not None, f"{doc['metadata']['name']} has no writable /tmp"


def test_service_hpa_and_disruption_budget_target_the_api() -> None:
    doc, container = api()
    labels = doc["spec"]["template"]["metadata"]["labels"]
    service = k8s_find("Service", "ccrk-api")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    hpa = k8s_find("HorizontalPodAutoscaler", "ccrk-api")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "ccrk-api")
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and "cpu" in container["resources"]["requests"]
    pdb = k8s_find("PodDisruptionBudget", "ccrk-api")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a node drain must be able to proceed"


def test_volumes_claims_and_shared_paths() -> None:
    claims = {
        doc["metadata"]["name"]: doc for _, doc in k8s_documents() if doc["kind"] == "PersistentVolumeClaim"
    }
    for name in ("ccrk-indexes", "ccrk-catalogue"):
        assert claims[name]["spec"]["accessModes"] == ["ReadWriteMany"], "API pods on many nodes share it"
    for _, doc in k8s_documents():
        if doc["kind"] in ("Deployment", "CronJob"):
            for volume in pod_spec(doc).get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    assert volume["persistentVolumeClaim"]["claimName"] in claims
    api_doc, api_container = api()
    api_settings = check_settings_env(full_env(api_container), "ccrk-api")
    index_root = api_settings.index_root.as_posix()
    assert mount_of(api_doc, api_container, index_root) == ("ccrk-indexes", True)
    for doc, container in ccrk_containers():
        env = full_env(container)
        settings = Settings.model_validate(check_settings_env(env, "").model_dump())
        assert (
            settings.index_root == api_settings.index_root and settings.index_name == api_settings.index_name
        )
        # Every path a command names is on a volume; catalogue paths are where the API pods see them
        # (the index stores the images' absolute paths).
        for call in ccrk_calls(container_argv(container), env):
            for word in call:
                if word.startswith("/var/lib/ccrk/") and not word.startswith("/var/lib/ccrk/models/"):
                    held = mount_of(doc, container, word)
                    assert held is not None, f"{doc['metadata']['name']}: {word} is on no volume"
                    assert mount_of(api_doc, api_container, word) in (None, (held[0], True)), word


def test_rebuild_cronjob_publishes_through_current_for_the_api() -> None:
    cron = k8s_find("CronJob", "ccrk-index-rebuild")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid", "two builds of one index at once"
    (container,) = pod_spec(cron)["containers"]
    env = full_env(container)
    calls = ccrk_calls(container_argv(container), env)
    build = next(c for c in calls if c[:2] == ["index", "build"])
    assert build[build.index("--name") + 1] == env["CCRK_INDEX_NAME"]
    assert "--index-root" not in build, "the index root comes from CCRK_INDEX_ROOT, as the API's"
    settings = check_settings_env(env, "ccrk-index-rebuild")
    assert mount_of(cron, container, settings.index_root.as_posix()) == ("ccrk-indexes", False)
    assert settings.gate_min_recall_at_10 is not None, "the quality gate guards the publish"
    # API pods look for a new CURRENT on their own; no restart is part of the job.
    _, api_container = api()
    assert check_settings_env(full_env(api_container), "ccrk-api").index_poll_s <= 60
    assert not any(word in ("kubectl", "rollout") for call in calls for word in call)


def test_probe_schedule_reaches_the_api_service_and_redis() -> None:
    cron = k8s_find("CronJob", "ccrk-probe")
    (container,) = pod_spec(cron)["containers"]
    env = full_env(container)
    (call,) = ccrk_calls(container_argv(container), env)
    url = urlsplit(call[call.index("--url") + 1])
    service = k8s_find("Service", url.hostname or "")
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    settings = check_settings_env(env, "ccrk-probe")
    assert settings.probe_set is not None
    assert mount_of(cron, container, settings.probe_set.as_posix()) == ("ccrk-catalogue", True)
    # API pods run no probes of their own (N replicas would store N runs): no probe set for them.
    _, api_container = api()
    assert "CCRK_PROBE_SET" not in full_env(api_container)
    redis = urlsplit(settings.redis_url or "")
    redis_service = k8s_find("Service", redis.hostname or "")
    assert redis.port in [p["port"] for p in redis_service["spec"]["ports"]]
    redis_set = k8s_find("StatefulSet", redis.hostname or "")
    assert (
        redis_service["spec"]["selector"].items()
        <= redis_set["spec"]["template"]["metadata"]["labels"].items()
    )


def one_off_jobs() -> list[dict[str, Any]]:
    """deploy/k8s/jobs/: Jobs created by hand (`kubectl create -f`), outside the kustomization."""
    return [yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted((K8S_DIR / "jobs").glob("*.yaml"))]


def test_one_off_jobs_are_valid_and_act_on_the_served_index() -> None:
    jobs = one_off_jobs()
    assert [job["metadata"]["generateName"] for job in jobs] == ["ccrk-index-rollback-"]
    _, api_container = api()
    api_settings = check_settings_env(full_env(api_container), "ccrk-api")
    claims = {doc["metadata"]["name"] for _, doc in k8s_documents() if doc["kind"] == "PersistentVolumeClaim"}
    for job in jobs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(job, version, strict=True)
        (container,) = pod_spec(job)["containers"]
        # Not rewritten by kustomize: the same image repository, with its tag spelled out.
        assert container["image"].split(":")[0] == IMAGE
        env = full_env(container)
        settings = check_settings_env(env, job["metadata"]["generateName"])
        assert (settings.index_root, settings.index_name) == (
            api_settings.index_root,
            api_settings.index_name,
        )
        calls = ccrk_calls(container_argv(container), env)
        for call in calls:
            check_ccrk(call)
        assert calls[0][:2] == ["index", "rollback"]
        assert mount_of(job, container, settings.index_root.as_posix()) == ("ccrk-indexes", False)
        assert all(
            v["persistentVolumeClaim"]["claimName"] in claims
            for v in pod_spec(job)["volumes"]
            if "persistentVolumeClaim" in v
        )


def postgres() -> tuple[dict[str, Any], dict[str, Any]]:
    doc = k8s_find("StatefulSet", POSTGRES)
    (container,) = pod_spec(doc)["containers"]
    return doc, container


def env_entry(container: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [e for e in container.get("env", []) if e["name"] == name]
    return entry


def secret_command(path: Path) -> tuple[list[str], dict[str, str]]:
    """The documented `kubectl create secret generic ccrk-postgres` (continued lines joined, `$PASSWORD`
    as the line before it sets it: hex), as (argv, its --from-literal key -> value)."""
    text = path.read_text(encoding="utf-8")
    lines = [re.sub(r"^\s*#?\s*", "", line) for line in text.splitlines()]
    sets = [line for line in lines if line.startswith("PASSWORD=$(openssl rand -hex 24)")]
    assert sets, f"{path.name}: no URL-safe password set before the command"
    (start,) = [i for i, line in enumerate(lines) if "create secret generic " + POSTGRES in line]
    command = lines[start]
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + lines[start]
    argv = shlex.split(command.replace("$PASSWORD", "0a1b2c3d"))
    literals = dict(a.removeprefix("--from-literal=").split("=", 1) for a in argv if "--from-literal=" in a)
    return argv, literals


def test_postgres_statefulset_and_service_match() -> None:
    doc, container = postgres()
    labels = doc["spec"]["template"]["metadata"]["labels"]
    service = k8s_find("Service", POSTGRES)
    assert doc["spec"]["serviceName"] == POSTGRES and doc["spec"]["replicas"] == 1
    assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["port"] == 5432 and ports[port["targetPort"]] == 5432
    assert container["image"] == "postgres:17-alpine"
    # The password from the operator's Secret; not optional: the image cannot create its database without.
    ref = env_entry(container, "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": POSTGRES, "key": "password"}
    # The database in a folder inside the claim (initdb wants an empty folder of its own, mode 0700).
    (claim,) = doc["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["name"]: PurePosixPath(m["mountPath"]) for m in container["volumeMounts"]}
    pgdata = PurePosixPath(env_entry(container, "PGDATA")["value"])
    assert mounts[claim["metadata"]["name"]] in pgdata.parents
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]


def test_postgres_is_ready_once_it_serves_over_tcp() -> None:
    _, container = postgres()
    user = env_entry(container, "POSTGRES_USER")["value"]
    db = env_entry(container, "POSTGRES_DB")["value"]
    for probe in ("readinessProbe", "startupProbe"):
        command = container[probe]["exec"]["command"]
        assert command[0] == "pg_isready", probe
        flags = dict(zip(command[1::2], command[2::2], strict=True))
        # TCP, not the socket: the image's first-start set-up server listens on the socket only.
        assert flags == {"-h": "127.0.0.1", "-p": "5432", "-U": user, "-d": db}, probe
    assert container["livenessProbe"]["tcpSocket"]["port"] in {p["name"] for p in container["ports"]}


def test_postgres_runs_as_its_own_user_without_root_on_a_read_only_root() -> None:
    doc, container = postgres()
    pod = pod_spec(doc)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == pod["runAsGroup"] == pod["fsGroup"] == POSTGRES_UID
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    # What the server writes outside its data folder: its socket and lock file, the entrypoint's scripts.
    for path in ("/var/run/postgresql", "/tmp"):
        held = mount_of(doc, container, path)
        assert held is not None and held[1] is False, f"{path} is not writable"
        (volume,) = [v for v in pod_spec(doc)["volumes"] if v["name"] == held[0]]
        assert "emptyDir" in volume, path


def test_api_change_log_address_comes_from_the_postgres_secret() -> None:
    api_doc, container = api()
    assert "CCRK_LIVE_DSN" in env_names()
    ref = env_entry(container, "CCRK_LIVE_DSN")["valueFrom"]["secretKeyRef"]
    # Optional, as ccrk-admin: without it searches still answer (writes get 503: the index volume is
    # mounted read-only, so no SQLite log can be written beside it).
    assert ref == {"name": POSTGRES, "key": "dsn", "optional": True}
    assert "CCRK_LIVE_DSN" not in container_env(container), "a password has no place in the ConfigMap"
    index_root = check_settings_env(full_env(container), "ccrk-api").index_root.as_posix()
    assert mount_of(api_doc, container, index_root) == ("ccrk-indexes", True)
    # The documented Secret gives the address of the Service, as the user and database postgres creates.
    _, db = postgres()
    argv, literals = secret_command(K8S_DIR / "postgres.yaml")
    assert argv[:6] == ["kubectl", "-n", "ccrk-search", "create", "secret", "generic"]
    assert set(literals) == {"password", "dsn"}
    settings = check_settings_env({**full_env(container), "CCRK_LIVE_DSN": literals["dsn"]}, "dsn")
    dsn = psycopg.conninfo.conninfo_to_dict(settings.live_dsn)
    service = k8s_find("Service", POSTGRES)
    assert dsn["host"] == service["metadata"]["name"]
    assert int(dsn["port"]) in [p["port"] for p in service["spec"]["ports"]]
    assert (dsn["user"], dsn["dbname"], dsn["password"]) == (
        env_entry(db, "POSTGRES_USER")["value"],
        env_entry(db, "POSTGRES_DB")["value"],
        literals["password"],
    )
    # The deployment guide shows the same command.
    assert secret_command(REPO / "deploy" / "README.md") == (argv, literals)
