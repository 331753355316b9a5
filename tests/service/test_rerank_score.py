"""``CCRK_RERANK_SCORE=itm_logit``: the paper's re-ranking (the match logit alone) served end to end, and
refused at startup for an export that lacks the match logit (the shipped demo model's graphs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR
from model.export import export_onnx
from model.modeling import CCRkModel
from model.runtime import EncoderError, load_encoder
from service.app import create_app
from tests.fixtures import Catalogue, LiveServer, make_settings


@pytest.fixture(scope="module")
def reexported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with a fresh ONNX export (the same weights, so the same fingerprint)."""
    target = tmp_path_factory.mktemp("model") / "ccrk-demo"
    shutil.copytree(DEFAULT_MODEL_DIR, target)
    export_onnx(CCRkModel.from_pretrained(target).eval(), target)
    return target


def test_paper_score_ranks_by_the_match_logit(
    index_root: Path, catalogue: Catalogue, reexported: Path
) -> None:
    settings = make_settings(index_root, model_dir=reexported, rerank=True, rerank_score="itm_logit")
    caption = catalogue.records[11].captions["de"][0]
    with LiveServer(settings) as live, live.client() as client:
        body = client.post("/v1/search", json={"query": caption, "top_k": 10, "rerank_k": 128}).json()
    assert body["reranked"] is True
    encoder = load_encoder(reexported, threads=1)
    query = encoder.encode_text([caption]).row(0)
    tokens = catalogue.encoded.tokens.astype(np.float16).astype(np.float32)
    logit1 = encoder.score_pairs(query, tokens, "match_logit1")
    order = np.argsort(-logit1, kind="stable")[:10]
    assert [hit["id"] for hit in body["results"]] == [catalogue.records[i].id for i in order]
    np.testing.assert_allclose([h["rerank_score"] for h in body["results"]], logit1[order], atol=1e-3)


def test_paper_score_needs_an_export_with_the_match_logit(index_root: Path) -> None:
    settings = make_settings(index_root, rerank_score="itm_logit")  # the shipped graphs: margin only
    app = create_app(settings)
    with pytest.raises(EncoderError, match="re-run `ccrk export onnx`"):
        app.state.runtime._start()
