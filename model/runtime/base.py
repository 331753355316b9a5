"""The encoder interface and its numpy-only result types (no torch, no onnxruntime here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

from model.model_dir import ModelConfig

# The fusion scorer's outputs (``model.export``): the match margin (logit[match] - logit[no match]) and the
# match logit alone.
MATCH_MARGIN = "match_logit"
MATCH_LOGIT = "match_logit1"
FUSION_OUTPUTS = (MATCH_MARGIN, MATCH_LOGIT)


class EncoderError(RuntimeError):
    """A model directory cannot be opened by a runtime, or inputs do not fit it."""


# How the runtimes report running out of memory other than by a MemoryError, lower-cased: CUDA ("CUDA
# failure 2: out of memory", torch's "CUDA out of memory", faiss-gpu's "cudaMalloc error out of memory"),
# ONNX Runtime's arenas ("BFCArena::AllocateRawInternal ... Failed to allocate memory for requested buffer"),
# cuDNN and cuBLAS ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED"), torch's CPU allocator
# ("DefaultCPUAllocator: can't allocate memory").
_OUT_OF_MEMORY_MESSAGES = (
    "out of memory",
    "failed to allocate memory",
    "_status_alloc_failed",
    "cudaerrormemoryallocation",
    "can't allocate memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` reports that memory ran out (host or GPU): the process's state at that moment, not
    surely its inputs', so worth trying again later. A ``MemoryError``; torch's ``OutOfMemoryError``
    (``torch.cuda.OutOfMemoryError``, a RuntimeError), recognised by its class's name and module; and a
    plain RuntimeError, another torch error or an ONNX Runtime exception
    (``onnxruntime.capi.onnxruntime_pybind11_state.*``, plain ``Exception`` subclasses) whose message says
    so. By name, never by importing torch or onnxruntime: a serving process may have neither, and importing
    torch takes seconds."""
    if isinstance(exc, MemoryError):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.partition(".")[0] == "torch":
            return True
    # Messages are read only on what the runtimes raise: a plain RuntimeError (torch's and faiss's C++
    # errors), or torch's or ONNX Runtime's own classes. Any other class says what it is by itself: a
    # ValueError saying "out of memory" is about its input, and the project's own errors (an
    # IndexFormatError quoting a faiss error, an EncoderError) keep their meaning whatever they quote.
    module = type(exc).__module__.partition(".")[0]
    if type(exc) is not RuntimeError and module not in ("torch", "onnxruntime"):
        return False
    message = str(exc).lower()
    return any(text in message for text in _OUT_OF_MEMORY_MESSAGES)


@dataclass
class EncodedTexts:
    """Queries encoded by the text tower.

    Attributes:
        embeds: (N, D) float32, L2-normalised; what ANN search uses.
        states: (N, L, H) float32 text-layer states, the fusion scorer's text input.
        mask: (N, L) int64 attention mask.
    """

    embeds: np.ndarray
    states: np.ndarray
    mask: np.ndarray

    def row(self, index: int) -> EncodedTexts:
        length = int(self.mask[index].sum())
        return EncodedTexts(
            self.embeds[index : index + 1],
            self.states[index : index + 1, :length],
            self.mask[index : index + 1, :length],
        )


@dataclass
class EncodedImages:
    """Images encoded by the image tower.

    Attributes:
        embeds: (N, D) float32, L2-normalised.
        tokens: (N, T, W) float32 pooled + patch tokens, the fusion scorer's image input (the re-rank store).
        visual: (N, V) float32, L2-normalised, or None: a purely visual embedding for image-to-image search
            (search by photo, "more like this") when the model has one apart from ``embeds`` (the starter's
            backbone features: its ``embeds`` are class-prototype mixes that keep little visual detail);
            None means ``embeds`` serve image-to-image search too (CCRk's image embedding).
    """

    embeds: np.ndarray
    tokens: np.ndarray
    visual: np.ndarray | None = None

    @property
    def visual_or_embeds(self) -> np.ndarray:
        """The vectors image-to-image search uses."""
        return self.embeds if self.visual is None else self.visual


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model can do beyond embedding text and images.

    Attributes:
        rerank: it has a fusion encoder that scores (query, image) pairs (``score_pairs``); without one the
            index keeps no re-rank store and a request to re-rank is refused.
        fusion_outputs: the scores ``score_pairs`` can return (``MATCH_MARGIN``, ``MATCH_LOGIT``); ONNX
            exports made before the paper's re-rank score have the margin only.
    """

    rerank: bool = False
    fusion_outputs: frozenset[str] = frozenset()


FUSION_CAPABLE = ModelCapabilities(rerank=True, fusion_outputs=frozenset(FUSION_OUTPUTS))


@dataclass(frozen=True)
class Int8Limits:
    """How much recall and consistency the int8 graphs may cost before a runtime refuses them."""

    max_recall_drop_points: float  # mean recall, IR and TR, dual and re-ranked, in points
    max_mrv_increase: float

    def refusal(self, cost: dict | None) -> str | None:
        """None when a measured cost (``model.evaluation.int8_cost``) is within the limits, else why not."""
        if not cost:
            return "its cost was never measured (run `ccrk export int8-cost`)"
        drop, mrv_up = float(cost["max_mean_recall_drop_points"]), float(cost["max_mrv_increase"])
        if drop > self.max_recall_drop_points:
            return f"it costs {drop:.2f} points of mean recall (limit {self.max_recall_drop_points})"
        if mrv_up > self.max_mrv_increase:
            return f"it raises MRV by {mrv_up:.3f} (limit {self.max_mrv_increase})"
        return None


class Encoder(Protocol):
    """What the indexer and the service need from a model."""

    config: ModelConfig
    backend: str
    device: str
    capabilities: ModelCapabilities
    temperature: float  # contrastive temperature, for ``model.reranking.rerank_scores``
    # Languages added to the frozen model by acquirers (``languages/<lang>/``, ``model.acquisition``);
    # ``config.languages`` are the native ones.
    acquired_languages: tuple[str, ...]
    # sha256 of their files (``model.acquisition_format.acquirers_digest``), None without any: query caches
    # key on it, as acquiring a language leaves the model's fingerprint as it is.
    acquirers_digest: str | None

    def encode_text(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> EncodedTexts:
        """Encode queries. ``languages`` (one per text, or None): a text whose language has an acquirer goes
        through it, every other text (None, a native language, an unknown one) through the base text tower
        exactly as without ``languages``."""
        ...

    def encode_images(self, images: Sequence[Image.Image] | np.ndarray) -> EncodedImages:
        """PIL images, or an (N, 3, S, S) uint8 array already resized by ``ImagePreprocessor``."""
        ...

    def score_pairs(
        self, query: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        """Fusion scores (M,) of one encoded query (a ``row``) against M images' tokens (M, T, W): the match
        margin (``match_logit``), or the match logit itself (``match_logit1``, the paper's re-rank score;
        ``model.reranking.MATCH_OUTPUT``). Raises ``EncoderError`` when ``capabilities.rerank`` is false,
        or when the model's export lacks that output."""
        ...

    def score_aligned(
        self, texts: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        """Fusion scores (M,) of M aligned (text, image) pairs: row i of ``texts`` with image i."""
        ...


def broadcast_query(query: EncodedTexts, count: int) -> EncodedTexts:
    """One query repeated ``count`` times (views, no copies), to score it against ``count`` images."""
    return EncodedTexts(
        np.broadcast_to(query.embeds, (count, *query.embeds.shape[1:])),
        np.broadcast_to(query.states, (count, *query.states.shape[1:])),
        np.broadcast_to(query.mask, (count, *query.mask.shape[1:])),
    )


def route_languages(
    texts: Sequence[str], languages: Sequence[str | None] | None, acquired: Sequence[str]
) -> dict[str | None, list[int]] | None:
    """Which texts go where: acquired language -> row indices, ``None`` -> the base tower's rows; None when
    every text goes to the base tower (the caller then runs it exactly as without languages)."""
    if languages is None:
        return None
    if isinstance(languages, str):
        raise EncoderError(
            f"languages must be a sequence with one entry per text, not the string {languages!r}"
        )
    if len(languages) != len(texts):
        raise EncoderError(
            f"languages must have one entry per text: {len(texts)} texts, {len(languages)} languages"
        )
    groups: dict[str | None, list[int]] = {}
    for index, lang in enumerate(languages):
        groups.setdefault(lang if lang in acquired else None, []).append(index)
    return None if set(groups) <= {None} else groups


def merge_encoded(parts: Sequence[tuple[Sequence[int], EncodedTexts]], count: int) -> EncodedTexts:
    """Encoded groups back in the callers' order; states and masks zero-padded to the longest group."""
    first = parts[0][1]
    length = max(p.states.shape[1] for _, p in parts)
    embeds = np.zeros((count, first.embeds.shape[1]), np.float32)
    states = np.zeros((count, length, first.states.shape[2]), np.float32)
    mask = np.zeros((count, length), np.int64)
    for rows, part in parts:
        index = np.asarray(rows, dtype=np.int64)
        width = part.states.shape[1]
        embeds[index] = part.embeds
        states[index, :width] = part.states
        mask[index, :width] = part.mask
    return EncodedTexts(embeds, states, mask)
