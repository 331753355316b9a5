"""Retrieval evaluation: per-language Recall@1/5/10 for text->image (IR) and image->text (TR), mean recall,
MRV and mrv_std, with and without fusion re-ranking of the dual encoder's top k.

Rank tables (see ``model.metrics``):
- IR: one row per (image, phrasing j) -- the j-th captions of an image in every language are translations
  of each other -- and one column per language: the 0-based rank of the image for that caption.
- TR: one row per image, one column per language: the 0-based rank of the image's best-ranked caption
  among all captions in that language.

Re-ranking: a re-rank score (``model.reranking``: the product's dual logit plus match margin, or the paper's
match logit alone) orders the top-k shortlist; items outside it keep their dual-encoder order below it, so a
target outside the shortlist keeps its dual rank.

A little over 400 lines: IR and TR each rank, re-rank and tabulate in their own short function; merging
them behind callbacks would save twenty lines and cost the reader the paper's two directions side by side.

Encoding and fusion scoring go through the ``model.runtime.Encoder`` interface only: a torch model in memory
(the one being trained) is wrapped in the torch runtime (``TorchEncoder.from_model``), so torch, ONNX and
int8 graphs are evaluated by the same code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from model.metrics import mean_recall, mrv, mrv_std, ranks_from_scores, recall_at_k
from model.modeling import CCRkModel
from model.preprocessing import ImagePreprocessor
from model.reranking import (
    DEFAULT_RERANK_SCORE,
    MATCH_OUTPUT,
    RerankScore,
    check_rerank_score,
    rerank_order,
)
from model.runtime.base import EncodedTexts, Encoder
from model.runtime.torch_runtime import TorchEncoder
from model.training_data import CaptionedImages

RECALL_KS = (1, 5, 10)


@dataclass
class EncodedSplit:
    """Dual-encoder outputs for a split.

    Attributes:
        image_embeds: (N, D); text_embeds: (N, K, C, D), C aligned phrasings per language.
        image_tokens: (N, T, W) fusion inputs, kept only when re-ranking.
        text_states: per language, (N * C, L, H) text-layer states and (N * C, L) masks; re-ranking only.
    """

    image_embeds: torch.Tensor
    text_embeds: torch.Tensor
    image_tokens: torch.Tensor | None = None
    text_states: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class DirectionScores:
    """Figures for one direction (IR or TR) of one ranking."""

    recall: dict[str, dict[str, float]]  # "R@k" -> language -> recall
    mean_recall: float
    mrv: float
    mrv_std: float

    @classmethod
    def from_ranks(cls, ranks: np.ndarray, languages: tuple[str, ...]) -> DirectionScores:
        recall = {
            f"R@{k}": {lang: float(v) for lang, v in zip(languages, recall_at_k(ranks, k), strict=True)}
            for k in RECALL_KS
        }
        return cls(recall, mean_recall(ranks, RECALL_KS), mrv(ranks), mrv_std(ranks))


@dataclass
class EvalResult:
    """Rank tables and the report of one evaluation."""

    languages: tuple[str, ...]
    ir_ranks: np.ndarray
    tr_ranks: np.ndarray
    ir_reranked: np.ndarray | None
    tr_reranked: np.ndarray | None
    rerank_k: int | None
    n_images: int
    seconds: dict[str, float]
    rerank_score: RerankScore = DEFAULT_RERANK_SCORE

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "languages": list(self.languages),
            "n_images": self.n_images,
            "n_ir_queries": int(self.ir_ranks.size),
            "rerank_k": self.rerank_k,
            "rerank_score": self.rerank_score if self.rerank_k is not None else None,
            "dual": {
                "IR": vars(DirectionScores.from_ranks(self.ir_ranks, self.languages)),
                "TR": vars(DirectionScores.from_ranks(self.tr_ranks, self.languages)),
            },
            "seconds": self.seconds,
        }
        if self.ir_reranked is not None and self.tr_reranked is not None:
            out["reranked"] = {
                "IR": vars(DirectionScores.from_ranks(self.ir_reranked, self.languages)),
                "TR": vars(DirectionScores.from_ranks(self.tr_reranked, self.languages)),
            }
        return out

    def rank_dump(self) -> dict[str, Any]:
        """Every instance's 0-based rank per language, so any figure can be recomputed."""
        dump: dict[str, Any] = {
            "languages": list(self.languages),
            "IR": self.ir_ranks.tolist(),
            "TR": self.tr_ranks.tolist(),
        }
        if self.ir_reranked is not None and self.tr_reranked is not None:
            dump["IR_reranked"] = self.ir_reranked.tolist()
            dump["TR_reranked"] = self.tr_reranked.tolist()
            dump["rerank_k"] = self.rerank_k
        return dump


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _aligned_phrasings(data: CaptionedImages) -> int:
    """How many aligned phrasings every image has in every language (the C of the rank tables)."""
    return min(len(c[lang]) for c in data.captions for lang in data.languages)


def _language_texts(data: CaptionedImages, lang: str, phrasings: int) -> list[str]:
    """Image-major order: text row ``i * C + c`` is image i's c-th phrasing."""
    return [data.captions[i][lang][c] for i in range(len(data)) for c in range(phrasings)]


def encode_split(
    encoder: Encoder, data: CaptionedImages, batch_size: int = 128, keep_fusion_inputs: bool = False
) -> EncodedSplit:
    """A split through the serving interface, so that every runtime (torch, ONNX, int8) is evaluated the
    same way; the fusion inputs (text states, image tokens) are kept only for re-ranking."""
    n, k = len(data), len(data.languages)
    phrasings = _aligned_phrasings(data)
    image_embeds, image_tokens = [], []
    for part in _chunks(n, batch_size):
        images = encoder.encode_images(data.pixels[part].numpy())
        image_embeds.append(images.embeds)
        if keep_fusion_inputs:
            image_tokens.append(images.tokens)
    text_embeds = torch.empty(n, k, phrasings, encoder.config.embed_dim)
    states: list[tuple[torch.Tensor, torch.Tensor]] = []
    # An added language is encoded by its acquirer; an encoder without acquirers is called as it always was.
    acquired = getattr(encoder, "acquired_languages", ())
    for li, lang in enumerate(data.languages):
        texts = _language_texts(data, lang, phrasings)
        lang_embeds, lang_states, lang_masks = [], [], []
        for part in _chunks(len(texts), batch_size):
            chosen = texts[part]
            encoded = (
                encoder.encode_text(chosen, [lang] * len(chosen))
                if lang in acquired
                else encoder.encode_text(chosen)
            )
            lang_embeds.append(encoded.embeds)
            if keep_fusion_inputs:  # dropped at once otherwise: (N * C, L, H) per language adds up
                lang_states.append(torch.from_numpy(np.asarray(encoded.states)))
                lang_masks.append(torch.from_numpy(np.asarray(encoded.mask)))
        text_embeds[:, li] = torch.from_numpy(np.concatenate(lang_embeds)).view(n, phrasings, -1)
        if keep_fusion_inputs:
            states.append(_pad_and_stack(lang_states, lang_masks))
    return EncodedSplit(
        image_embeds=torch.from_numpy(np.concatenate(image_embeds)),
        text_embeds=text_embeds,
        image_tokens=torch.from_numpy(np.concatenate(image_tokens)) if keep_fusion_inputs else None,
        text_states=states,
    )


def _pad_and_stack(
    states: list[torch.Tensor], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(s.shape[1] for s in states)
    padded = [torch.nn.functional.pad(s, (0, 0, 0, length - s.shape[1])) for s in states]
    padded_masks = [torch.nn.functional.pad(m, (0, length - m.shape[1])) for m in masks]
    return torch.cat(padded), torch.cat(padded_masks)


def dual_ranks(encoded: EncodedSplit) -> tuple[np.ndarray, np.ndarray]:
    """(IR ranks (N * C, K), TR ranks (N, K)) from dual-encoder similarities."""
    images = encoded.image_embeds.numpy()
    n, k, c, _ = encoded.text_embeds.shape
    ir = np.empty((n * c, k), dtype=np.int64)
    tr = np.empty((n, k), dtype=np.int64)
    targets_ir = np.repeat(np.arange(n), c)
    targets_tr = np.arange(n * c).reshape(n, c)
    for li in range(k):
        texts = encoded.text_embeds[:, li].reshape(n * c, -1).numpy()
        scores = texts @ images.T
        ir[:, li] = ranks_from_scores(scores, targets_ir)
        tr[:, li] = ranks_from_scores(scores.T, targets_tr)
    return ir, tr


def _match_scores(
    encoder: Encoder,
    output: str,
    text_states: torch.Tensor,
    text_masks: torch.Tensor,
    image_tokens: torch.Tensor,
    pair_batch: int,
) -> torch.Tensor:
    """Fusion scores of aligned (text, image) pairs, in chunks of ``pair_batch``: the fusion output
    ``output`` (the one the re-rank score reads, ``model.reranking.MATCH_OUTPUT``)."""
    scores = []
    for part in _chunks(text_states.shape[0], pair_batch):
        masks = text_masks[part]
        length = int(masks.sum(dim=1).max())  # trim padding the chunk does not need
        # The fusion scorer reads states and masks only; the embeddings are not needed.
        texts = EncodedTexts(
            np.empty((masks.shape[0], 0), np.float32),
            text_states[part, :length].numpy(),
            masks[:, :length].numpy(),
        )
        matched = encoder.score_aligned(texts, image_tokens[part].numpy(), output)
        scores.append(torch.from_numpy(np.asarray(matched, dtype=np.float32)))
    return torch.cat(scores)


def _rerank_rank(
    dual_order: np.ndarray,
    similarity: np.ndarray,
    match: np.ndarray,
    temperature: float,
    targets: set[int],
    dual_rank: int,
    k: int,
    rerank_score: RerankScore = DEFAULT_RERANK_SCORE,
) -> int:
    """Rank after re-ordering the shortlist ``dual_order[:k]`` by the re-ranking score; else the dual rank."""
    if dual_rank >= k:
        return dual_rank
    reordered = dual_order[rerank_order(similarity, match, temperature, rerank_score)]
    return int(min(i for i, item in enumerate(reordered) if item in targets))


def reranked_ranks(
    encoder: Encoder,
    encoded: EncodedSplit,
    dual_ir: np.ndarray,
    dual_tr: np.ndarray,
    rerank_k: int,
    pair_batch: int = 1024,
    rerank_score: RerankScore = DEFAULT_RERANK_SCORE,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-rank the top ``rerank_k`` of every IR and TR query with the encoder's fusion scorer
    (``rerank_score`` as in ``model.reranking``)."""
    if encoded.image_tokens is None or not encoded.text_states:
        raise ValueError("encode_split(keep_fusion_inputs=True) is needed for re-ranking")
    output = MATCH_OUTPUT[check_rerank_score(rerank_score)]
    temperature = encoder.temperature
    images = encoded.image_embeds
    n, k_langs, c, _ = encoded.text_embeds.shape
    ir = dual_ir.copy()
    tr = dual_tr.copy()
    shortlist = min(rerank_k, n)
    for li in range(k_langs):
        states, masks = encoded.text_states[li]
        texts = encoded.text_embeds[:, li].reshape(n * c, -1)
        scores = texts @ images.T  # (N * C, N)
        # IR: each text query against its image shortlist.
        top = torch.topk(scores, shortlist, dim=1)
        order, order_sims = top.indices, top.values  # (N * C, k)
        queries = np.flatnonzero(dual_ir[:, li] < shortlist)
        for part in _chunks(len(queries), max(1, pair_batch // shortlist)):
            rows = torch.from_numpy(queries[part])
            cand = order[rows]  # (q, k)
            match = _match_scores(
                encoder,
                output,
                states[rows].repeat_interleave(shortlist, dim=0),
                masks[rows].repeat_interleave(shortlist, dim=0),
                encoded.image_tokens[cand.reshape(-1)],
                pair_batch,
            ).view(len(rows), shortlist)
            sims = order_sims[rows].numpy()
            for row, cands, sim, m in zip(rows.tolist(), cand.numpy(), sims, match.numpy(), strict=True):
                ir[row, li] = _rerank_rank(
                    cands, sim, m, temperature, {row // c}, int(dual_ir[row, li]), shortlist, rerank_score
                )
        # TR: each image against its caption shortlist in this language.
        text_short = min(rerank_k, n * c)
        top_tr = torch.topk(scores.T, text_short, dim=1)
        order_tr, order_tr_sims = top_tr.indices, top_tr.values  # (N, k)
        images_to_do = np.flatnonzero(dual_tr[:, li] < text_short)
        for part in _chunks(len(images_to_do), max(1, pair_batch // text_short)):
            rows = torch.from_numpy(images_to_do[part])
            cand = order_tr[rows]
            match = _match_scores(
                encoder,
                output,
                states[cand.reshape(-1)],
                masks[cand.reshape(-1)],
                encoded.image_tokens[rows].repeat_interleave(text_short, dim=0),
                pair_batch,
            ).view(len(rows), text_short)
            sims = order_tr_sims[rows].numpy()
            for row, cands, sim, m in zip(rows.tolist(), cand.numpy(), sims, match.numpy(), strict=True):
                targets = set(range(row * c, row * c + c))
                tr[row, li] = _rerank_rank(
                    cands, sim, m, temperature, targets, int(dual_tr[row, li]), text_short, rerank_score
                )
    return ir, tr


def evaluate(
    model: CCRkModel,
    tokenizer: PreTrainedTokenizerBase,
    data: CaptionedImages,
    preprocessor: ImagePreprocessor,
    rerank_k: int | None = None,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    rerank_score: RerankScore = DEFAULT_RERANK_SCORE,
) -> EvalResult:
    """Evaluate a torch model in memory (e.g. the one being trained) through the torch runtime's
    ``Encoder``, as ``evaluate_encoder`` does any runtime; the model is left in eval mode on ``device``."""
    _check_options(rerank_k, rerank_score)  # before the model is touched
    encoder = TorchEncoder.from_model(model, tokenizer, device, preprocessor)
    return evaluate_encoder(encoder, data, rerank_k, batch_size, rerank_score)


def evaluate_encoder(
    encoder: Encoder,
    data: CaptionedImages,
    rerank_k: int | None = None,
    batch_size: int = 128,
    rerank_score: RerankScore = DEFAULT_RERANK_SCORE,
) -> EvalResult:
    """Per-language ranks of a split through the serving interface (any runtime: torch, ONNX, int8), with
    fusion re-ranking of the top ``rerank_k`` by ``rerank_score`` (``itm_logit``: the paper's ranking, to
    reproduce published numbers)."""
    _check_options(rerank_k, rerank_score)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    encoded = encode_split(encoder, data, batch_size, keep_fusion_inputs=rerank_k is not None)
    seconds["encode"] = time.perf_counter() - start
    start = time.perf_counter()
    ir, tr = dual_ranks(encoded)
    seconds["dual_rank"] = time.perf_counter() - start
    ir_re = tr_re = None
    if rerank_k is not None:
        start = time.perf_counter()
        ir_re, tr_re = reranked_ranks(encoder, encoded, ir, tr, rerank_k, rerank_score=rerank_score)
        seconds["rerank"] = time.perf_counter() - start
    return EvalResult(data.languages, ir, tr, ir_re, tr_re, rerank_k, len(data), seconds, rerank_score)


def _check_options(rerank_k: int | None, rerank_score: str) -> None:
    if rerank_k is not None and rerank_k < 1:
        raise ValueError(f"rerank_k must be >= 1, got {rerank_k}")
    check_rerank_score(rerank_score)


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table of a report: one row per language, IR and TR Recall@1/5/10, then MRV lines."""
    languages = report["languages"]
    lines: list[str] = []
    for variant in ("dual", "reranked"):
        if variant not in report:
            continue
        title = "dual encoder" if variant == "dual" else f"re-ranked top {report['rerank_k']}"
        if variant == "reranked" and report.get("rerank_score", DEFAULT_RERANK_SCORE) != DEFAULT_RERANK_SCORE:
            title += f" by {report['rerank_score']}"
        lines.append(f"== {title} ==")
        lines.append(
            f"{'lang':<6}"
            + "".join(f"{d + ' ' + k:>10}" for d in ("IR", "TR") for k in ("R@1", "R@5", "R@10"))
        )
        for lang in languages:
            cells = [
                report[variant][d]["recall"][f"R@{k}"][lang] * 100 for d in ("IR", "TR") for k in RECALL_KS
            ]
            lines.append(f"{lang:<6}" + "".join(f"{v:>10.2f}" for v in cells))
        for d in ("IR", "TR"):
            s = report[variant][d]
            lines.append(
                f"{d}: mean recall {s['mean_recall'] * 100:.2f}  "
                f"MRV {s['mrv']:.3f}  mrv_std {s['mrv_std']:.3f}"
            )
    return "\n".join(lines)


def int8_cost(
    fp32: Encoder, int8: Encoder, data: CaptionedImages, rerank_k: int | None = 16
) -> dict[str, Any]:
    """What the int8 query (and fusion) graphs cost against fp32 on a split, in points of mean recall and
    in MRV, for IR and TR; with ``rerank_k`` also through re-ranking (where the int8 fusion graph acts).

    The serving runtime uses int8 graphs only when this recorded cost is within its settings."""
    base = evaluate_encoder(fp32, data, rerank_k).report()
    quant = evaluate_encoder(int8, data, rerank_k).report()
    cost: dict[str, Any] = {"images": len(data), "languages": list(data.languages), "rerank_k": rerank_k}
    variants = ["dual", "reranked"] if rerank_k is not None else ["dual"]
    worst_drop, worst_mrv = 0.0, 0.0
    for variant in variants:
        for direction in ("IR", "TR"):
            a, b = base[variant][direction], quant[variant][direction]
            drop = 100.0 * (a["mean_recall"] - b["mean_recall"])
            mrv_increase = b["mrv"] - a["mrv"]
            cost[f"{variant}_{direction}"] = {
                "mean_recall_fp32": a["mean_recall"],
                "mean_recall_int8": b["mean_recall"],
                "mean_recall_drop_points": drop,
                "mrv_fp32": a["mrv"],
                "mrv_int8": b["mrv"],
                "mrv_increase": mrv_increase,
            }
            worst_drop, worst_mrv = max(worst_drop, drop), max(worst_mrv, mrv_increase)
    cost["max_mean_recall_drop_points"] = worst_drop
    cost["max_mrv_increase"] = worst_mrv
    return cost
