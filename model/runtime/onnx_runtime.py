"""The ONNX Runtime encoder: the exported graphs, the tokenizer through ``tokenizers``, images through
numpy and Pillow, and the acquirer graph and tokenizer of each added language (``languages/<lang>/``,
``onnx/text_encoder.<lang>.onnx``). Nothing here imports torch (torch and ONNX Runtime in one process slow
each other)."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image
from tokenizers import Tokenizer

from model.acquisition_format import (
    ACQUIRER_CONFIG,
    ACQUIRER_TOKENIZER,
    AcquirerConfig,
    acquirer_dirs,
    acquirers_digest,
    foreign_base,
)
from model.configs import CCRkConfig, ConfigError
from model.onnx_format import EXPORT_MANIFEST, ONNX_DIR
from model.preprocessing import ImagePreprocessor
from model.runtime.base import (
    MATCH_MARGIN,
    EncodedImages,
    EncodedTexts,
    EncoderError,
    Int8Limits,
    ModelCapabilities,
    broadcast_query,
    merge_encoded,
    route_languages,
)
from store.version.manifest import model_fingerprint


def _fusion_options(threads: int) -> ort.SessionOptions:
    """Re-ranking scores 128 (query, image) pairs in one batch: threads split it (demo model, 2 cores: 39 ms
    with 1 thread, 22.5 ms with 2, the same CPU). Its threads sleep between re-ranks instead of spin-waiting
    on the cores that other queries need."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def execution_providers(device: str) -> list[str]:
    """ONNX Runtime providers for ``device`` (``auto`` takes CUDA when the installed build has it)."""
    providers = ["CPUExecutionProvider"]
    if device in ("auto", "cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
        _preload_cuda_libraries()
    elif device == "cuda":
        raise EncoderError(
            "device 'cuda' requested but onnxruntime has no CUDA provider (install onnxruntime-gpu)"
        )
    return providers


@functools.cache
def _preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-* wheels (installed with torch or onnxruntime-gpu's
    cuda extra) before the first CUDA session: onnxruntime-gpu does not find them on the library path by
    itself, and without them the session silently runs on the CPU. Once per process."""
    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu >= 1.21
    if preload is not None:
        with contextlib.suppress(Exception):  # best effort: libraries on the system path work without it
            preload(msvc=False)


def _text_tokenizer(path: Path, max_length: int, pad_id: int) -> Tokenizer:
    if not path.is_file():
        raise EncoderError(f"tokenizer file not found: {path}")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=tokenizer.id_to_token(pad_id) or "<pad>")
    return tokenizer


def session_options(threads: int, spinning: bool = True) -> ort.SessionOptions:
    """``spinning`` False: idle intra-op threads sleep instead of spin-waiting (``load_encoder``). The same
    kernels either way: the outputs are the same bytes."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxEncoder:
    backend = "onnx"

    def __init__(
        self,
        model_dir: Path,
        device: str = "auto",
        threads: int = 2,
        int8: bool = False,
        int8_limits: Int8Limits | None = None,
        fusion_threads: int | None = None,
        cuda_options: dict[str, str] | None = None,
        spinning: bool = True,
    ) -> None:
        """``cuda_options``: options of ONNX Runtime's CUDA provider (e.g. ``{"use_tf32": "0"}`` for full
        fp32 matrix products; the provider's default uses TF32 on Ampere and newer)."""
        onnx_dir = model_dir / ONNX_DIR
        manifest_path = onnx_dir / EXPORT_MANIFEST
        if not manifest_path.is_file():
            raise EncoderError(
                f"{model_dir} has no ONNX export ({manifest_path} missing); run `ccrk export onnx`"
            )
        try:
            self.config = CCRkConfig.load(model_dir / "config.json")
        except ConfigError as exc:
            raise EncoderError(str(exc)) from exc
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if "temperature" not in manifest:
            raise EncoderError(f"{manifest_path} has no 'temperature'; re-run `ccrk export onnx`")
        self.temperature = float(manifest["temperature"])
        providers: list[Any] = list(execution_providers(device))
        if cuda_options and providers[0] == "CUDAExecutionProvider":
            providers[0] = ("CUDAExecutionProvider", dict(cuda_options))
        options = session_options(threads, spinning)
        graphs = dict(manifest["graphs"])
        # Why int8 was asked for but not used (its measured cost is unknown or above the limits).
        self.int8_refusal: str | None = None
        if int8 and int8_limits is not None:
            self.int8_refusal = int8_limits.refusal(manifest.get("int8_cost"))
            int8 = self.int8_refusal is None
        if int8:
            quantized = manifest.get("int8_graphs")
            if not quantized:
                raise EncoderError(f"{model_dir} has no int8 graphs; run `ccrk export onnx --int8`")
            graphs.update(quantized)
        self.int8 = int8
        # The text graph is loaded on first use: a rebuild that only encodes images never pays for it.
        self._text_args = (str(onnx_dir / graphs["text"]), options, providers)
        self._text_session: ort.InferenceSession | None = None
        self._lazy_lock = threading.Lock()
        self._image = ort.InferenceSession(str(onnx_dir / graphs["image"]), options, providers=providers)
        # The fusion graph too, on first use (re-ranking, or asking the capabilities): a rebuild that
        # encodes a few images never scores pairs (creating its session was ~40 % of loading the encoder).
        fusion_options = _fusion_options(fusion_threads or threads)
        self._fusion_args = (str(onnx_dir / graphs["fusion"]), fusion_options, providers)
        self._fusion_session: ort.InferenceSession | None = None
        self._capabilities: ModelCapabilities | None = None
        self.device = "cuda" if self._image.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        if (
            device == "cuda" and self.device != "cuda"
        ):  # ONNX Runtime falls back to the CPU with a log line only
            raise EncoderError(
                "device 'cuda' requested but ONNX Runtime's CUDA provider did not start (CUDA or cuDNN"
                " libraries not found: see its log above)"
            )
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise EncoderError(f"{model_dir} has no tokenizer.json")
        # Read on first use, as the text graph is: a rebuild that only encodes images never needs it.
        self._tokenizer_args = (tokenizer_file, self.config.text.max_length, self.config.text.pad_token_id)
        self._tokenizer: Tokenizer | None = None
        self.preprocessor = ImagePreprocessor(self.config.vision)
        # Acquirer graphs stay fp32 whatever ``int8`` says: they were never quantized or measured.
        self._acquirers = self._load_acquirers(model_dir, onnx_dir, options, providers)
        self.acquired_languages: tuple[str, ...] = tuple(self._acquirers)
        self.acquirers_digest: str | None = acquirers_digest(model_dir)

    @property
    def _fusion(self) -> ort.InferenceSession:
        if self._fusion_session is None:
            with self._lazy_lock:
                if self._fusion_session is None:
                    path, options, providers = self._fusion_args
                    self._fusion_session = ort.InferenceSession(path, options, providers=providers)
        return self._fusion_session

    @property
    def fusion_outputs(self) -> frozenset[str]:
        """The fusion graph's outputs: exports before the paper's re-rank score have the match margin only."""
        return self.capabilities.fusion_outputs

    @property
    def capabilities(self) -> ModelCapabilities:
        if self._capabilities is None:
            outputs = frozenset(o.name for o in self._fusion.get_outputs())
            self._capabilities = ModelCapabilities(rerank=True, fusion_outputs=outputs)
        return self._capabilities

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            with self._lazy_lock:
                if self._tokenizer is None:
                    self._tokenizer = _text_tokenizer(*self._tokenizer_args)
        return self._tokenizer

    @property
    def _text(self) -> ort.InferenceSession:
        if self._text_session is None:
            with self._lazy_lock:
                if self._text_session is None:
                    path, options, providers = self._text_args
                    self._text_session = ort.InferenceSession(path, options, providers=providers)
        return self._text_session

    def _load_acquirers(
        self, model_dir: Path, onnx_dir: Path, options: ort.SessionOptions, providers: list[Any]
    ) -> dict[str, tuple[Tokenizer, ort.InferenceSession]]:
        dirs = acquirer_dirs(model_dir)
        if not dirs:
            return {}
        fingerprint = model_fingerprint(model_dir)
        acquirers = {}
        for lang, lang_dir in dirs.items():
            try:
                config = AcquirerConfig.load(lang_dir / ACQUIRER_CONFIG)
            except ConfigError as exc:
                raise EncoderError(str(exc)) from exc
            refusal = foreign_base(config, lang_dir, model_dir, fingerprint)
            if refusal:
                raise EncoderError(refusal)
            graph = onnx_dir / (config.onnx_graph or f"text_encoder.{lang}.onnx")
            if not graph.is_file():
                raise EncoderError(
                    f"{model_dir} has the {lang} acquirer but not its graph {graph}; add the language "
                    "again after `ccrk export onnx`"
                )
            tokenizer = _text_tokenizer(
                lang_dir / ACQUIRER_TOKENIZER, config.max_length, self.config.text.pad_token_id
            )
            acquirers[lang] = (tokenizer, ort.InferenceSession(str(graph), options, providers=providers))
        return acquirers

    def encode_text(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> EncodedTexts:
        groups = route_languages(texts, languages, self.acquired_languages)
        if groups is None:
            return self._encode(self.tokenizer, self._text, texts)
        parts = []
        for lang, rows in groups.items():
            tokenizer, graph = (self.tokenizer, self._text) if lang is None else self._acquirers[lang]
            parts.append((rows, self._encode(tokenizer, graph, [texts[i] for i in rows])))
        return merge_encoded(parts, len(texts))

    @staticmethod
    def _encode(tokenizer: Tokenizer, graph: ort.InferenceSession, texts: Sequence[str]) -> EncodedTexts:
        encodings = tokenizer.encode_batch([str(t) for t in texts])
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        embeds, states = graph.run(None, {"input_ids": ids, "attention_mask": mask})
        return EncodedTexts(embeds, states, mask)

    def encode_images(self, images: Sequence[Image.Image] | np.ndarray) -> EncodedImages:
        pixels = (
            images
            if isinstance(images, np.ndarray)
            else np.stack([self.preprocessor.to_uint8(i) for i in images])
        )
        embeds, tokens = self._image.run(None, {"pixel_values": self.preprocessor.normalize(pixels)})
        return EncodedImages(embeds, tokens)

    def score_pairs(
        self, query: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        return self.score_aligned(broadcast_query(query, image_tokens.shape[0]), image_tokens, output)

    def score_aligned(
        self, texts: EncodedTexts, image_tokens: np.ndarray, output: str = MATCH_MARGIN
    ) -> np.ndarray:
        if output not in self.fusion_outputs:
            raise EncoderError(
                f"this model's fusion graph has no output {output!r} (it has {sorted(self.fusion_outputs)}); "
                "re-run `ccrk export onnx` to add it"
            )
        (logits,) = self._fusion.run(
            [output],
            {
                "text_states": np.ascontiguousarray(texts.states, dtype=np.float32),
                "attention_mask": np.ascontiguousarray(texts.mask, dtype=np.int64),
                "image_tokens": np.ascontiguousarray(image_tokens, dtype=np.float32),
            },
        )
        return logits
