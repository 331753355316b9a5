"""ONNX export: ONNX Runtime against torch on the same inputs, fp32, batch 1 and 16."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from model.export import export_onnx
from model.modeling import CCRkModel
from tests.tiny import tiny_config

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    model = CCRkModel(tiny_config(vocab_size=600, pooling="mean")).eval()
    graphs = export_onnx(model, tmp_path_factory.mktemp("model"))
    assert not model.training  # exporting must not flip the model back to training mode
    return model, graphs


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def text_batch(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 600, (batch, length), generator=gen)
    ids[:, 0] = 0
    mask = torch.ones_like(ids)
    if batch > 1:  # a padded row: dynamic masks must match torch too
        mask[1, length // 2 :] = 0
        ids[1, length // 2 :] = 1
    return ids, mask


@pytest.mark.parametrize("batch", [1, 16])
def test_text_graph_parity(exported, batch: int) -> None:
    model, graphs = exported
    ids, mask = text_batch(batch, 11, batch)
    embeds, states = session(graphs.text).run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    )
    with torch.no_grad():
        ref = model.encode_text(ids, mask)
    assert np.abs(embeds - ref.text_embeds.numpy()).max() <= TOLERANCE
    assert np.abs(states - ref.last_hidden_state.numpy()).max() <= TOLERANCE


@pytest.mark.parametrize("batch", [1, 16])
def test_image_graph_parity(exported, batch: int) -> None:
    model, graphs = exported
    pixels = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
    embeds, tokens = session(graphs.image).run(None, {"pixel_values": pixels.numpy()})
    with torch.no_grad():
        ref = model.encode_image(pixels)
    assert np.abs(embeds - ref.image_embeds.numpy()).max() <= TOLERANCE
    assert np.abs(tokens - ref.image_tokens.numpy()).max() <= TOLERANCE


@pytest.mark.parametrize("batch", [1, 16])
def test_fusion_graph_parity(exported, batch: int) -> None:
    model, graphs = exported
    ids, mask = text_batch(batch, 9, 100 + batch)
    pixels = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        states = model.encode_text(ids, mask).last_hidden_state
        tokens = model.encode_image(pixels).image_tokens
        logits = model.fuse(states, mask, tokens).itm_logits
    match, match1 = session(graphs.fusion).run(
        None, {"text_states": states.numpy(), "attention_mask": mask.numpy(), "image_tokens": tokens.numpy()}
    )
    assert match.shape == match1.shape == (batch,)
    assert np.abs(match - (logits[:, 1] - logits[:, 0]).numpy()).max() <= TOLERANCE
    assert np.abs(match1 - logits[:, 1].numpy()).max() <= TOLERANCE
