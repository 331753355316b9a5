"""Architecture, typed outputs, checkpoint round trip and presets, on tiny configs."""

import json
from pathlib import Path

import pytest
import torch

from model.configs import CCRkConfig, ConfigError, get_preset, list_presets
from model.modeling import CCRkModel, CheckpointError, FusionOutput, ImageEncoderOutput, TextEncoderOutput
from model.tokenization import load_tokenizer, train_tokenizer


def inputs(cfg: CCRkConfig, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(batch, 3, cfg.vision.image_size, cfg.vision.image_size, generator=gen)
    ids = torch.randint(5, cfg.text.vocab_size, (batch, 9), generator=gen)
    ids[:, 0], ids[:, -1] = 0, 2
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    ids[0, 5:] = cfg.text.pad_token_id
    return pixels, ids, mask


def test_shapes_and_typed_outputs(tiny) -> None:
    model = CCRkModel(tiny).eval()
    pixels, ids, mask = inputs(tiny)
    image = model.encode_image(pixels)
    assert isinstance(image, ImageEncoderOutput)
    # Swin 32 px, patch 4, 2 stages -> 4 x 4 patches after merging, plus the pooled token.
    assert image.image_tokens.shape == (3, 1 + 16, 32)
    assert image.image_embeds.shape == (3, 16)
    assert torch.allclose(image.image_embeds.norm(dim=-1), torch.ones(3))
    text = model.encode_text(ids, mask)
    assert isinstance(text, TextEncoderOutput)
    assert text.last_hidden_state.shape == (3, 9, 32)
    assert torch.allclose(text.text_embeds.norm(dim=-1), torch.ones(3))
    fused = model.fuse(text.last_hidden_state, mask, image.image_tokens)
    assert isinstance(fused, FusionOutput) and fused.itm_logits.shape == (3, 2)
    assert model.mlm_logits(fused.last_hidden_state).shape == (3, 9, 600)


def test_fusion_layers_have_cross_attention_and_text_layers_do_not(tiny) -> None:
    model = CCRkModel(tiny)
    layers = model.text_encoder.encoder.layer
    assert not hasattr(layers[0], "crossattention") and hasattr(layers[1], "crossattention")
    # Bidirectional self-attention in the fusion encoder despite transformers' "decoder" flag.
    assert layers[1].attention.self.is_causal is False


def test_padding_does_not_change_embeddings(tiny) -> None:
    model = CCRkModel(tiny).eval()
    pixels, ids, mask = inputs(tiny)
    with torch.no_grad():
        padded = model.encode_text(ids, mask).text_embeds[0]
        trimmed = model.encode_text(ids[:1, :5], mask[:1, :5]).text_embeds[0]
        image_tokens = model.encode_image(pixels[:1]).image_tokens
        states = model.encode_text(ids[:1], mask[:1]).last_hidden_state
        fused_padded = model.fuse(states, mask[:1], image_tokens).itm_logits
        fused_trimmed = model.fuse(states[:, :5], mask[:1, :5], image_tokens).itm_logits
    assert torch.allclose(padded, trimmed, atol=1e-6)
    assert torch.allclose(fused_padded, fused_trimmed, atol=1e-5)


def test_text_embedding_depends_on_later_tokens(tiny) -> None:
    """The text encoder is bidirectional: the first-token embedding sees the whole caption."""
    model = CCRkModel(tiny).eval()
    _, ids, mask = inputs(tiny)
    changed = ids.clone()
    changed[1, 6] = 7 if ids[1, 6] != 7 else 8
    with torch.no_grad():
        a = model.encode_text(ids, mask).text_embeds[1]
        b = model.encode_text(changed, mask).text_embeds[1]
    assert not torch.allclose(a, b)


def test_temperature_init_and_clamp(tiny) -> None:
    model = CCRkModel(tiny)
    assert model.temperature.item() == pytest.approx(0.07)
    with torch.no_grad():
        model.temp.fill_(5.0)
    assert model.temperature.item() == pytest.approx(0.5)


def test_save_and_load_round_trip(tiny, tmp_path: Path) -> None:
    model = CCRkModel(tiny).eval()
    tokenizer = train_tokenizer(["red mug", "rote Tasse", "赤いマグ"] * 5, 300, 32)
    model.save_pretrained(tmp_path, tokenizer)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    loaded = CCRkModel.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # Tied weights stay tied after loading.
    assert (
        loaded.mlm_head.decoder.weight.data_ptr()
        == loaded.text_encoder.embeddings.word_embeddings.weight.data_ptr()
    )
    pixels, ids, mask = inputs(tiny)
    with torch.no_grad():
        assert torch.equal(model.encode_image(pixels).image_embeds, loaded.encode_image(pixels).image_embeds)
        assert torch.equal(
            model.encode_text(ids, mask).text_embeds, loaded.encode_text(ids, mask).text_embeds
        )
    assert load_tokenizer(tmp_path)("rote Tasse")["input_ids"] == tokenizer("rote Tasse")["input_ids"]


def test_from_pretrained_errors_name_the_problem(tiny, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json is missing"):
        CCRkModel.from_pretrained(tmp_path)
    CCRkModel(tiny).save_pretrained(tmp_path)
    other = tiny.to_dict()
    other["text"]["num_fusion_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(other))
    with pytest.raises(CheckpointError, match="do not fit"):
        CCRkModel.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot load weights"):
        CCRkModel.from_pretrained(tmp_path)


def test_config_json_round_trip_and_validation(tiny, tmp_path: Path) -> None:
    tiny.save(tmp_path / "c.json")
    assert CCRkConfig.load(tmp_path / "c.json") == tiny
    data = tiny.to_dict()
    data["vision"]["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        CCRkConfig.from_dict(data)
    data = tiny.to_dict()
    data["text"]["max_length"] = 1000
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        CCRkConfig.from_dict(data)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        CCRkConfig.load(tmp_path / "bad.json")


def test_presets() -> None:
    assert {"demo", "ccrk-paper"} <= set(list_presets())
    paper = get_preset("ccrk-paper")
    assert paper.vision.backbone == "swin_base_patch4_window12_384" and paper.vision.image_size == 384
    assert (
        paper.text.hidden_size == 1024
        and paper.text.num_text_layers == 6
        and paper.text.num_fusion_layers == 6
    )
    assert paper.embed_dim == 256 and paper.temperature_init == 0.07
    with pytest.raises(ConfigError, match="unknown model preset"):
        get_preset("nope")


def test_paper_shape_builds_on_meta_device() -> None:
    """The paper's architecture, without allocating its ~0.5 B parameters."""
    with torch.device("meta"):
        model = CCRkModel(get_preset("ccrk-paper"))
    assert model.vision_encoder.width == 1024  # Swin-B, so image tokens feed cross-attention directly
    assert isinstance(model.vision_to_text, torch.nn.Identity)
    assert len(model.text_encoder.encoder.layer) == 12
    assert sum(hasattr(layer, "crossattention") for layer in model.text_encoder.encoder.layer) == 6
    assert model.vision_encoder.backbone.layers[0].blocks[0].attn.window_size == (12, 12)


def test_demo_preset_is_small() -> None:
    model = CCRkModel(get_preset("demo"))
    params = sum(p.numel() for p in model.parameters())
    assert params < 5_000_000  # fits the 20 MB budget of the shipped model in fp32


@pytest.mark.parametrize(
    ("backbone", "kwargs", "patches"),
    [
        # ViT: prefix (class) tokens are dropped, the rest are patch tokens.
        ("vit_tiny_patch16_224", {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}, 16),
        # A CNN: NCHW feature maps become tokens; it takes no img_size.
        ("resnet10t", {}, 1),
    ],
)
def test_other_timm_backbones(tiny, backbone: str, kwargs: dict, patches: int) -> None:
    tiny.vision.backbone = backbone
    tiny.vision.backbone_kwargs = kwargs
    model = CCRkModel(tiny).eval()
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model.encode_image(pixels)
        ids = torch.tensor([[0, 10, 11, 2]] * 2)
        text = model.encode_text(ids, torch.ones_like(ids))
        logits = model.fuse(text.last_hidden_state, torch.ones_like(ids), out.image_tokens).itm_logits
    assert out.image_tokens.shape == (2, 1 + patches, model.vision_encoder.width)
    assert out.image_embeds.shape == (2, 16) and logits.shape == (2, 2)
    # A backbone narrower or wider than the text stack is projected for cross-attention.
    assert isinstance(model.vision_to_text, torch.nn.Linear) == (model.vision_encoder.width != 32)
