"""`make demo`, read through `make -n` (nothing runs): it installs, draws the demo catalogue and its probe
set, builds the index once, then serves that index on 127.0.0.1:8000; every command parses."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.deploy.deployment import REPO, check_ccrk, check_settings_env, make_dry_run


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
