"""The starter model's parts outside ONNX: the payload check and the installed sentence encoder. No torch,
no onnxruntime: shared by the builder (torch) and the serving runtime (ONNX Runtime)."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from model.starter.config import IMAGE_GRAPH, ConSEConfig, sha256_file


class StarterModelError(RuntimeError):
    """A starter model directory is damaged, or the package it needs is missing or of another version."""


def check_payload(model_dir: Path, config: ConSEConfig) -> None:
    """Every payload file the config names is present with the recorded digest (a swapped or truncated
    graph would embed images differently from the index built with it)."""
    if IMAGE_GRAPH not in config.files:
        raise StarterModelError(f"{model_dir}/config.json records no digest for {IMAGE_GRAPH}")
    for name, digest in config.files.items():
        path = model_dir / name
        if not path.is_file():
            raise StarterModelError(f"{path} is missing; rebuild the model with `ccrk model build-starter`")
        if sha256_file(path) != digest:
            raise StarterModelError(
                f"{path} does not match the digest in config.json; the model directory is damaged"
            )


def load_sentence_encoder(config: ConSEConfig, threads: int) -> Any:
    """The installed sentence encoder, refused unless it is the version the class prototypes were made
    with (another version embeds queries differently from the prototypes)."""
    ref = config.text_encoder
    try:
        installed = version(ref.package)
    except PackageNotFoundError as exc:
        raise StarterModelError(
            f"the starter model needs the package {ref.package}=={ref.version} (pip install it)"
        ) from exc
    if installed != ref.version:
        raise StarterModelError(
            f"the starter model was built with {ref.package} {ref.version}, but {installed} is installed; "
            "install that version, or rebuild the model (`ccrk model build-starter`) and re-index"
        )
    return import_module(ref.module).USE(threads=threads)
