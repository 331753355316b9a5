"""Tiny model configurations shared by the model tests."""

import pytest

from model.configs import CCRkConfig
from tests.tiny import tiny_config


@pytest.fixture
def tiny() -> CCRkConfig:
    return tiny_config()


@pytest.fixture(scope="session")
def small_catalogue(tmp_path_factory: pytest.TempPathFactory):
    """A small synthetic catalogue on disk, shared by the training and evaluation tests."""
    from synthetic.synth import SynthConfig, generate_catalogue

    out = tmp_path_factory.mktemp("catalogue")
    generate_catalogue(out, SynthConfig(seed=0, n_train=960, n_val=64, n_test=100), workers=1)
    return out
