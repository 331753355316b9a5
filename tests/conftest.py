"""Fixtures shared by every test package."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


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
