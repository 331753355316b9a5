"""How `make test` shares the machine between its two xdist workers (tests/conftest.py), on a small suite of
sleeping tests run in a real ``pytest -n 2``: files stay on one worker, the Ray and training tests form one
group that starts first, and an ``exclusive`` test overlaps no other test."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

RECORDING_TEST = """
import json, os, time
from pathlib import Path

import pytest


def _record(name: str, seconds: float) -> None:
    start = time.monotonic()
    time.sleep(seconds)
    worker = os.environ["PYTEST_XDIST_WORKER"]
    line = {{"test": name, "worker": worker, "start": start, "end": time.monotonic()}}
    with open(Path(__file__).parents[2] / "runs.jsonl", "a") as runs:
        runs.write(json.dumps(line) + "\\n")

{marks}
{tests}
"""


def _module(stem: str, count: int, seconds: float, marks: str = "", exclusive: int | None = None) -> str:
    tests = []
    for n in range(count):
        mark = "@pytest.mark.exclusive\n" if n == exclusive else ""
        tests.append(f"{mark}def test_{stem}_{n}() -> None:\n    _record('{stem}_{n}', {seconds})\n")
    return RECORDING_TEST.format(marks=marks, tests="\n\n".join(tests))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    suite = tmp_path_factory.mktemp("suite")
    tests = suite / "tests"
    for package in ("indexer", "model", "service"):
        (tests / package).mkdir(parents=True)
    shutil.copy(CONFTEST, tests / "conftest.py")
    shutil.copy(CONFTEST.with_name("artifacts_guard.py"), tests / "artifacts_guard.py")  # conftest imports it
    (suite / "pytest.ini").write_text(
        "[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib\n"
        "markers =\n    ray: r\n    slow: s\n    exclusive: e\n"
    )
    # The ordinary files come first in collection: the heavy ones must still be queued first.
    (tests / "indexer" / "test_a_plain.py").write_text(_module("plain", 10, 0.25))
    (tests / "indexer" / "test_b_mixed.py").write_text(_module("mixed", 3, 0.1, exclusive=1))
    # Two files with more tests than the heavy ones: xdist's default queue (largest first) puts them first.
    (tests / "indexer" / "test_c_more.py").write_text(_module("more", 6, 0.05))
    ray_marked = _module("cluster", 2, 0.2, marks="pytestmark = pytest.mark.ray")
    (tests / "indexer" / "test_ray_build.py").write_text(ray_marked)
    (tests / "model" / "test_training.py").write_text(
        _module("training", 2, 0.2).replace("def test_training_0", "@pytest.mark.slow\ndef test_training_0")
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "tests"],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (suite / "runs.jsonl").read_text().splitlines()]


def test_every_test_ran_once(runs: list[dict]) -> None:
    assert sorted(run["test"] for run in runs) == sorted(
        [f"plain_{n}" for n in range(10)]
        + [f"mixed_{n}" for n in range(3)]
        + [f"more_{n}" for n in range(6)]
        + ["cluster_0", "cluster_1", "training_0", "training_1"]
    )


def test_a_file_stays_on_one_worker(runs: list[dict]) -> None:
    for stem in ("plain", "mixed", "more"):
        assert len({run["worker"] for run in runs if run["test"].startswith(stem)}) == 1, stem


def test_the_ray_and_training_tests_form_one_group_started_first(runs: list[dict]) -> None:
    heavy = [run for run in runs if run["test"].startswith(("cluster", "training"))]
    (worker,) = {run["worker"] for run in heavy}
    mine = sorted((run for run in runs if run["worker"] == worker), key=lambda run: run["start"])
    assert {run["test"] for run in mine[: len(heavy)]} == {run["test"] for run in heavy}


def test_an_exclusive_test_overlaps_no_other(runs: list[dict]) -> None:
    (alone,) = [run for run in runs if run["test"] == "mixed_1"]
    others = [run for run in runs if run is not alone]
    overlapping = [
        run["test"] for run in others if max(run["start"], alone["start"]) < min(run["end"], alone["end"])
    ]
    assert not overlapping
    # The suite is laid out so that the other worker is busy when it is due: it did wait for it.
    assert any(run["start"] < alone["start"] and run["worker"] != alone["worker"] for run in others)
