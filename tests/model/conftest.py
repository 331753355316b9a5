"""Tiny model configurations shared by the model tests."""

import pytest

from model.configs import CCRkConfig, TextConfig, VisionConfig


def tiny_config() -> CCRkConfig:
    """A few-thousand-parameter CCRk: Swin with 2 stages, 1 text + 1 fusion layer."""
    return CCRkConfig(
        name="tiny",
        vision=VisionConfig(
            backbone="swin_tiny_patch4_window7_224",
            image_size=32,
            backbone_kwargs={"embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2), "window_size": 4},
            mean=(0.5, 0.5, 0.5),
            std=(0.25, 0.25, 0.25),
        ),
        text=TextConfig(
            vocab_size=600,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            num_text_layers=1,
            num_fusion_layers=1,
            max_position_embeddings=40,
            max_length=32,
        ),
        embed_dim=16,
    )


@pytest.fixture
def tiny() -> CCRkConfig:
    return tiny_config()


@pytest.fixture(scope="session")
def small_catalogue(tmp_path_factory: pytest.TempPathFactory):
    """A small synthetic catalogue on disk, shared by the training and evaluation tests."""
    from model.data.synth import SynthConfig, generate_catalogue

    out = tmp_path_factory.mktemp("catalogue")
    generate_catalogue(out, SynthConfig(seed=0, n_train=960, n_val=64, n_test=100), workers=1)
    return out
