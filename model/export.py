"""ONNX export of the serving paths, written into the model directory beside the torch weights:

- ``onnx/text_encoder.onnx``: (input_ids, attention_mask) -> (text_embeds, text_states); the query path.
- ``onnx/image_encoder.onnx``: pixel_values -> (image_embeds, image_tokens); the indexing path.
- ``onnx/fusion_scorer.onnx``: (text_states, attention_mask, image_tokens) -> match_logit (the margin
  ``logit[match] - logit[no match]``) and, with ``match_logit1=True``, also match_logit1 (``logit[match]``,
  the paper's re-rank score); re-ranking.

Batch and sequence axes are dynamic. The scorer takes the query's text states (from the text graph) rather
than token ids, so re-ranking 128 candidates runs the text layers once, not 128 times.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.modeling import CCRkModel
from model.onnx_format import (
    EXPORT_MANIFEST,
    FUSION_GRAPH,
    FUSION_GRAPH_INT8,
    IMAGE_GRAPH,
    ONNX_DIR,
    TEXT_GRAPH,
    TEXT_GRAPH_INT8,
)

OPSET = 17


class ExportError(RuntimeError):
    """A graph could not be exported."""


class _TextGraph(nn.Module):
    def __init__(self, model: CCRkModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model.encode_text(input_ids, attention_mask)
        return out.text_embeds, out.last_hidden_state


class _ImageGraph(nn.Module):
    def __init__(self, model: CCRkModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model.encode_image(pixel_values)
        return out.image_embeds, out.image_tokens


class _FusionGraph(nn.Module):
    """The match margin (``match_logit``, what ``model.reranking``'s default score adds) and, when asked,
    the match logit itself (``match_logit1``, what the paper's ``itm_logit`` score ranks by)."""

    def __init__(self, model: CCRkModel, match_logit1: bool = False) -> None:
        super().__init__()
        self.model = model
        self.match_logit1 = match_logit1

    def forward(
        self, text_states: torch.Tensor, attention_mask: torch.Tensor, image_tokens: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.fuse(text_states, attention_mask, image_tokens).itm_logits
        margin = logits[:, 1] - logits[:, 0]
        return (margin, logits[:, 1]) if self.match_logit1 else margin


@dataclass
class ExportedGraphs:
    text: Path
    image: Path
    fusion: Path


def export_graph(
    module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], axes: dict
) -> None:
    tmp = path.with_suffix(".onnx.tmp")
    # A wrapper left in training mode would be flipped back to train() after export, and with it the model.
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side shape arithmetic
        try:
            torch.onnx.export(
                module,
                args,
                str(tmp),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        except Exception as exc:  # the exporter raises many unrelated types
            tmp.unlink(missing_ok=True)
            raise ExportError(f"exporting {path.name} failed: {exc}") from exc
    tmp.replace(path)


@torch.no_grad()
def export_onnx(model: CCRkModel, model_dir: Path, match_logit1: bool = True) -> ExportedGraphs:
    """Write the three graphs (fp32) under ``model_dir/onnx/``.

    ``match_logit1`` adds the fusion scorer's second output ``match_logit1`` (the paper's re-rank score)
    after ``match_logit``, which stays the first output and unchanged; the manifest's ``fusion_outputs``
    lists the outputs. The runtimes ask for an output by name, so exports without it still serve the
    default score.
    """
    model = model.eval().cpu()
    out = Path(model_dir) / ONNX_DIR
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    size = cfg.vision.image_size
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]], dtype=torch.long)
    ids = ids.clamp(max=cfg.text.vocab_size - 1)
    mask = (ids != cfg.text.pad_token_id).long()
    pixels = torch.zeros(2, 3, size, size)
    text_states = model.encode_text(ids, mask).last_hidden_state
    image_tokens = model.encode_image(pixels).image_tokens

    graphs = ExportedGraphs(out / TEXT_GRAPH, out / IMAGE_GRAPH, out / FUSION_GRAPH)
    export_graph(
        _TextGraph(model),
        (ids, mask),
        graphs.text,
        ["input_ids", "attention_mask"],
        ["text_embeds", "text_states"],
        {
            "input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "text_embeds": {0: "batch"},
            "text_states": {0: "batch", 1: "sequence"},
        },
    )
    export_graph(
        _ImageGraph(model),
        (pixels,),
        graphs.image,
        ["pixel_values"],
        ["image_embeds", "image_tokens"],
        {"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}, "image_tokens": {0: "batch"}},
    )
    fusion_outputs = ["match_logit", "match_logit1"] if match_logit1 else ["match_logit"]
    export_graph(
        _FusionGraph(model, match_logit1),
        (text_states, mask, image_tokens),
        graphs.fusion,
        ["text_states", "attention_mask", "image_tokens"],
        fusion_outputs,
        {
            "text_states": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "image_tokens": {0: "batch"},
            **{name: {0: "batch"} for name in fusion_outputs},
        },
    )
    manifest = {
        "opset": OPSET,
        "graphs": {"text": TEXT_GRAPH, "image": IMAGE_GRAPH, "fusion": FUSION_GRAPH},
        "fusion_outputs": fusion_outputs,
        "embed_dim": cfg.embed_dim,
        "image_size": size,
        "mean": list(cfg.vision.mean),
        "std": list(cfg.vision.std),
        "max_length": cfg.text.max_length,
        "pad_token_id": cfg.text.pad_token_id,
        # The trained contrastive temperature: re-ranking adds similarity / temperature to the match margin.
        "temperature": float(model.temperature.detach()),
    }
    (out / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return graphs


def quantize_int8(model_dir: Path) -> list[Path]:
    """Dynamic int8 quantization (weights int8, activations quantized on the fly) of the query path and the
    fusion scorer, written beside the fp32 graphs and recorded in the export manifest. The image path stays
    fp32: it runs offline in the indexer, where accuracy matters more than latency."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx_dir = Path(model_dir) / ONNX_DIR
    manifest_path = onnx_dir / EXPORT_MANIFEST
    if not manifest_path.is_file():
        raise ExportError(f"{model_dir} has no ONNX export to quantize; export it first")
    written = []
    for source, target in ((TEXT_GRAPH, TEXT_GRAPH_INT8), (FUSION_GRAPH, FUSION_GRAPH_INT8)):
        tmp = onnx_dir / f".{target}.tmp"
        quantize_dynamic(onnx_dir / source, tmp, weight_type=QuantType.QInt8, per_channel=True)
        tmp.replace(onnx_dir / target)
        written.append(onnx_dir / target)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["int8_graphs"] = {"text": TEXT_GRAPH_INT8, "fusion": FUSION_GRAPH_INT8}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return written


def record_int8_cost(model_dir: Path, cost: dict[str, Any]) -> None:
    """Store a measured int8 cost (``model.evaluation.int8_cost``) in the export manifest, where the ONNX
    runtime reads it to decide whether int8 graphs may serve."""
    manifest_path = Path(model_dir) / ONNX_DIR / EXPORT_MANIFEST
    if not manifest_path.is_file():
        raise ExportError(f"{model_dir} has no ONNX export; run `ccrk export onnx --int8` first")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if "int8_graphs" not in manifest:
        raise ExportError(f"{model_dir} has no int8 graphs; run `ccrk export onnx --int8` first")
    manifest["int8_cost"] = cost
    tmp = manifest_path.with_name(f".{manifest_path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(manifest_path)
