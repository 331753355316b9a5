"""`make demo`, read through `make -n` (nothing runs): it installs, draws the demo catalogue and its probe
set, builds the index once, then serves that index on 127.0.0.1:8000; every command parses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ccrk_settings import DEFAULT_MODEL_DIR
from tests.deploy.deployment import REPO, check_ccrk, check_settings_env, make_dry_run
from tests.indexer.files import write_photo


def recipe(target: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment assignments, argv) of each `ccrk` line `make -n -B TARGET` prints."""
    out = []
    for line in make_dry_run(target):
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words and words[0].endswith("/bin/ccrk"):
            out.append((env, words[1:]))
    return out


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_demo_draws_builds_then_serves() -> None:
    lines = make_dry_run("demo")
    # The ray extra too, so that the tests of `--engine ray` always run, and the docs extra, so that the docs
    # tests build the site (`make test` installs the same way).
    installs = [line for line in lines if "pip install" in line and "-e '.[dev,ray,docs]'" in line]
    assert installs, "demo installs first"
    calls = recipe("demo")
    expected = [["data", "synth"], ["probe", "make-set"], ["index", "build"], ["serve"]]
    assert [argv[: len(e)] for (_, argv), e in zip(calls, expected, strict=True)] == expected
    for env, argv in calls:
        check_ccrk(argv)
        check_settings_env(env, f"make demo: {' '.join(argv)}")
    synth, make_set, build, serve = (argv for _, argv in calls)
    catalogue = option(synth, "--out") + "/test.jsonl"
    assert option(make_set, "--catalogue") == catalogue and build[-1] == catalogue
    assert 1000 <= int(option(synth, "--n-test")) <= 2000
    assert (option(serve, "--host"), option(serve, "--port")) == ("127.0.0.1", "8000")
    assert option(serve, "--index-name") == option(build, "--name")
    assert option(serve, "--index-root") == option(build, "--index-root")
    serve_settings = check_settings_env(calls[-1][0], "make demo: serve")
    assert serve_settings.probe_set is not None
    assert serve_settings.probe_set.as_posix() == option(make_set, "--out"), "the dashboard's probes"


def test_demo_index_is_built_once() -> None:
    """The index is a file target on its CURRENT: with CURRENT in place, make has nothing to build."""
    calls = recipe("demo")
    build = calls[2][1]
    current = f"{option(build, '--index-root')}/{option(build, '--name')}/CURRENT"
    database = subprocess.run(
        ["make", "-p", "-n", "demo-index"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    assert re.search(rf"^demo-index: {re.escape(current)}$", database, re.M)
    assert re.search(rf"^{re.escape(current)}: \| install$", database, re.M), "order-only on install"


@pytest.mark.parametrize("folder", ["dir with space", "it's mine/photos", "a  b\tc"])
def test_make_photos_passes_a_folder_name_as_one_argument(folder: str) -> None:
    """`make photos "PHOTOS=dir with space"` failed: the folder (and the index root) went to the shell
    unquoted."""
    printed = subprocess.run(
        ["make", "-n", "-B", "photos", f"PHOTOS={folder}", "INDEX_ROOT=my indexes"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    commands = [
        shlex.split(line) for line in printed.replace("\\\n", " ").splitlines() if "/bin/ccrk " in line
    ]
    build = next(argv for argv in commands if argv[1:3] == ["index", "build"])
    serve = next(argv for argv in commands if argv[1] == "serve")
    assert build[-1] == folder
    assert option(build, "--index-root") == option(serve, "--index-root") == "my indexes"


def test_make_photos_runs_with_a_folder_name_with_spaces_and_a_quote(tmp_path: Path) -> None:
    """`make photos "PHOTOS=dir with space"` run for real through the shell: the index of the folder's photos
    is built and published under an index root with a space, and serve gets both as one argument each.
    ``VENV`` points at a folder whose ``ccrk`` runs the real one, except ``serve`` (it would not return),
    whose arguments it writes down; the demo model stands in for the starter model (no 45-minute build)."""
    photos = tmp_path / "dir with space" / "it's mine"
    for n in range(3):
        write_photo(photos / f"photo {n}.jpg", n)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # newer than pyproject.toml and constraints.txt: nothing to install
    served = tmp_path / "serve.args"
    ccrk = venv / "bin" / "ccrk"
    ccrk.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = serve ]; then printf \'%s\\n\' "$@" > {shlex.quote(str(served))}; exit 0; fi\n'
        f'exec {shlex.quote(str(Path(sys.executable).parent / "ccrk"))} "$@"\n'
    )
    ccrk.chmod(0o755)
    root = tmp_path / "my indexes"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCRK_", "MAKE", "MFLAGS"))}
    env["CCRK_RERANK_POLICY_QUERIES"] = "0"  # the build's re-rank calibration: not what this is about
    done = subprocess.run(
        ["make", "--no-print-directory", "photos", f"VENV={venv}", f"PHOTOS={photos}", f"INDEX_ROOT={root}",
         f"STARTER_MODEL={DEFAULT_MODEL_DIR}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"items indexed\W+3\b", done.stdout), done.stdout  # the folder's 3 photos
    current = (root / "photos" / "CURRENT").read_text().strip()
    assert (root / "photos" / current).is_dir()
    argv = served.read_text().splitlines()
    assert argv[0] == "serve" and option(argv, "--index-root") == str(root)
    assert option(argv, "--index-name") == "photos" and option(argv, "--model") == str(DEFAULT_MODEL_DIR)


def test_gpu_check_installs_the_gpu_stack_into_its_own_venv_never_the_cpu_one() -> None:
    """`make gpu-check` builds .venv-gpu as `make install` builds .venv, swaps every faiss and onnxruntime
    build there for one GPU extra (uninstalled first: two builds of one module overwrite each other's files),
    and leaves .venv, which `make test` and CI use, alone."""
    lines = make_dry_run("gpu-check")
    assert lines[0].startswith("nvidia-smi -L"), "no GPU: stops before installing anything"
    venv_lines = [line for line in lines if ".venv" in line]
    assert venv_lines and all(".venv-gpu" in line for line in venv_lines), venv_lines
    assert not any(re.search(r"(^|\s)\.venv/", line) for line in lines)
    uninstall = next(i for i, line in enumerate(lines) if " uninstall " in line)
    assert lines[uninstall].split()[-6:] == [
        "faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cuvs", "onnxruntime", "onnxruntime-gpu"
    ]  # fmt: skip
    installs = [i for i, line in enumerate(lines) if re.search(r"\.venv-gpu/bin/pip install .*-r ", line)]
    (extra,) = installs
    assert uninstall < extra < next(i for i, line in enumerate(lines) if "bench/gpu_check.py" in line)
    assert "deploy/gpu_extra.py auto" in lines[extra - 1]
    assert any("install VENV=.venv-gpu" in line for line in lines[:uninstall])
