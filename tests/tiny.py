"""The tiny CCRk configuration the tests build models from (seconds to build and run on a CPU)."""

from model.configs import CCRkConfig, TextConfig, VisionConfig


def tiny_config(
    *,
    width: int = 32,
    depths: tuple[int, int] = (1, 1),
    vocab_size: int = 600,
    max_length: int = 32,
    pooling: str = "cls",
    name: str = "tiny",
) -> CCRkConfig:
    """A 2-stage Swin whose output width (``width``) equals the text hidden size, as in the paper's
    Swin-B/XLM-R-large pairing, so ``vision_to_text`` is an Identity; 1 text + 1 fusion layer."""
    return CCRkConfig(
        name=name,
        vision=VisionConfig(
            backbone="swin_tiny_patch4_window7_224",
            image_size=32,
            backbone_kwargs={
                "embed_dim": width // 2,
                "depths": depths,
                "num_heads": (2, 4),
                "window_size": 4,
            },
            mean=(0.5, 0.5, 0.5),
            std=(0.25, 0.25, 0.25),
        ),
        text=TextConfig(
            vocab_size=vocab_size,
            hidden_size=width,
            num_attention_heads=2,
            intermediate_size=2 * width,
            num_text_layers=1,
            num_fusion_layers=1,
            max_position_embeddings=max_length + 8,
            max_length=max_length,
            pooling=pooling,
        ),
        embed_dim=width // 2,
    )
