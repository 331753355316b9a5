"""The starter (ConSE) model's runtime: the image graph on ONNX Runtime, queries through the multilingual
Universal Sentence Encoder (numpy only). Nothing here imports torch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from model.configs import ConfigError
from model.preprocessing import ImagePreprocessor
from model.runtime.base import EncodedImages, EncodedTexts, EncoderError, ModelCapabilities
from model.starter.components import StarterModelError, check_payload, load_sentence_encoder
from model.starter.config import IMAGE_GRAPH, ConSEConfig


class ConSEEncoder:
    """``Encoder`` of a starter model: cosine similarity in the sentence encoder's space; no fusion."""

    backend = "onnx"
    capabilities = ModelCapabilities(rerank=False)
    # Not used: nothing is re-ranked. Kept for the interface (``rerank_scores`` divides by it).
    temperature = 1.0

    def __init__(self, model_dir: Path, device: str = "auto", threads: int = 2) -> None:
        try:
            self.config = ConSEConfig.from_dict(json.loads((model_dir / "config.json").read_text("utf-8")))
        except (OSError, ValueError, ConfigError) as exc:
            raise EncoderError(f"cannot read {model_dir}/config.json: {exc}") from exc
        try:
            check_payload(model_dir, self.config)
            self._text = load_sentence_encoder(self.config, threads)
        except StarterModelError as exc:
            raise EncoderError(str(exc)) from exc
        providers = ["CPUExecutionProvider"]
        if device in ("auto", "cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        elif device == "cuda":
            raise EncoderError(
                "device 'cuda' requested but onnxruntime has no CUDA provider (install onnxruntime-gpu)"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._image = ort.InferenceSession(str(model_dir / IMAGE_GRAPH), options, providers=providers)
        self.device = "cuda" if self._image.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.preprocessor = ImagePreprocessor(self.config.vision)

    def encode_text(self, texts: Sequence[str]) -> EncodedTexts:
        n = len(texts)
        embeds = np.asarray(self._text.encode([str(t) for t in texts]), dtype=np.float32).reshape(n, -1)
        embeds /= np.maximum(np.linalg.norm(embeds, axis=1, keepdims=True), 1e-12)
        # No text states: there is no fusion encoder to read them.
        return EncodedTexts(embeds, np.zeros((n, 0, 0), np.float32), np.zeros((n, 0), np.int64))

    def encode_images(self, images: Sequence[Image.Image] | np.ndarray) -> EncodedImages:
        pixels = (
            images
            if isinstance(images, np.ndarray)
            else np.stack([self.preprocessor.to_uint8(i) for i in images])
        )
        (embeds,) = self._image.run(["image_embeds"], {"pixel_values": self.preprocessor.normalize(pixels)})
        # No re-rank tokens: an index built with this model keeps no re-rank store.
        return EncodedImages(embeds, np.zeros((embeds.shape[0], 0, 0), np.float32))

    def score_pairs(self, query: EncodedTexts, image_tokens: np.ndarray, output: str = "") -> np.ndarray:
        raise EncoderError(f"{self.config.name} has no fusion encoder: it cannot re-rank")

    def score_aligned(self, texts: EncodedTexts, image_tokens: np.ndarray, output: str = "") -> np.ndarray:
        raise EncoderError(f"{self.config.name} has no fusion encoder: it cannot score pairs")
