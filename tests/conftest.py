"""Fixtures shared by every test package, and how the suite shares the machine between xdist workers.

`make test` runs the suite on two pytest-xdist workers: each test file is one unit of work (its module
fixtures are built once, on one worker); the files that start Ray clusters or train for real form one unit,
queued first because it is the longest, so two Ray clusters never run at once. A test marked ``exclusive``
runs while no test runs on the other worker: a shared/exclusive ``flock`` every test takes around its run.
"""

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.artifacts_guard import PATH_EVENTS, artifact_access, listing, listing_change

REPO_ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO_ROOT / "artifacts"  # the checkout's: no test reads or writes it (tests/artifacts_guard.py)
_ARTIFACT_HITS: list[str] = []
_ARTIFACTS_BEFORE = pytest.StashKey[set[str]]()
# The files whose tests start Ray clusters or train for real (markers `ray` and `slow`): one group.
HEAVY_FILES = frozenset(
    {"tests/indexer/test_ray_build.py", "tests/service/test_ray_serving.py", "tests/model/test_training.py"}
)
HEAVY_GROUP = "ray-and-training"


def _test_file(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (item.get_closest_marker("ray") or item.get_closest_marker("slow")) and (
            _test_file(item.nodeid) not in HEAVY_FILES
        ):
            raise pytest.UsageError(f"{item.nodeid} is marked ray or slow: add its file to HEAVY_FILES")
    # The workers' queue follows collection order (``pytest_xdist_make_scheduler``): the longest group first.
    items.sort(key=lambda item: _test_file(item.nodeid) not in HEAVY_FILES)


@pytest.hookimpl(optionalhook=True)  # a plain `pytest` without pytest-xdist still runs
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with a file as the scope, and the heavy files as one scope, queued in
    collection order (not by size: ``--no-loadscope-reorder``), so the heavy one starts first.

    (``--dist loadgroup`` with ``xdist_group`` marks would say it too, but pytest-xdist 3.8 renames the
    items through ``item._nodeid``, which pytest 9 no longer reads: its groups never form.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = _test_file(nodeid)
            return HEAVY_GROUP if file in HEAVY_FILES else file

    return FileScheduling(config, log)


def _watch_artifacts(event: str, args: tuple[object, ...]) -> None:
    if event not in PATH_EVENTS:  # most events: kept cheap
        return
    hit = artifact_access(event, args, ARTIFACTS)
    if hit is not None:
        _ARTIFACT_HITS.append(f"{event} {hit}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist) lists once
        session.config.stash[_ARTIFACTS_BEFORE] = listing(ARTIFACTS)
        _ARTIFACT_HITS.clear()  # the listing's own scandir calls


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_ARTIFACTS_BEFORE, None)
    if before is None:
        return
    changed = listing_change(before, listing(ARTIFACTS))
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(
                f"the suite changed the checkout's {ARTIFACTS} (tests use tmp paths):", red=True
            )
            for line in changed[:20]:
                reporter.write_line(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _leaves_artifacts_alone() -> Iterator[None]:
    """Fails the test in whose run (its fixtures' setup included) anything under ``artifacts/`` was opened,
    listed or changed by this process."""
    yield
    hits, _ARTIFACT_HITS[:] = list(_ARTIFACT_HITS), []
    if hits:
        pytest.fail(f"touched the checkout's {ARTIFACTS} (use tmp paths): {sorted(set(hits))[:10]}")


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_watch_artifacts)  # once per process (hooks cannot be removed)
    if hasattr(config, "workerinput"):
        # A worker's output is not a terminal: sizes inherited from the caller's would mislead the code under
        # test that reads them (rich's consoles).
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


@contextmanager
def _machine_share(item: pytest.Item) -> Iterator[None]:
    """Shared for an ordinary test, exclusive for one marked ``exclusive``; nothing outside xdist workers.

    A turnstile lock in front keeps an exclusive waiter from starving: a worker takes it before its shared
    lock, and the exclusive one holds it while it waits for the other worker's test to end."""
    if not hasattr(item.config, "workerinput"):
        yield
        return
    run_dir = Path(item.config.option.basetemp).parent  # the controller's basetemp, shared by the workers
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(run_dir / "turnstile.lock", "a+") as turnstile, open(run_dir / "machine.lock", "a+") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(machine, fcntl.LOCK_EX)
            yield
            return
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(machine, fcntl.LOCK_SH)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _machine_share(item):
        return (yield)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the checkout (real data no one here wrote); skip where it is absent."""
    path = REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


@pytest.fixture(scope="session")
def starter_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The starter model, built once per session from the installed packages (`ccrk model build-starter`)."""
    from model.starter.build import build_starter

    return build_starter(tmp_path_factory.mktemp("starter") / "ccrk-starter").out
