"""Encoder runtimes: the small interface everything downstream (indexer, service) uses to run a model.

``load_encoder`` picks a runtime by name; each is imported only when chosen, so a process serving with
ONNX Runtime never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from model.runtime.base import EncodedImages, EncodedTexts, Encoder, EncoderError

BACKENDS = ("torch", "onnx")

__all__ = ["BACKENDS", "EncodedImages", "EncodedTexts", "Encoder", "EncoderError", "load_encoder"]


def load_encoder(
    model_dir: Path | str, backend: str = "onnx", device: str = "auto", threads: int = 2
) -> Encoder:
    """Open a model directory with the given runtime (``torch`` or ``onnx``); ``device`` ``auto`` uses CUDA
    when present (the CUDA execution provider for ONNX Runtime)."""
    if backend == "torch":
        from model.runtime.torch_runtime import TorchEncoder

        return TorchEncoder(Path(model_dir), device=device, threads=threads)
    if backend == "onnx":
        from model.runtime.onnx_runtime import OnnxEncoder

        return OnnxEncoder(Path(model_dir), device=device, threads=threads)
    raise EncoderError(f"unknown encoder backend {backend!r}; choose one of {', '.join(BACKENDS)}")
