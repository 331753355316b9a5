"""The torch runtime: a CCRkModel and its tokenizer; CUDA when present."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerBase

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
)
from model.tokenization import TokenizerError, load_tokenizer, tokenize


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
        self._wrap(model, tokenizer, device, ImagePreprocessor(model.config.vision))

    @classmethod
    def from_model(
        cls,
        model: CCRkModel,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device | str = "cpu",
        preprocessor: ImagePreprocessor | None = None,
    ) -> TorchEncoder:
        """The interface over a model already in memory (one being trained or evaluated), so that it is
        evaluated like any served model; it stays on ``device`` and the thread settings are left alone."""
        encoder = cls.__new__(cls)
        encoder._wrap(model, tokenizer, str(device), preprocessor or ImagePreprocessor(model.config.vision))
        return encoder

    def _wrap(
        self,
        model: CCRkModel,
        tokenizer: PreTrainedTokenizerBase,
        device: str,
        preprocessor: ImagePreprocessor,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.temperature = float(model.temperature.detach())
        self.device = device
        self.preprocessor = preprocessor

    @torch.inference_mode()
    def encode_text(self, texts: Sequence[str]) -> EncodedTexts:
        batch = tokenize(self.tokenizer, list(texts), self.config.text.max_length)
        out = self.model.encode_text(
            batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        )
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
