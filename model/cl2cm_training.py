"""The per-step losses of the CL2CM objective of ``add-language`` (``model.cl2cm`` holds the loss functions
and the method's description; ``model.language_training`` runs the stages).

- ``cl_step_loss``: the CL network's step on B (native, new) pairs: instance InfoNCE + ``word_weight`` x
  word alignment, plus, for ``mla+cl2cm``, NLT's squared error to the frozen native embeddings.
- ``le_kd_step_loss``: LE's image-text InfoNCE on B images (one per product), plus ``kd_weight`` x the
  relational distillation from the frozen CL teacher (the frozen text tower on the image's native caption,
  a snapshot of the acquirer on the new caption of the same slot).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from model.acquisition import LanguageAcquirer
from model.cl2cm import (
    instance_loss,
    relational_kd_loss,
    token_similarity,
    word_alignment_labels,
    word_alignment_loss,
    word_mask,
    word_relation,
)
from model.modeling import CCRkModel, pool_text_states
from model.objectives import info_nce
from model.tokenization import tokenize

StepLoss = Callable[[random.Random], torch.Tensor]


@dataclass
class Encoded:
    states: torch.Tensor  # (B, L, H)
    words: torch.Tensor  # (B, L) bool: real non-special tokens
    embeds: torch.Tensor  # (B, D) normalised


class TextSides:
    """The CL network's two towers: the frozen base over native texts, an acquirer over new texts."""

    def __init__(
        self,
        base: CCRkModel,
        base_tokenizer: PreTrainedTokenizerBase,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
    ) -> None:
        self.base, self.base_tokenizer, self.tokenizer, self.max_length = (
            base,
            base_tokenizer,
            tokenizer,
            max_length,
        )
        self.device = base.text_proj.weight.device

    @torch.no_grad()
    def native(self, texts: Sequence[str]) -> Encoded:
        batch = tokenize(self.base_tokenizer, list(texts), self.base.config.text.max_length)
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        states = self.base.text_encoder.forward_text(ids, mask)
        pooled = pool_text_states(states, mask, self.base.config.text.pooling)
        embeds = F.normalize(self.base.text_proj(pooled), dim=-1)
        return Encoded(states, word_mask(ids, mask, self.base_tokenizer.all_special_ids), embeds)

    def new(self, acquirer: LanguageAcquirer, texts: Sequence[str]) -> Encoded:
        batch = tokenize(self.tokenizer, list(texts), self.max_length)
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        states, _, embeds = acquirer(ids, mask)
        return Encoded(states, word_mask(ids, mask, self.tokenizer.all_special_ids), embeds)


def cl_step_loss(
    sides: TextSides,
    acquirer: LanguageAcquirer,
    pairs: list[tuple[str, str]],
    batch_size: int,
    temperature: float,
    word_weight: float,
    nlt_targets: torch.Tensor | None = None,
) -> StepLoss:
    """The CL stage's loss on a batch of pairs drawn from ``rng``; with ``nlt_targets`` (the frozen
    embeddings of every pair's native side) NLT's squared error is added (``mla+cl2cm``)."""

    def loss(rng: random.Random) -> torch.Tensor:
        index = rng.sample(range(len(pairs)), min(batch_size, len(pairs)))
        native = sides.native([pairs[i][0] for i in index])
        new = sides.new(acquirer, [pairs[i][1] for i in index])
        value = instance_loss(native.embeds, new.embeds, temperature)
        if word_weight > 0:
            sim = token_similarity(new.states, native.states)
            labels = word_alignment_labels(sim.detach(), new.words, native.words)
            value = value + word_weight * word_alignment_loss(sim, labels, native.words, temperature)
        if nlt_targets is not None:
            value = value + (new.embeds - nlt_targets[index]).pow(2).sum(dim=-1).mean()
        return value

    return loss


def le_kd_step_loss(
    sides: TextSides,
    acquirer: LanguageAcquirer,
    teacher: LanguageAcquirer,
    lang: str,
    captions: list[dict[str, list[str]]],
    native_captions: list[list[str]],
    item_keys: list[str],
    images: torch.Tensor,
    batch_size: int,
    temperature: float,
    kd_weight: float,
) -> StepLoss:
    """LE's InfoNCE plus the relational distillation of the frozen CL teacher, on B images (one per
    product: a duplicate would be a false negative) and one aligned caption slot each."""

    def loss(rng: random.Random) -> torch.Tensor:
        order = rng.sample(range(len(captions)), len(captions))
        index, keys = [], set()
        for i in order:
            if item_keys[i] not in keys:
                keys.add(item_keys[i])
                index.append(i)
                if len(index) == batch_size:
                    break
        slots = [rng.randrange(min(len(captions[i][lang]), len(native_captions[i]))) for i in index]
        new_texts = [captions[i][lang][j] for i, j in zip(index, slots, strict=True)]
        student = sides.new(acquirer, new_texts)
        value = info_nce(images[index], student.embeds, temperature).loss
        if kd_weight > 0:
            with torch.no_grad():
                native = sides.native([native_captions[i][j] for i, j in zip(index, slots, strict=True)])
                taught = sides.new(teacher, new_texts)
                sentence = native.embeds @ taught.embeds.t()
                word = word_relation(native.states, native.words, taught.states, taught.words)
            similarity = images[index] @ student.embeds.t()
            value = value + kd_weight * relational_kd_loss(sentence, word, similarity, temperature)
        return value

    return loss
