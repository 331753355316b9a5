"""Encoder runtimes: the small interface everything downstream (indexer, service) uses to run a model.

``load_encoder`` picks a runtime by name; each is imported only when chosen, so a process serving with
ONNX Runtime never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from model.model_dir import declared_architecture
from model.runtime.base import (
    EncodedImages,
    EncodedTexts,
    Encoder,
    EncoderError,
    Int8Limits,
    ModelCapabilities,
    is_out_of_memory,
)
from model.starter.config import ARCHITECTURE as CONSE

BACKENDS = ("torch", "onnx")

__all__ = [
    "BACKENDS",
    "EncodedImages",
    "EncodedTexts",
    "Encoder",
    "EncoderError",
    "Int8Limits",
    "ModelCapabilities",
    "is_out_of_memory",
    "load_encoder",
]


def load_encoder(
    model_dir: Path | str,
    backend: str = "onnx",
    device: str = "auto",
    threads: int = 2,
    int8: bool = False,
    int8_limits: Int8Limits | None = None,
    fusion_threads: int | None = None,
    spinning: bool = True,
) -> Encoder:
    """Open a model directory with the given runtime (``torch`` or ``onnx``); ``device`` ``auto`` uses CUDA
    when present (the CUDA execution provider for ONNX Runtime). ``int8`` selects the dynamically
    quantized query and fusion graphs (ONNX only); with ``int8_limits`` they are used only when their
    measured cost (recorded by ``ccrk export int8-cost``) is within the limits, else fp32 serves and
    ``encoder.int8_refusal`` says why. ``fusion_threads`` (ONNX only; default ``threads``): intra-op threads
    of the fusion graph, which re-ranks many candidates in one batch. ``spinning`` False (ONNX Runtime
    graphs): their threads sleep between parallel sections instead of spin-waiting, for a caller that runs
    them a few times only (a rebuild encoding a few images: spinning threads cost CPU from the session's
    creation on, more than they save).

    A starter (ConSE) model directory always runs on ONNX Runtime and numpy (it has no torch weights) and
    has no fusion graph; asked for int8, it serves fp32 and says why in ``int8_refusal``."""
    model_dir = Path(model_dir)
    if backend not in BACKENDS:
        raise EncoderError(f"unknown encoder backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if declared_architecture(model_dir) == CONSE:
        from model.runtime.conse_runtime import ConSEEncoder

        return ConSEEncoder(model_dir, device=device, threads=threads, int8=int8, spinning=spinning)
    if backend == "torch":
        from model.runtime.torch_runtime import TorchEncoder

        if int8:
            raise EncoderError("int8 graphs exist for the onnx backend only")
        return TorchEncoder(Path(model_dir), device=device, threads=threads)
    if backend == "onnx":
        from model.runtime.onnx_runtime import OnnxEncoder

        return OnnxEncoder(
            Path(model_dir),
            device=device,
            threads=threads,
            int8=int8,
            int8_limits=int8_limits,
            fusion_threads=fusion_threads,
            spinning=spinning,
        )
    raise AssertionError(backend)  # checked above
