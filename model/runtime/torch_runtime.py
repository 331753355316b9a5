"""The torch runtime: a CCRkModel and its tokenizer, and the acquirers of its added languages
(``languages/<lang>/``, ``model.acquisition``); CUDA when present."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerBase

from model.acquisition import LanguageAcquirer, load_acquirer
from model.acquisition_format import acquirer_dirs, acquirers_digest, foreign_base
from model.modeling import CCRkModel, CheckpointError
from model.preprocessing import ImagePreprocessor
from model.runtime.base import (
    FUSION_CAPABLE,
    FUSION_OUTPUTS,
    MATCH_LOGIT,
    MATCH_MARGIN,
    EncodedImages,
    EncodedTexts,
    EncoderError,
    broadcast_query,
    merge_encoded,
    route_languages,
)
from model.tokenization import TokenizerError, load_tokenizer, tokenize
from store.version.manifest import model_fingerprint

Acquirers = Mapping[str, tuple[LanguageAcquirer, PreTrainedTokenizerBase]]


def load_acquirers(model_dir: Path, model: CCRkModel, device: str) -> dict[str, tuple]:
    """Every ``languages/<lang>/`` acquirer of a model directory over ``model``; one trained over other
    weights (another fingerprint) is refused."""
    dirs = acquirer_dirs(model_dir)
    if not dirs:
        return {}
    fingerprint = model_fingerprint(model_dir)
    acquirers = {}
    for lang, lang_dir in dirs.items():
        try:
            acquirer, tokenizer = load_acquirer(lang_dir, model, map_location=device)
        except CheckpointError as exc:
            raise EncoderError(str(exc)) from exc
        refusal = foreign_base(acquirer.config, lang_dir, model_dir, fingerprint)
        if refusal:
            raise EncoderError(refusal)
        acquirers[lang] = (acquirer, tokenizer)
    return acquirers


class TorchEncoder:
    backend = "torch"
    capabilities = FUSION_CAPABLE

    def __init__(self, model_dir: Path, device: str = "auto", threads: int = 2) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(threads)
        try:
            model = CCRkModel.from_pretrained(model_dir, map_location=device)
            tokenizer = load_tokenizer(model_dir)
        except (CheckpointError, TokenizerError) as exc:
            raise EncoderError(str(exc)) from exc
        acquirers = load_acquirers(Path(model_dir), model, device)
        self._wrap(model, tokenizer, device, ImagePreprocessor(model.config.vision), acquirers)
        self.acquirers_digest = acquirers_digest(model_dir)

    @classmethod
    def from_model(
        cls,
        model: CCRkModel,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device | str = "cpu",
        preprocessor: ImagePreprocessor | None = None,
        acquirers: Acquirers | None = None,
    ) -> TorchEncoder:
        """The interface over a model already in memory (one being trained or evaluated), so that it is
        evaluated like any served model; it stays on ``device`` and the thread settings are left alone.
        ``acquirers``: language -> (acquirer over ``model``, its tokenizer), as ``load_acquirer`` gives."""
        encoder = cls.__new__(cls)
        encoder._wrap(
            model,
            tokenizer,
            str(device),
            preprocessor or ImagePreprocessor(model.config.vision),
            dict(acquirers or {}),
        )
        return encoder

    def _wrap(
        self,
        model: CCRkModel,
        tokenizer: PreTrainedTokenizerBase,
        device: str,
        preprocessor: ImagePreprocessor,
        acquirers: dict[str, tuple] | None = None,
    ) -> None:
        self.model = model.eval()
        self.acquirers: dict[str, tuple] = acquirers or {}
        for acquirer, _ in self.acquirers.values():
            if acquirer.base is not model:
                raise EncoderError(f"the {acquirer.config.lang} acquirer was built over another model object")
            acquirer.eval()
        self.acquired_languages: tuple[str, ...] = tuple(self.acquirers)
        self.acquirers_digest: str | None = None  # of the files loaded (``model.acquisition_format``)
        self.tokenizer = tokenizer
        self.config = model.config
        self.temperature = float(model.temperature.detach())
        self.device = device
        self.preprocessor = preprocessor

    def encode_text(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> EncodedTexts:
        groups = route_languages(texts, languages, self.acquired_languages)
        if groups is None:
            return self._encode(self.model, self.tokenizer, self.config.text.max_length, texts)
        parts = []
        for lang, rows in groups.items():
            chosen = [texts[i] for i in rows]
            if lang is None:
                parts.append(
                    (rows, self._encode(self.model, self.tokenizer, self.config.text.max_length, chosen))
                )
            else:
                acquirer, tokenizer = self.acquirers[lang]
                parts.append((rows, self._encode(acquirer, tokenizer, acquirer.config.max_length, chosen)))
        return merge_encoded(parts, len(texts))

    @torch.inference_mode()
    def _encode(
        self,
        encoder: CCRkModel | LanguageAcquirer,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        texts: Sequence[str],
    ) -> EncodedTexts:
        batch = tokenize(tokenizer, list(texts), max_length)
        out = encoder.encode_text(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))
        return EncodedTexts(
            out.text_embeds.float().cpu().numpy(),
            out.last_hidden_state.float().cpu().numpy(),
            batch["attention_mask"].numpy(),
        )

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Image.Image] | np.ndarray) -> EncodedImages:
        pixels = (
            images
            if isinstance(images, np.ndarray)
            else np.stack([self.preprocessor.to_uint8(i) for i in images])
        )
        out = self.model.encode_image(torch.from_numpy(self.preprocessor.normalize(pixels)).to(self.device))
        return EncodedImages(out.image_embeds.float().cpu().numpy(), out.image_tokens.float().cpu().numpy())

    def score_pairs(
        self, query: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        return self.score_aligned(broadcast_query(query, image_tokens.shape[0]), image_tokens, output)

    @torch.inference_mode()
    def score_aligned(
        self, texts: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        if output not in FUSION_OUTPUTS:
            raise EncoderError(f"unknown fusion output {output!r}; one of {', '.join(FUSION_OUTPUTS)}")
        states = torch.from_numpy(np.ascontiguousarray(texts.states)).to(self.device)
        mask = torch.from_numpy(np.ascontiguousarray(texts.mask)).to(self.device)
        tokens = torch.from_numpy(np.ascontiguousarray(image_tokens, dtype=np.float32)).to(self.device)
        logits = self.model.fuse(states, mask, tokens).itm_logits.float()
        scores = logits[:, 1] if output == MATCH_LOGIT else logits[:, 1] - logits[:, 0]
        return scores.cpu().numpy()
