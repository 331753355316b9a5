"""Training objectives of CCRk and its baselines.

- ``kcl_loss``: 1-to-K contrastive learning (CCRk eq. 1-2). Image -> text treats all K captions of an image
  as positives, each weighted 1/K, against every caption in the batch; text -> image is InfoNCE over the
  B images. With K = 1 it equals the symmetric InfoNCE of ``info_nce``.
- ``info_nce``: the 1-to-1 objective prior work trains with (one caption per image per step).
- hard-sample mining for MITM: ``sample_hard_positives`` (the worst-aligned language of each image, sampled
  with probability growing as similarity falls) and ``sample_hard_negatives`` (in proportion to similarity).
- ``mask_tokens`` for CMLM (15 % of tokens; 80 % ``<mask>``, 10 % random, 10 % kept).
- ``translation_pair_loss``: MURAL's text-text contrastive term for parallel sentences without an image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


@dataclass
class ContrastiveLoss:
    """A symmetric contrastive loss and its two directions."""

    loss: torch.Tensor
    image_to_text: torch.Tensor
    text_to_image: torch.Tensor


def kcl_loss(
    image_embeds: torch.Tensor,
    text_embeds: torch.Tensor,
    temperature: torch.Tensor | float,
    text_mask: torch.Tensor | None = None,
) -> ContrastiveLoss:
    """1-to-K contrastive loss.

    Args:
        image_embeds: (B, D) normalised image embeddings.
        text_embeds: (B, K, D) normalised embeddings of each image's K captions (one per language).
        temperature: softmax temperature.
        text_mask: optional (B, K) bool, False where an image lacks a caption in a language; those captions
            are neither positives nor negatives, and an image's weight is 1/K_i over its present captions.
    """
    batch, k, dim = text_embeds.shape
    if image_embeds.shape != (batch, dim):
        raise ValueError(
            f"image_embeds {tuple(image_embeds.shape)} does not match text_embeds {(batch, k, dim)}"
        )
    if text_mask is None:
        text_mask = torch.ones(batch, k, dtype=torch.bool, device=text_embeds.device)
    flat_texts = text_embeds.reshape(batch * k, dim)
    flat_mask = text_mask.reshape(batch * k)

    logits_i2t = image_embeds @ flat_texts.t() / temperature  # (B, B*K)
    logits_i2t = logits_i2t.masked_fill(~flat_mask[None, :], float("-inf"))
    log_probs = F.log_softmax(logits_i2t, dim=1)
    owner = torch.arange(batch, device=text_embeds.device).repeat_interleave(k)
    positives = (owner[None, :] == torch.arange(batch, device=owner.device)[:, None]) & flat_mask[None, :]
    weights = positives.float() / positives.sum(dim=1, keepdim=True).clamp(min=1)
    image_to_text = -(log_probs.masked_fill(~positives, 0.0) * weights).sum(dim=1).mean()

    logits_t2i = flat_texts[flat_mask] @ image_embeds.t() / temperature  # (valid texts, B)
    text_to_image = F.cross_entropy(logits_t2i, owner[flat_mask])
    return ContrastiveLoss((image_to_text + text_to_image) / 2, image_to_text, text_to_image)


def info_nce(
    image_embeds: torch.Tensor, text_embeds: torch.Tensor, temperature: torch.Tensor | float
) -> ContrastiveLoss:
    """Symmetric InfoNCE over B aligned (image, text) pairs; the 1-to-1 objective."""
    logits = image_embeds @ text_embeds.t() / temperature
    labels = torch.arange(logits.shape[0], device=logits.device)
    image_to_text = F.cross_entropy(logits, labels)
    text_to_image = F.cross_entropy(logits.t(), labels)
    return ContrastiveLoss((image_to_text + text_to_image) / 2, image_to_text, text_to_image)


def translation_pair_loss(
    source_embeds: torch.Tensor, target_embeds: torch.Tensor, temperature: torch.Tensor | float
) -> torch.Tensor:
    """MURAL's text-text term: symmetric InfoNCE between B sentences and their B translations."""
    logits = source_embeds @ target_embeds.t() / temperature
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def sample_one_language(text_mask: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """For the 1-to-1 baseline: one present language per image, uniformly at random; shape (B,)."""
    weights = text_mask.float()
    if (weights.sum(dim=1) == 0).any():
        raise ValueError("every image needs at least one caption")
    return torch.multinomial(weights, 1, generator=generator).squeeze(1)


@torch.no_grad()
def sample_hard_positives(
    image_embeds: torch.Tensor,
    text_embeds: torch.Tensor,
    temperature: torch.Tensor | float,
    text_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick, per image, the language used as MITM/CMLM positive: p(k) = softmax_k(-s(v_i, t_ik) / tau),
    so the language the model aligns worst with the image is the likeliest; shape (B,)."""
    sims = torch.einsum("bd,bkd->bk", image_embeds, text_embeds) / temperature
    logits = -sims
    if text_mask is not None:
        logits = logits.masked_fill(~text_mask, float("-inf"))
    probs = F.softmax(logits.float(), dim=1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def sample_hard_negatives(
    image_embeds: torch.Tensor,
    text_embeds: torch.Tensor,
    temperature: torch.Tensor | float,
    same_item: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard negatives in both directions, sampled in proportion to softmax similarity (as ALBEF).

    Args:
        image_embeds: (B, D); text_embeds: (B, D), text i describes image i.
        same_item: optional (B, B) bool, True where image i and text j describe the same product (duplicate
            attribute sets); such pairs are never drawn as negatives. The diagonal always is excluded.

    Returns:
        (negative text index for each image, negative image index for each text), each (B,).
    """
    batch = image_embeds.shape[0]
    if batch < 2:
        raise ValueError("hard negatives need a batch of at least 2")
    logits = (image_embeds @ text_embeds.t() / temperature).float()
    excluded = torch.eye(batch, dtype=torch.bool, device=logits.device)
    if same_item is not None:
        excluded = excluded | same_item
    # A row with nothing left to draw (all duplicates) falls back to uniform over the other indices.
    all_excluded = excluded.all(dim=1, keepdim=True)
    excluded = torch.where(all_excluded, torch.eye(batch, dtype=torch.bool, device=logits.device), excluded)
    weights_i2t = F.softmax(logits.masked_fill(excluded, float("-inf")), dim=1)
    weights_t2i = F.softmax(logits.t().masked_fill(excluded.t(), float("-inf")), dim=1)
    neg_texts = torch.multinomial(weights_i2t, 1, generator=generator).squeeze(1)
    neg_images = torch.multinomial(weights_t2i, 1, generator=generator).squeeze(1)
    return neg_texts, neg_images


def itm_labels(batch: int, device: torch.device | None = None) -> torch.Tensor:
    """Labels of the 3B MITM pairs laid out as [B positives, B (text, negative image), B (negative text,
    image)]."""
    return torch.cat([torch.ones(batch, dtype=torch.long), torch.zeros(2 * batch, dtype=torch.long)]).to(
        device
    )


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking for CMLM: returns (masked input ids, labels with IGNORE_INDEX where not predicted).

    Special and padding tokens are never masked; every sequence with a maskable token gets at least one
    masked position, so short captions still train the MLM head.
    """
    device = input_ids.device
    maskable = attention_mask.bool()
    for token_id in special_ids:
        maskable &= input_ids != token_id
    draw = torch.rand(input_ids.shape, generator=generator, device=device)
    selected = (draw < probability) & maskable
    # Force one position in rows that drew none: the maskable token with the lowest draw.
    none_drawn = ~selected.any(dim=1) & maskable.any(dim=1)
    forced = draw.masked_fill(~maskable, 2.0).argmin(dim=1)
    selected[none_drawn, forced[none_drawn]] = True

    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    action = torch.rand(input_ids.shape, generator=generator, device=device)
    masked = input_ids.clone()
    masked[selected & (action < 0.8)] = mask_token_id
    randomise = selected & (action >= 0.8) & (action < 0.9)
    random_ids = torch.randint(0, vocab_size, input_ids.shape, generator=generator, device=device)
    for token_id in special_ids:  # a random special token would teach nothing; keep the original instead
        random_ids = torch.where(random_ids == token_id, input_ids, random_ids)
    masked[randomise] = random_ids[randomise]
    return masked, labels
