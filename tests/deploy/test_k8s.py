"""deploy/k8s, parsed (no cluster here): every manifest valid against the Kubernetes API schemas (strict:
unknown fields fail), and the references between them and into the code hold: commands, ports, probe
paths, volumes, settings."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from ccrk_settings import Settings
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
