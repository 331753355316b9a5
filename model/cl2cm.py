"""CL2CM's cross-lingual knowledge transfer (Wang, Wang, Dong, Luo, "CL2CM: Improving Cross-Lingual
Cross-Modal Retrieval via Cross-Lingual Knowledge Transfer", AAAI 2024), as an objective of ``add-language``.

The paper aligns images with a target language that has only machine-translated texts. A cross-lingual (CL)
network learns from (source, translation) pairs, where the two sides are the same modality and the gap is
small; its view of how a batch's texts relate is then distilled into the cross-modal (CM) network, so that
a wrong translation is not taken as the whole truth. Here:

- **CL network** = the frozen model's own text tower over the native sentence and the language's acquirer
  (``model.acquisition``) over its translation. Trained (the acquirer only) with

  - the **instance loss**: symmetric InfoNCE between the B native and B new sentence embeddings of a batch,
    at the model's (frozen) temperature (``instance_loss``);
  - **self-supervised word alignment**: per pair, the cosine similarity of every new token to every native
    token (final text-layer states, special tokens left out); an entropic optimal-transport plan
    (``sinkhorn``, uniform marginals) over the cost ``1 - cos`` gives each new token the native token it
    carries the most mass to; a pseudo-label is kept where that choice is mutual (the native token's best
    new token is it), and the kept tokens are trained with a cross-entropy over the pair's native tokens
    (``word_alignment_labels``, ``word_alignment_loss``).
- **Relational knowledge distillation** into LE (the CM network: frozen images, acquirer texts). For a batch
  of B images with their native caption and the translation of it, the CL network, frozen after its stage
  (a snapshot of the acquirer), gives two B x B relation matrices between native caption i and new caption
  j: sentence level (cosine of the embeddings) and word level (mean over j's tokens of the best cosine to a
  token of i, ``word_relation``). Each is turned into row distributions by a softmax at the temperature,
  and the two **vote** by averaging (``voted_relation``); the student's image-text similarity (image i vs
  new caption j) is trained towards them by KL, image-to-text rows and text-to-image columns alike
  (``relational_kd_loss``), added to LE's InfoNCE with weight ``kd_weight``.

Only the acquirer is trained and only it runs at inference, as with MLA; the base model's files, its
fingerprint and every index are untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.objectives import translation_pair_loss

_NEG = -1e9


def word_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int]) -> torch.Tensor:
    """True at a real, non-special token (``<s>``, ``</s>`` and padding left out)."""
    mask = attention_mask.bool()
    for special in special_ids:
        mask &= input_ids.ne(special)
    return mask


def token_similarity(target_states: torch.Tensor, source_states: torch.Tensor) -> torch.Tensor:
    """(B, Lt, Ls) cosine similarity of each pair's target tokens to its source tokens."""
    return F.normalize(target_states, dim=-1) @ F.normalize(source_states, dim=-1).transpose(1, 2)


def sinkhorn(
    cost: torch.Tensor,
    target_mask: torch.Tensor,
    source_mask: torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 50,
) -> torch.Tensor:
    """Entropic optimal-transport plans (B, Lt, Ls) between each pair's target and source tokens, uniform
    marginals over the real tokens (masked ones get no mass), in the log domain."""
    valid = target_mask[:, :, None] & source_mask[:, None, :]
    log_k = torch.where(valid, -cost / epsilon, torch.full_like(cost, _NEG))
    n_t = target_mask.sum(dim=1, keepdim=True).clamp(min=1).to(cost.dtype)
    n_s = source_mask.sum(dim=1, keepdim=True).clamp(min=1).to(cost.dtype)
    log_a = torch.where(target_mask, -torch.log(n_t), torch.full_like(target_mask, _NEG, dtype=cost.dtype))
    log_b = torch.where(source_mask, -torch.log(n_s), torch.full_like(source_mask, _NEG, dtype=cost.dtype))
    u = torch.zeros_like(log_a)
    v = torch.zeros_like(log_b)
    for _ in range(iterations):
        u = log_a - torch.logsumexp(log_k + v[:, None, :], dim=2)
        v = log_b - torch.logsumexp(log_k + u[:, :, None], dim=1)
    plan = torch.exp(u[:, :, None] + log_k + v[:, None, :])
    return plan * valid


@torch.no_grad()
def word_alignment_labels(
    similarity: torch.Tensor,
    target_mask: torch.Tensor,
    source_mask: torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 50,
) -> torch.Tensor:
    """(B, Lt) pseudo-labels: the source token each target token is aligned to, -1 where none is kept (a
    masked token, or an alignment that is not mutual in the transport plan)."""
    plan = sinkhorn(1 - similarity, target_mask, source_mask, epsilon, iterations)
    best_source = plan.argmax(dim=2)  # (B, Lt)
    best_target = plan.argmax(dim=1)  # (B, Ls)
    mutual = best_target.gather(1, best_source) == torch.arange(plan.shape[1], device=plan.device)
    keep = mutual & target_mask & (plan.amax(dim=2) > 0)
    return torch.where(keep, best_source, torch.full_like(best_source, -1))


def word_alignment_loss(
    similarity: torch.Tensor, labels: torch.Tensor, source_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Cross-entropy of each labelled target token over its pair's source tokens (logits ``cos / t``);
    0 when no token is labelled."""
    logits = similarity / temperature
    logits = logits.masked_fill(~source_mask[:, None, :], _NEG)
    kept = labels >= 0
    if not kept.any():
        return similarity.sum() * 0.0
    return F.cross_entropy(logits[kept], labels[kept])


def instance_loss(
    source_embeds: torch.Tensor, target_embeds: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Symmetric InfoNCE between B sentences and their B translations (the CL network's instance loss)."""
    return translation_pair_loss(source_embeds, target_embeds, temperature)


def word_relation(
    source_states: torch.Tensor,
    source_mask: torch.Tensor,
    target_states: torch.Tensor,
    target_mask: torch.Tensor,
) -> torch.Tensor:
    """(B_source, B_target) word-level relation: for source i and target j, the mean over j's tokens of the
    highest cosine to a token of i."""
    s = F.normalize(source_states, dim=-1)
    t = F.normalize(target_states, dim=-1)
    sim = torch.einsum("ild,jmd->ijml", s, t)  # (Bs, Bt, Lt, Ls)
    sim = sim.masked_fill(~source_mask[:, None, None, :], _NEG)
    best = sim.amax(dim=3)  # (Bs, Bt, Lt)
    weights = target_mask[None, :, :].to(best.dtype)
    return (best * weights).sum(dim=2) / weights.sum(dim=2).clamp(min=1)


def voted_relation(sentence: torch.Tensor, word: torch.Tensor, temperature: float, dim: int) -> torch.Tensor:
    """The sentence- and word-level relations vote: the mean of their softmax distributions along ``dim``."""
    return (F.softmax(sentence / temperature, dim=dim) + F.softmax(word / temperature, dim=dim)) / 2


def relational_kd_loss(
    sentence: torch.Tensor, word: torch.Tensor, student: torch.Tensor, temperature: float
) -> torch.Tensor:
    """KL(teacher || student) of B x B relations, averaged over rows (image/native i -> new texts j) and over
    columns (new text j -> images i), then over the two directions. ``student`` holds image-text cosines;
    all three matrices are divided by the same temperature."""
    total = sentence.new_zeros(())
    for dim in (1, 0):
        teacher = voted_relation(sentence, word, temperature, dim)
        log_student = F.log_softmax(student / temperature, dim=dim)
        kl = (teacher * (torch.log(teacher.clamp(min=1e-12)) - log_student)).sum(dim=dim)
        total = total + kl.mean()
    return total / 2
