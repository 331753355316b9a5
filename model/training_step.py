"""What one training step computes: the losses of a batch (1-to-K or 1-to-1 contrastive, MITM with hard
samples, CMLM, MURAL's translation pairs; ``model.objectives`` holds each term), and the optimizer's
parameter groups and learning-rate schedule that turn them into an update (``model.training`` runs the loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from model.modeling import CCRkModel
from model.objectives import (
    IGNORE_INDEX,
    info_nce,
    itm_labels,
    kcl_loss,
    mask_tokens,
    sample_hard_negatives,
    sample_hard_positives,
    sample_one_language,
    translation_pair_loss,
)
from model.training_data import TrainBatch

Objective = Literal["kcl", "one2one"]


class LossWeights(Protocol):
    """The options of a run (``model.training.TrainConfig``) that one step reads."""

    itm_weight: float
    mlm_weight: float
    mlm_probability: float
    translation_weight: float


@dataclass
class StepLosses:
    """The losses of one batch: the weighted total and each term unweighted."""

    total: torch.Tensor
    contrastive: torch.Tensor
    itm: torch.Tensor
    mlm: torch.Tensor
    translation: torch.Tensor

    def as_floats(self) -> dict[str, float]:
        return {k: float(v.detach()) for k, v in vars(self).items()}


def training_step(
    model: CCRkModel,
    batch: TrainBatch,
    objective: Objective,
    cfg: LossWeights,
    tokenizer: PreTrainedTokenizerBase,
    generator: torch.Generator,
    parallel: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None,
) -> StepLosses:
    """Losses of one batch; see ``model.objectives`` for each term."""
    device = batch.pixel_values.device
    # torch.Generator lives on the CPU; on CUDA sampling draws from the device's default generator.
    device_generator = generator if device.type == "cpu" else None
    temp = model.temperature
    image = model.encode_image(batch.pixel_values)
    b, k = batch.text_mask.shape
    if objective == "kcl":
        text = model.encode_text(batch.input_ids, batch.attention_mask)
        text_embeds = text.text_embeds.view(b, k, -1)
        contrastive = kcl_loss(image.image_embeds, text_embeds, temp, batch.text_mask).loss
        langs = sample_hard_positives(
            image.image_embeds, text_embeds, temp, batch.text_mask, device_generator
        )
        rows = torch.arange(b, device=device) * k + langs.to(device)
        pos_ids, pos_mask = batch.input_ids[rows], batch.attention_mask[rows]
        pos_states, pos_embeds = text.last_hidden_state[rows], text.text_embeds[rows]
    else:
        # 1-to-1: only the sampled caption of each image is encoded, as prior methods train.
        langs = sample_one_language(batch.text_mask.cpu(), generator).to(device)
        rows = torch.arange(b, device=device) * k + langs
        pos_ids, pos_mask = batch.input_ids[rows], batch.attention_mask[rows]
        text = model.encode_text(pos_ids, pos_mask)
        pos_states, pos_embeds = text.last_hidden_state, text.text_embeds
        contrastive = info_nce(image.image_embeds, pos_embeds, temp).loss

    zero = torch.zeros((), device=device)
    itm = zero
    if cfg.itm_weight > 0:
        neg_texts, neg_images = sample_hard_negatives(
            image.image_embeds, pos_embeds, temp, batch.same_item, device_generator
        )
        fused = model.fuse(
            torch.cat([pos_states, pos_states, pos_states[neg_texts]]),
            torch.cat([pos_mask, pos_mask, pos_mask[neg_texts]]),
            torch.cat([image.image_tokens, image.image_tokens[neg_images], image.image_tokens]),
        )
        itm = F.cross_entropy(fused.itm_logits.float(), itm_labels(b, device))
    mlm = zero
    if cfg.mlm_weight > 0:
        masked, labels = mask_tokens(
            pos_ids.cpu(),
            pos_mask.cpu(),
            tokenizer.mask_token_id,
            model.config.text.vocab_size,
            tokenizer.all_special_ids,
            cfg.mlm_probability,
            generator,
        )
        masked, labels = masked.to(device), labels.to(device)
        states = model.encode_text(masked, pos_mask).last_hidden_state
        fused_states = model.fuse(states, pos_mask, image.image_tokens).last_hidden_state
        picked = labels != IGNORE_INDEX
        mlm = F.cross_entropy(model.mlm_logits(fused_states[picked]).float(), labels[picked])
    translation = zero
    if parallel is not None and cfg.translation_weight > 0:
        src, tgt = parallel
        src_embeds = model.encode_text(src["input_ids"], src["attention_mask"]).text_embeds
        tgt_embeds = model.encode_text(tgt["input_ids"], tgt["attention_mask"]).text_embeds
        translation = translation_pair_loss(src_embeds, tgt_embeds, temp)
    total = contrastive + cfg.itm_weight * itm + cfg.mlm_weight * mlm + cfg.translation_weight * translation
    return StepLosses(total, contrastive, itm, mlm, translation)


def param_groups(model: CCRkModel, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: weight decay on matrices only."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        # Norms, biases and the temperature are not decayed (standard for transformers and CLIP).
        (no_decay if param.ndim < 2 or name == "temp" else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """The LR multiplier of each step: linear warm-up over ``warmup`` steps, then cosine decay to 0."""

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))

    return schedule
