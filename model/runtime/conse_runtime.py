"""The starter (ConSE) model's runtime: the image graph on ONNX Runtime, queries through the multilingual
Universal Sentence Encoder (numpy only). Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from model.configs import ConfigError
from model.model_dir import load_model_config
from model.preprocessing import ImagePreprocessor
from model.runtime.base import EncodedImages, EncodedTexts, EncoderError, ModelCapabilities, route_languages
from model.runtime.onnx_runtime import execution_providers, session_options
from model.starter.components import StarterModelError, check_payload, load_sentence_encoder
from model.starter.config import IMAGE_GRAPH, VISUAL_OUTPUT, ConSEConfig


class ConSEEncoder:
    """``Encoder`` of a starter model: cosine similarity in the sentence encoder's space; no fusion."""

    backend = "onnx"
    capabilities = ModelCapabilities(rerank=False)
    # Not used: nothing is re-ranked. Kept for the interface (``rerank_scores`` divides by it).
    temperature = 1.0
    int8 = False
    # The sentence encoder reads every language it reads without being told which; no acquirers.
    acquired_languages: tuple[str, ...] = ()
    acquirers_digest: str | None = None

    def __init__(
        self,
        model_dir: Path,
        device: str = "auto",
        threads: int = 2,
        int8: bool = False,
        spinning: bool = True,
    ) -> None:
        try:
            config = load_model_config(model_dir)
        except ConfigError as exc:
            raise EncoderError(str(exc)) from exc
        if not isinstance(config, ConSEConfig):
            raise EncoderError(f"{model_dir} is not a starter model")
        self.config = config
        # As the ONNX encoder does when its int8 graphs are refused: say why, serve fp32.
        self.int8_refusal = "the starter model has no int8 graphs" if int8 else None
        try:
            check_payload(model_dir, config)
            # One BLAS thread: a query is one short sentence, and the sentence encoder sets its thread limit
            # around every call (process-wide), which must stay the service's.
            self._text = load_sentence_encoder(config, threads=1)
        except StarterModelError as exc:
            raise EncoderError(str(exc)) from exc
        self._image = ort.InferenceSession(
            str(model_dir / IMAGE_GRAPH),
            session_options(threads, spinning),
            providers=execution_providers(device),
        )
        # Starter models built before the visual output existed: image-to-image search uses the embeddings.
        outputs = {o.name for o in self._image.get_outputs()}
        self._outputs = ["image_embeds", VISUAL_OUTPUT] if VISUAL_OUTPUT in outputs else ["image_embeds"]
        self.device = "cuda" if self._image.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.preprocessor = ImagePreprocessor(config.vision)
        # The sentence encoder loads its tokenizer and weights on first use (2.4 s on 2 cores): a rebuild
        # that encodes a few images only never pays it, and the service encodes a text before it reports
        # ready (``service.runtime``), so no query does either.

    def encode_text(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> EncodedTexts:
        route_languages(texts, languages, self.acquired_languages)  # checks the argument; routes nowhere
        n = len(texts)
        dim = self.config.embed_dim
        embeds = (
            np.asarray(self._text.encode([str(t) for t in texts]), dtype=np.float32).reshape(n, dim)
            if n
            else np.zeros((0, dim), np.float32)
        )
        embeds /= np.maximum(np.linalg.norm(embeds, axis=1, keepdims=True), 1e-12)
        # No text states: there is no fusion encoder to read them.
        return EncodedTexts(embeds, np.zeros((n, 0, 0), np.float32), np.zeros((n, 0), np.int64))

    def encode_images(self, images: Sequence[Image.Image] | np.ndarray) -> EncodedImages:
        pixels = (
            images
            if isinstance(images, np.ndarray)
            else np.stack([self.preprocessor.to_uint8(i) for i in images])
        )
        out = self._image.run(self._outputs, {"pixel_values": self.preprocessor.normalize(pixels)})
        embeds, visual = out[0], (out[1] if len(out) > 1 else None)
        # No re-rank tokens: an index built with this model keeps no re-rank store.
        return EncodedImages(embeds, np.zeros((embeds.shape[0], 0, 0), np.float32), visual)

    def score_pairs(self, query: EncodedTexts, image_tokens: np.ndarray, output: str = "") -> np.ndarray:
        raise EncoderError(f"{self.config.name} has no fusion encoder: it cannot re-rank")

    def score_aligned(self, texts: EncodedTexts, image_tokens: np.ndarray, output: str = "") -> np.ndarray:
        raise EncoderError(f"{self.config.name} has no fusion encoder: it cannot score pairs")
