"""deploy/k8s/ray: the KubeRay RayService (ray.io/v1), parsed (no cluster, no operator here).

No OpenAPI schema of KubeRay's CRDs could be had offline: none ships in a PyPI, npm or Debian package (the
KubeRay CRDs live in its Helm chart and Go module, neither reachable here). So the manifest is validated in
parts instead of against the CRD:
- every pod template (head and each worker group) strictly as a Kubernetes PodTemplateSpec, and the
  object's metadata strictly as ObjectMeta, with kubernetes-validate against the Kubernetes API schemas;
- serveConfigV2 (parsed YAML) against Ray's own ``ServeDeploySchema``, and equal to deploy/ray/serve.yaml,
  which test_ray_config.py checks in depth;
- the keys of the RayService spec, its rayClusterConfig, head group and worker groups against explicit
  allow-lists of KubeRay v1 field names written from KubeRay's API types (ray-operator/apis/ray/v1,
  rayservice_types.go and raycluster_types.go, KubeRay 1.3 to 1.5), with the fields those types require and
  the value types they take (rayStartParams: strings only).
Then the cross-checks: `ray start` parameters against container resources and the Serve replicas they must
hold, the Ray version and the image against constraints.txt and Dockerfile.ray, the fast-path environment
on every Ray container, the shared volumes at the same paths, settings, and KubeRay's own probes.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ccrk_settings import Settings, settings_with
from tests.deploy.deployment import (
    K8S_DIR,
    K8S_RAY_DIR,
    K8S_VERSIONS,
    RAY_DOCKERFILE,
    REPO,
    check_settings_env,
    constraint_pins,
    container_env,
    copies,
    dockerfile_stages,
    k8s_documents,
    k8s_find,
    pod_spec,
    ray_serve_config,
)

# Ray's own schema module declares its fields in a way pydantic 2 deprecates (not this project's code).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.serve._private.config")

# KubeRay ray.io/v1 field names (rayservice_types.go, raycluster_types.go). Status fields are left out: a
# manifest never sets them.
RAYSERVICE_SPEC_FIELDS = {
    "serveConfigV2",
    "rayClusterConfig",
    "serveService",
    "upgradeStrategy",
    "excludeHeadPodFromServeSvc",
    "rayClusterDeletionDelaySeconds",
    "serviceUnhealthySecondThreshold",  # deprecated, unused
    "deploymentUnhealthySecondThreshold",  # deprecated, unused
}
RAYCLUSTER_SPEC_FIELDS = {
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
}
HEAD_GROUP_FIELDS = {"template", "rayStartParams", "serviceType", "headService", "enableIngress"}
WORKER_GROUP_FIELDS = {
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "idleTimeoutSeconds",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "suspend",
}
# Required by the types (no omitempty).
RAYCLUSTER_REQUIRED = {"headGroupSpec"}
HEAD_GROUP_REQUIRED = {"template", "rayStartParams"}
WORKER_GROUP_REQUIRED = {"groupName", "template", "rayStartParams", "minReplicas", "maxReplicas"}
# The largest shard count the workers are sized for (the manifest's comment says so).
SIZED_FOR_SHARDS = 8


def ray_documents() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((K8S_RAY_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S_RAY_DIR / name).read_text(encoding="utf-8")):
            if doc:
                docs.append((name, doc))
    return docs


def rayservice() -> dict[str, Any]:
    (doc,) = [doc for _, doc in ray_documents() if doc["kind"] == "RayService"]
    return doc


def groups() -> list[tuple[str, dict[str, Any]]]:
    """("head" | "worker", group spec) for the head group and every worker group."""
    cluster = rayservice()["spec"]["rayClusterConfig"]
    return [("head", cluster["headGroupSpec"])] + [("worker", g) for g in cluster["workerGroupSpecs"]]


def ray_container(group: dict[str, Any]) -> dict[str, Any]:
    """The Ray container: KubeRay runs `ray start` in the first container of the pod template."""
    return group["template"]["spec"]["containers"][0]


def serve_config() -> dict[str, Any]:
    return yaml.safe_load(rayservice()["spec"]["serveConfigV2"])


def serve_settings() -> Settings:
    (app,) = serve_config()["applications"]
    return settings_with(
        app["args"], base=check_settings_env(app["runtime_env"]["env_vars"], "serveConfigV2")
    )


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity as a number: CPUs ("6", "500m") or bytes ("12Gi", "4G")."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    units |= {"Ti": 2**40}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, value
    return float(match.group(1)) * (units[match.group(2)] if match.group(2) else 1)


def mount_of(template: dict[str, Any], path: str) -> tuple[str, str, bool] | None:
    """(claim, mount path, read-only) of the PVC mount holding PATH in a pod template's Ray container."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    target = PurePosixPath(path)
    for m in template["spec"]["containers"][0].get("volumeMounts", []):
        root = PurePosixPath(m["mountPath"])
        if (target == root or root in target.parents) and "persistentVolumeClaim" in volumes[m["name"]]:
            claim = volumes[m["name"]]["persistentVolumeClaim"]["claimName"]
            return claim, m["mountPath"], bool(m.get("readOnly", False))
    return None


def test_kustomization_is_its_own_and_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_RAY_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    on_disk = {p.name for p in K8S_RAY_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk == {"rayservice.yaml"}
    main = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    assert not any(r.startswith("ray") for r in main["resources"]), "an alternative, not part of deploy/k8s"
    # The namespace and labels of deploy/k8s, whose volumes, ConfigMap and index it uses.
    assert kustomization["namespace"] == main["namespace"]
    assert kustomization["labels"] == main["labels"]
    assert [i["name"] for i in kustomization["images"]] == [i["name"] for i in main["images"]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_pod_templates_and_metadata_are_valid_kubernetes_objects(version: str) -> None:
    doc = rayservice()
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    checks = [({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, "metadata")]
    for kind, group in groups():
        name = group.get("groupName", "head")
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name},
            "template": group["template"],
        }
        checks.append((wrapped, f"{kind} group {name}: template"))
    for obj, where in checks:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"RayService {where}: {exc.message}") from None


def test_pod_template_check_is_strict() -> None:
    template = groups()[0][1]["template"]
    bad = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}
    bad = yaml.safe_load(yaml.safe_dump(bad))
    bad["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_spec_fields_are_kuberay_v1_fields_of_the_right_types() -> None:
    spec = rayservice()["spec"]
    assert set(spec) <= RAYSERVICE_SPEC_FIELDS, set(spec) - RAYSERVICE_SPEC_FIELDS
    assert isinstance(spec["serveConfigV2"], str), "serveConfigV2 is a YAML string, not a mapping"
    cluster = spec["rayClusterConfig"]
    assert RAYCLUSTER_REQUIRED <= set(cluster) <= RAYCLUSTER_SPEC_FIELDS, (
        set(cluster) - RAYCLUSTER_SPEC_FIELDS
    )
    assert isinstance(cluster["rayVersion"], str)
    assert isinstance(cluster.get("enableInTreeAutoscaling", False), bool)
    head = cluster["headGroupSpec"]
    assert HEAD_GROUP_REQUIRED <= set(head) <= HEAD_GROUP_FIELDS, set(head) ^ HEAD_GROUP_REQUIRED
    workers = cluster["workerGroupSpecs"]
    assert workers, "a worker group: the replicas run there"
    assert len({w["groupName"] for w in workers}) == len(workers)
    for worker in workers:
        assert WORKER_GROUP_REQUIRED <= set(worker) <= WORKER_GROUP_FIELDS, (
            set(worker) ^ WORKER_GROUP_REQUIRED
        )
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", worker["groupName"])
        counts = [worker["minReplicas"], worker["replicas"], worker["maxReplicas"]]
        assert all(isinstance(n, int) for n in counts) and 0 <= counts[0] <= counts[1] <= counts[2], counts
    for _, group in groups():
        params = group["rayStartParams"]
        # map[string]string: a YAML number here is refused by the API server.
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()), params
        assert not {"address", "block", "head"} & set(params), "KubeRay sets these itself"


def test_serve_config_is_deploy_ray_serve_yaml() -> None:
    """One application, two places: serveConfigV2 is deploy/ray/serve.yaml (its comments aside)."""
    from ray.serve.schema import ServeDeploySchema

    assert serve_config() == ray_serve_config()
    ServeDeploySchema.model_validate(serve_config())


def test_ray_version_and_image_are_the_pinned_ray() -> None:
    pinned = constraint_pins()["ray"]
    cluster = rayservice()["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == pinned
    kustomization = yaml.safe_load((K8S_RAY_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    (image,) = kustomization["images"]
    built = f"{image['newName']}:{image['newTag']}"
    assert image["newTag"].endswith(f"ray-{pinned}")
    # The tag Dockerfile.ray's build line gives the image, which installs that Ray.
    (tag,) = re.findall(
        r"docker build -f Dockerfile.ray -t (\S+) \.$", (REPO / RAY_DOCKERFILE).read_text(), re.M
    )
    assert tag == built
    for _, group in groups():
        for container in group["template"]["spec"]["containers"]:
            # Valid without kustomize too; kustomize's `images` rewrites it (matched by name).
            assert container["image"] == built, container["name"]


def test_every_ray_container_starts_with_the_fast_path_environment() -> None:
    from service.cluster.serving import FAST_PATH_ENV

    for kind, group in groups():
        env = {e["name"]: e.get("value") for e in ray_container(group).get("env", [])}
        assert {k: env.get(k) for k in FAST_PATH_ENV} == FAST_PATH_ENV, kind


def test_every_ray_container_reads_the_change_log_address_from_the_postgres_secret() -> None:
    """Writes through Ray Serve go to the PostgreSQL log the API pods share; its address is never plain
    text in the spec (not in the Serve config's runtime_env either)."""
    (app,) = serve_config()["applications"]
    assert "CCRK_LIVE_DSN" not in app["runtime_env"]["env_vars"]
    for kind, group in groups():
        (entry,) = [e for e in ray_container(group).get("env", []) if e["name"] == "CCRK_LIVE_DSN"]
        assert entry == {
            "name": "CCRK_LIVE_DSN",
            "valueFrom": {"secretKeyRef": {"name": "ccrk-postgres", "key": "dsn", "optional": True}},
        }, kind


def test_ray_start_params_agree_with_container_resources_and_hold_the_replicas() -> None:
    settings = serve_settings()
    worker_cpus = []
    for kind, group in groups():
        resources = ray_container(group)["resources"]
        for key in ("cpu", "memory"):
            # Guaranteed: KubeRay derives `ray start --num-cpus/--memory` from the limits.
            assert quantity(resources["requests"][key]) == quantity(resources["limits"][key]), (kind, key)
        params = group["rayStartParams"]
        num_cpus = float(params["num-cpus"])
        limit = quantity(resources["limits"]["cpu"])
        if "memory" in params:
            assert float(params["memory"]) <= quantity(resources["limits"]["memory"])
        if kind == "head":
            # Ray's control processes and a proxy; no replicas: the workers hold them all.
            assert num_cpus == 0 and limit >= 1
        else:
            assert num_cpus == limit, "what Ray hands out is what the container has"
            worker_cpus.append((num_cpus, group["replicas"], group["minReplicas"]))
    (cpus, replicas, min_replicas) = worker_cpus[0]
    assert len(worker_cpus) == 1
    # A shard's replicas go to different nodes (max_replicas_per_node): enough workers for all of them.
    assert settings.ray_max_replicas_per_node == 1
    assert min(replicas, min_replicas) >= settings.ray_shard_replicas
    # Each worker holds one replica of every shard and, spread, its share of the ingress replicas.
    ingress_per_node = -(-settings.ray_ingress_replicas // replicas)
    per_node = ingress_per_node * settings.ray_ingress_cpus + SIZED_FOR_SHARDS * settings.ray_shard_cpus
    assert per_node <= cpus, f"{per_node} CPUs of replicas per worker, {cpus} there"
    total = settings.ray_ingress_replicas * settings.ray_ingress_cpus + (
        SIZED_FOR_SHARDS * settings.ray_shard_replicas * settings.ray_shard_cpus
    )
    assert total <= replicas * cpus
    assert f"up to {SIZED_FOR_SHARDS} shards" in (K8S_RAY_DIR / "rayservice.yaml").read_text(encoding="utf-8")


def test_probes_are_kuberays_and_the_serve_port_is_the_configs() -> None:
    """No probes here: KubeRay injects its own (raylet and GCS health; on workers also the Serve proxy's
    /-/healthz on the container port named `serve`), which run wget and grep in the image."""
    http = serve_config()["http_options"]
    for kind, group in groups():
        container = ray_container(group)
        assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container), kind
        assert "command" not in container and "args" not in container, "KubeRay's `ray start` command"
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert ports.get("serve") == http["port"], kind
        if kind == "head":
            assert ports["gcs-server"] == int(group["rayStartParams"].get("port", "6379"))
            assert ports["dashboard"] == 8265 and group["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    assert any(re.search(r"apt-get install .*\bwget\b", run) for run in stage.values("RUN"))


def test_index_and_models_are_at_the_same_paths_on_every_ray_pod() -> None:
    settings = serve_settings()
    claims = {
        doc["metadata"]["name"]: doc for _, doc in k8s_documents() if doc["kind"] == "PersistentVolumeClaim"
    }
    held = set()
    for kind, group in groups():
        template = group["template"]
        index = mount_of(template, settings.index_root.as_posix())
        assert index is not None, f"{kind}: no volume at the index root"
        held.add(index)
        for path in ("/var/lib/ccrk/data",):  # catalogue images: their absolute paths are in the index
            assert mount_of(template, path) is not None, (kind, path)
        for volume in template["spec"]["volumes"]:
            if "persistentVolumeClaim" in volume:
                claim = claims[volume["persistentVolumeClaim"]["claimName"]]
                assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "mounted by pods on many nodes"
        assert any(m["mountPath"] == "/tmp" for m in ray_container(group)["volumeMounts"]), (
            "Ray's session folder"
        )
    assert held == {("ccrk-indexes", settings.index_root.as_posix(), True)}, "one claim, one path, read-only"
    # The model is the image's own (same image, same path on every node): where Dockerfile copies it.
    final = dockerfile_stages(REPO / "Dockerfile")[-1]
    assert any(copy.dest.as_posix() == settings.model_dir.as_posix() for copy in copies(final))
    # It serves what deploy/k8s publishes: the API's index root and name.
    api = k8s_find("Deployment", "ccrk-api")
    (api_container,) = pod_spec(api)["containers"]
    api_settings = check_settings_env({**final.env(), **container_env(api_container)}, "ccrk-api")
    assert (settings.index_root, settings.index_name) == (api_settings.index_root, api_settings.index_name)


def test_environment_is_settings_and_pods_run_as_the_image_user() -> None:
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    uid = int(stage.values("USER")[-1].split(":")[0])
    image_env = dockerfile_stages(REPO / "Dockerfile")[-1].env()
    (app,) = serve_config()["applications"]
    for kind, group in groups():
        container = ray_container(group)
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        # What a replica reads: the image's ENV, the container's, then the application's runtime_env.
        check_settings_env({**image_env, **env, **app["runtime_env"]["env_vars"]}, f"{kind} Ray container")
        pod = group["template"]["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == uid, kind
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
