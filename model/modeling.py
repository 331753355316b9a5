"""The CCRk architecture: a timm image encoder and an XLM-R style text stack whose last layers form the
fusion encoder (cross-attention over image tokens), with projection, ITM and MLM heads.

Parameter names follow the official CCRk/CCLM layout (``vision_encoder``, ``text_encoder.embeddings``,
``text_encoder.encoder.layer.N(.crossattention)``, ``vision_proj``, ``text_proj``, ``temp``, ``itm_head``), so
that official checkpoints load by a thin key mapping (see ``official_checkpoint.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import timm
import torch
import torch.nn.functional as F
from torch import nn
from transformers import XLMRobertaConfig
from transformers.models.xlm_roberta.modeling_xlm_roberta import (
    XLMRobertaEmbeddings,
    XLMRobertaLayer,
    XLMRobertaLMHead,
)

from model.configs import CCRkConfig, ConfigError, TextConfig, VisionConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Bounds of the learnable temperature, as in CCLM/X2VLM, so a runaway step cannot collapse the logits.
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-3, 0.5


class CheckpointError(RuntimeError):
    """A model directory or checkpoint file cannot be read or does not fit the architecture."""


@dataclass
class ImageEncoderOutput:
    """Image tower output.

    Attributes:
        image_tokens: (B, 1 + N, vision_width) the pooled token followed by the N patch tokens; the fusion
            encoder attends over these, and the indexer stores them for re-ranking.
        image_embeds: (B, embed_dim) L2-normalised retrieval embedding.
    """

    image_tokens: torch.Tensor
    image_embeds: torch.Tensor


@dataclass
class TextEncoderOutput:
    """Text tower output.

    Attributes:
        last_hidden_state: (B, L, hidden) output of the text-only layers (input of the fusion encoder).
        attention_mask: (B, L) 1 for real tokens.
        text_embeds: (B, embed_dim) L2-normalised retrieval embedding, pooled as ``TextConfig.pooling``.
    """

    last_hidden_state: torch.Tensor
    attention_mask: torch.Tensor
    text_embeds: torch.Tensor


@dataclass
class FusionOutput:
    """Fusion encoder output.

    Attributes:
        last_hidden_state: (B, L, hidden) text states after cross-attending to the image.
        itm_logits: (B, 2) match head logits; index 1 means "the text describes the image".
    """

    last_hidden_state: torch.Tensor
    itm_logits: torch.Tensor


def _hf_text_config(cfg: TextConfig, num_layers: int, cross_attention: bool) -> XLMRobertaConfig:
    hf = XLMRobertaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps,
        pad_token_id=cfg.pad_token_id,
        # transformers only builds cross-attention into "decoder" layers; causality is switched off below.
        is_decoder=cross_attention,
        add_cross_attention=cross_attention,
    )
    hf._attn_implementation = "sdpa"
    return hf


def _init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, XLMRobertaLMHead):
        nn.init.zeros_(module.bias)


def additive_attention_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, L) 0/1 mask -> (B, 1, 1, L) additive mask for the attention kernels."""
    inverted = 1.0 - mask[:, None, None, :].to(dtype)
    return inverted * torch.finfo(dtype).min


def pool_text_states(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, L, H) text states -> (B, H) as ``TextConfig.pooling`` says: the mean over real tokens, or the
    first token; the input of ``text_proj`` (shared with ``model.acquisition``)."""
    if pooling == "mean":
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    return hidden[:, 0]


class VisionEncoder(nn.Module):
    """Any timm backbone, returning the pooled token followed by the patch tokens."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        kwargs = dict(cfg.backbone_kwargs)
        try:
            self.backbone = timm.create_model(
                cfg.backbone, pretrained=False, num_classes=0, img_size=cfg.image_size, **kwargs
            )
        except TypeError:
            # Convolutional backbones take no img_size; they accept any input size.
            self.backbone = timm.create_model(cfg.backbone, pretrained=False, num_classes=0, **kwargs)
        except RuntimeError as exc:
            raise ConfigError(f"timm cannot build backbone {cfg.backbone!r}: {exc}") from exc
        self.width: int = int(self.backbone.num_features)
        self._prefix_tokens = int(getattr(self.backbone, "num_prefix_tokens", 0))
        self._channels_last = getattr(self.backbone, "output_fmt", "NCHW") == "NHWC"

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.backbone.forward_features(pixel_values)
        if features.ndim == 4:
            if not self._channels_last:
                features = features.permute(0, 2, 3, 1)
            patches = features.flatten(1, 2)
        else:
            patches = features[:, self._prefix_tokens :]
        pooled = patches.mean(dim=1, keepdim=True)
        return torch.cat([pooled, patches], dim=1)


class _LayerStack(nn.Module):
    """Holds ``layer.N`` so parameter names read ``text_encoder.encoder.layer.N`` as in BERT/XLM-R."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)


class TextEncoder(nn.Module):
    """XLM-R embeddings and layers; layers ``[0, num_text_layers)`` encode text, the rest are fusion layers
    with cross-attention over image tokens."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.num_text_layers = cfg.num_text_layers
        text_cfg = _hf_text_config(cfg, cfg.num_text_layers, cross_attention=False)
        fusion_cfg = _hf_text_config(cfg, cfg.num_fusion_layers, cross_attention=True)
        self.embeddings = XLMRobertaEmbeddings(text_cfg)
        layers = [XLMRobertaLayer(text_cfg, layer_idx=i) for i in range(cfg.num_text_layers)]
        for i in range(cfg.num_fusion_layers):
            layer = XLMRobertaLayer(fusion_cfg, layer_idx=cfg.num_text_layers + i)
            layer.attention.self.is_causal = False  # bidirectional text self-attention in the fusion encoder
            layers.append(layer)
        self.encoder = _LayerStack(layers)
        self.hf_config = text_cfg

    def forward_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(input_ids=input_ids)
        mask = additive_attention_mask(attention_mask, hidden.dtype)
        for layer in self.encoder.layer[: self.num_text_layers]:
            hidden = layer(hidden, attention_mask=mask)
        return hidden

    def forward_fusion(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, image_tokens: torch.Tensor
    ) -> torch.Tensor:
        mask = additive_attention_mask(attention_mask, hidden.dtype)
        for layer in self.encoder.layer[self.num_text_layers :]:
            hidden = layer(hidden, attention_mask=mask, encoder_hidden_states=image_tokens)
        return hidden


class CCRkModel(nn.Module):
    """Dual encoder + fusion encoder of CCRk.

    The dual encoder (``encode_image`` / ``encode_text``) produces normalised embeddings for ANN search;
    ``fuse`` scores (text, image) pairs with the ITM head to re-rank a shortlist; ``mlm_logits`` serves CMLM.
    """

    def __init__(self, config: CCRkConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.text.hidden_size
        self.vision_encoder = VisionEncoder(config.vision)
        self.text_encoder = TextEncoder(config.text)
        vision_width = self.vision_encoder.width
        # Cross-attention keys/values read text width; backbones of another width get a projection.
        self.vision_to_text: nn.Module = (
            nn.Identity() if vision_width == hidden else nn.Linear(vision_width, hidden)
        )
        self.vision_proj = nn.Linear(vision_width, config.embed_dim)
        self.text_proj = nn.Linear(hidden, config.embed_dim)
        self.temp = nn.Parameter(torch.tensor(float(config.temperature_init)))
        self.itm_head = nn.Sequential(
            nn.Linear(hidden, hidden * 2), nn.LayerNorm(hidden * 2), nn.GELU(), nn.Linear(hidden * 2, 2)
        )
        self.mlm_head = XLMRobertaLMHead(self.text_encoder.hf_config)
        # BERT's initialisation (transformers applies it only inside PreTrainedModel); timm already
        # initialised the vision backbone its own way.
        for module in (
            self.text_encoder,
            self.vision_to_text,
            self.vision_proj,
            self.text_proj,
            self.itm_head,
            self.mlm_head,
        ):
            module.apply(_init_bert_weights)
        # Tied input/output embeddings as in XLM-R: halves the size of large-vocabulary checkpoints.
        self.mlm_head.decoder.weight = self.text_encoder.embeddings.word_embeddings.weight
        # transformers ties the head's bias to the decoder's only inside PreTrainedModel; do it here.
        self.mlm_head.decoder.bias = self.mlm_head.bias

    @property
    def temperature(self) -> torch.Tensor:
        return self.temp.clamp(TEMPERATURE_MIN, TEMPERATURE_MAX)

    def encode_image(self, pixel_values: torch.Tensor) -> ImageEncoderOutput:
        tokens = self.vision_encoder(pixel_values)
        embeds = F.normalize(self.vision_proj(tokens[:, 0]), dim=-1)
        return ImageEncoderOutput(image_tokens=tokens, image_embeds=embeds)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextEncoderOutput:
        hidden = self.text_encoder.forward_text(input_ids, attention_mask)
        pooled = pool_text_states(hidden, attention_mask, self.config.text.pooling)
        embeds = F.normalize(self.text_proj(pooled), dim=-1)
        return TextEncoderOutput(last_hidden_state=hidden, attention_mask=attention_mask, text_embeds=embeds)

    def fuse(
        self, text_hidden: torch.Tensor, attention_mask: torch.Tensor, image_tokens: torch.Tensor
    ) -> FusionOutput:
        """Cross-attend text states (from ``encode_text``) to image tokens (from ``encode_image``)."""
        image_states = self.vision_to_text(image_tokens)
        hidden = self.text_encoder.forward_fusion(text_hidden, attention_mask, image_states)
        return FusionOutput(last_hidden_state=hidden, itm_logits=self.itm_head(hidden[:, 0]))

    def mlm_logits(self, fused_hidden: torch.Tensor) -> torch.Tensor:
        return self.mlm_head(fused_hidden)

    # -- persistence -------------------------------------------------------------------------------------

    def save_pretrained(self, path: Path | str, tokenizer: Any | None = None) -> Path:
        """Write ``config.json``, ``model.safetensors`` and, if given, the tokenizer files to ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.config.save(path / CONFIG_FILE)
        tmp = path / f".{WEIGHTS_FILE}.tmp"
        safetensors.torch.save_model(self, str(tmp), metadata={"format": "pt", "name": self.config.name})
        tmp.replace(path / WEIGHTS_FILE)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
        return path

    @classmethod
    def from_pretrained(cls, path: Path | str, map_location: str | torch.device = "cpu") -> CCRkModel:
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise CheckpointError(f"{path} is not a model directory: {CONFIG_FILE} is missing")
        if not (path / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"{path} is not a model directory: {WEIGHTS_FILE} is missing")
        config = CCRkConfig.load(path / CONFIG_FILE)
        model = cls(config)
        try:
            missing, unexpected = safetensors.torch.load_model(
                model, str(path / WEIGHTS_FILE), strict=False, device=str(map_location)
            )
        except (OSError, RuntimeError, safetensors.SafetensorError) as exc:
            raise CheckpointError(f"cannot load weights from {path / WEIGHTS_FILE}: {exc}") from exc
        if missing or unexpected:
            raise CheckpointError(
                f"weights in {path / WEIGHTS_FILE} do not fit config {config.name!r}: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        model.eval()
        return model


def read_config(path: Path | str) -> CCRkConfig:
    """The config of a model directory, without building the model."""
    return CCRkConfig.from_dict(json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8")))
