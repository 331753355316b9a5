"""An index version written by the old code (``format_v1/``, see its README) loads, verifies and serves with
the answers the old code gave on it: the store reads what earlier releases wrote, and writes on top of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import delete
from model.runtime import Encoder, load_encoder
from store.verify import verify_version
from store.version.reader import IndexVersion
from store.version.versions import current_version, list_versions
from tests.fixtures import LiveServer, make_settings

FIXTURE = Path(__file__).parent / "format_v1"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
NAME = "shop"
# The same model and ONNX Runtime on another CPU may round the last bits differently; ranks must not move.
SCORE_TOL = 1e-4


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy: nothing here may write into the checkout."""
    shutil.copytree(FIXTURE / NAME, tmp_path / NAME)
    return tmp_path


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=1)


def test_the_old_version_verifies_against_the_model(root: Path) -> None:
    assert current_version(root, NAME) == EXPECTED["version"]
    assert list_versions(root, NAME) == [EXPECTED["version"]]
    assert verify_version(root, NAME, model_dir=DEFAULT_MODEL_DIR) == []


def test_the_engine_answers_as_the_old_code_did(root: Path, encoder: Encoder) -> None:
    queries = EXPECTED["engine"]
    embeds = encoder.encode_text([q["text"] for q in queries]).embeds.astype(np.float32)
    with IndexVersion.open(root, NAME) as version:
        assert (len(version), version.total_rows) == (EXPECTED["count"], EXPECTED["total_rows"])
        assert sorted(version.fields) == EXPECTED["fields"]
        scores, rows = version.search(embeds, 5)
        exact_scores, exact_rows = version.search_exact(embeds, 5)
        spec = EXPECTED["filter"]
        allowed = version.filter_rows({spec["field"]: spec["value"]})
        assert allowed.tolist() == spec["rows"]
        filtered_scores, filtered_rows = version.search(embeds, 3, allowed)
        for n, want in enumerate(queries):
            assert rows[n].tolist() == want["rows"], want["text"]
            np.testing.assert_allclose(scores[n], want["scores"], atol=SCORE_TOL)
            assert exact_rows[n].tolist() == want["exact_rows"]
            np.testing.assert_allclose(exact_scores[n], want["exact_scores"], atol=SCORE_TOL)
            assert filtered_rows[n].tolist() == want["filtered_rows"]
            np.testing.assert_allclose(filtered_scores[n], want["filtered_scores"], atol=SCORE_TOL)
        assert version.items([0, 1, 2]) == EXPECTED["items"]
        tokens = version.rerank_tokens(np.array(EXPECTED["rerank_tokens"]["rows"]))
        assert list(tokens.shape) == EXPECTED["rerank_tokens"]["shape"]
        # int8 tokens times their float32 scales: the same arithmetic gives the same sums.
        assert float(np.abs(tokens.astype(np.float64)).sum()) == pytest.approx(
            EXPECTED["rerank_tokens"]["abs_sum"], rel=1e-9
        )
        for item_id, row in EXPECTED["row_of"].items():
            assert version.row_of(item_id) == row  # the deleted item has no row


def test_the_service_answers_as_the_old_code_did(root: Path, tmp_path: Path) -> None:
    settings: Settings = make_settings(root, history_db=tmp_path / "history.sqlite")
    with LiveServer(settings) as live, live.client() as client:
        for case in EXPECTED["service"]:
            response = client.post("/v1/search", json=case["request"])
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["index_version"] == case["index_version"]
            assert body["language"]["code"] == case["language"]
            assert body["match"] == case["match"]
            got, want = body["results"], case["results"]
            assert [h["id"] for h in got] == [h["id"] for h in want], case["request"]
            for hit, old in zip(got, want, strict=True):
                for key in ("rank", "metadata", "match"):
                    assert hit[key] == old[key], (key, case["request"])
                assert hit["score"] == pytest.approx(old["score"], abs=SCORE_TOL)
                if old["rerank_score"] is None:
                    assert hit["rerank_score"] is None
                else:  # a logit: the fusion encoder's rounding is scaled up by the temperature
                    assert hit["rerank_score"] == pytest.approx(old["rerank_score"], abs=1e-2)
        filtered = EXPECTED["service_filtered"]
        body = client.post("/v1/search", json=filtered["request"]).json()
        assert [h["id"] for h in body["results"]] == filtered["ids"]
        # Its images were in a temporary folder, gone wherever the fixture was not made: a clear 404.
        if not Path(EXPECTED["items"][0]["path"]).exists():
            missing = client.get(f"/v1/images/{EXPECTED['items'][0]['id']}")
            assert missing.status_code == 404
            assert "no longer on disk" in missing.json()["detail"][0]["msg"]


def test_new_code_writes_a_version_on_top_of_the_old_one(root: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR, backend="onnx", device="cpu", threads=1, index_root=root, keep_versions=3
    )
    report = delete(NAME, [EXPECTED["items"][1]["id"]], settings=settings)
    assert report.published and report.count == EXPECTED["count"] - 1
    assert current_version(root, NAME) == report.version != EXPECTED["version"]
    assert verify_version(root, NAME, model_dir=DEFAULT_MODEL_DIR) == []
    with IndexVersion.open(root, NAME) as version:
        assert version.row_of(EXPECTED["items"][1]["id"]) is None
        assert version.manifest.parent_version == EXPECTED["version"]
