"""A product index written before tantivy (``products_v1/``, see its README: its lexical channel is an FTS5
table) verifies and serves with the answers the old code gave on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR
from indexer.build import add
from store.layout import LEXICAL_DIR, MANIFEST_FILE, index_dir, sha256_file
from store.products.channels import PRODUCTS_FILE
from store.text.spelling import Nearest
from store.verify import verify_version
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.versions import current_version
from tests.fixtures import Catalogue, LiveServer, catalogue, encoder, make_settings

__all__ = ["catalogue", "encoder"]  # fixtures

FIXTURE = Path(__file__).parent / "products_v1"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
NAME = "shop"
SCORE_TOL = 1e-4  # ONNX Runtime on another CPU may round the last bits differently; ranks must not move


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy: nothing here may write into the checkout."""
    shutil.copytree(FIXTURE / NAME, tmp_path / NAME)
    return tmp_path


def test_the_fts5_version_verifies(root: Path) -> None:
    assert current_version(root, NAME) == EXPECTED["version"]
    folder = index_dir(root, NAME) / EXPECTED["version"]
    assert (folder / "products.sqlite").is_file() and not (folder / LEXICAL_DIR).exists()
    assert verify_version(root, NAME, model_dir=DEFAULT_MODEL_DIR) == []


def test_the_fts5_version_serves_as_the_old_code_did(root: Path, tmp_path: Path) -> None:
    settings = make_settings(root, index_name=NAME, history_db=tmp_path / "history.sqlite")
    with LiveServer(settings) as live, live.client() as client:
        for case in EXPECTED["service"]:
            response = client.post("/v1/search", json=case["request"])
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["index_version"] == EXPECTED["version"]
            assert (body["language"]["code"], body["match"]) == (case["language"], case["match"])
            got, want = body["results"], case["results"]
            assert [h["id"] for h in got] == [h["id"] for h in want], case["request"]
            for hit, old in zip(got, want, strict=True):
                for key in ("rank", "match", "metadata", "image_url", "images"):
                    assert hit[key] == old[key], (key, case["request"])
                assert hit["score"] == pytest.approx(old["score"], abs=SCORE_TOL)
                new, was = hit["explain"], old["explain"]
                for key in ("method", "group", "text_field", "lexical_field", "terms", "image_url"):
                    assert new[key] == was[key], (key, case["request"])
                assert new["centroid"] is None  # written before the centroid feature: not read, not shown
                for channel, score in was["channels"].items():
                    assert new["channels"][channel]["rank"] == score["rank"], (channel, case["request"])
                    assert new["channels"][channel]["score"] == pytest.approx(score["score"], abs=SCORE_TOL)
        similar = client.post("/v1/items/prod-0/similar", json={"top_k": 3}).json()["results"]
        assert [h["id"] for h in similar] == [h["id"] for h in EXPECTED["similar"]]
        for hit, old in zip(similar, EXPECTED["similar"], strict=True):
            assert hit["score"] == pytest.approx(old["score"], abs=SCORE_TOL)


def test_add_to_the_fts5_version_writes_tantivy_and_keeps_its_text(
    root: Path, tmp_path: Path, catalogue: Catalogue
) -> None:
    """``ccrk index add`` on the old version: its stored text values and terms carried over as they were,
    the new version's lexical index in tantivy, the old products still found by their words."""
    settings = make_settings(root, index_name=NAME, text_fields=["title"], keep_versions=3)
    manifest = tmp_path / "more.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"id": f"new-{i}", "paths": [str(r.image)], "title": r.captions["en"][0]}) + "\n"
            for i, r in enumerate(catalogue.records[:2])
        ),
        encoding="utf-8",
    )
    with IndexVersion.open(root, NAME) as old:
        assert old.products is not None
        old_texts = old.products.texts_of(range(old.products.info.texts))
        old_terms = old.products.terms_of(range(old.products.info.texts))
    report = add(NAME, [manifest], settings=settings)
    assert report.published and report.items_indexed == 2
    assert verify_version(root, NAME, model_dir=DEFAULT_MODEL_DIR) == []
    folder = index_dir(root, NAME) / report.version
    assert (folder / LEXICAL_DIR).is_dir()
    with IndexVersion.open(root, NAME) as new:
        channels = new.products
        assert channels is not None and channels.info.format == 2
        assert channels.info.fields == ["title", "description"]  # the index's own fields, not the setting
        assert {r: channels.texts_of([r])[r] for r in old_texts} == old_texts
        assert {r: channels.terms_of([r])[r] for r in old_terms} == old_terms
        assert channels.lexical(["牛奶"], 3, None).owners[0] == 0  # prod-0's Chinese title


def test_a_version_whose_stored_fusion_cannot_be_parsed_verifies_with_it_named_and_serves(
    root: Path, tmp_path: Path
) -> None:
    """A version whose products.json holds a fusion model the service cannot parse (here as a builder's bug
    would write it: its checksum recorded) is named by ``ccrk index verify``, and served: hybrid and text
    searches fused by reciprocal rank (``service.search.hybrid.HybridRanker.fusion``), not 503 each."""
    folder = index_dir(root, NAME) / EXPECTED["version"]
    info = json.loads((folder / PRODUCTS_FILE).read_text(encoding="utf-8"))
    info["fusion"]["text"]["other"]["weights"] = [1.0]
    (folder / PRODUCTS_FILE).write_text(json.dumps(info), encoding="utf-8")
    manifest = IndexManifest.load(folder / MANIFEST_FILE)
    manifest.checksums[PRODUCTS_FILE] = sha256_file(folder / PRODUCTS_FILE)
    manifest.save(folder / MANIFEST_FILE)
    assert verify_version(root, NAME, model_dir=DEFAULT_MODEL_DIR) == [
        "products.json: fusion text/other: 1 weights for 3 features"
    ]
    settings = make_settings(root, index_name=NAME, history_db=tmp_path / "history.sqlite")
    with LiveServer(settings) as live, live.client() as client:
        for case in EXPECTED["service"]:
            response = client.post("/v1/search", json=case["request"])
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            fused = "none" if case["request"].get("mode") == "image" else "rrf"
            assert {h["explain"]["method"] for h in results} <= {fused}, case["request"]
            assert results or "sort" in case["request"], case["request"]  # a sort cuts at "weak"


def test_the_fts5_version_derives_a_vocabulary_and_finds_a_corrected_word(root: Path) -> None:
    """Typo tolerance on a version written before it (and before tantivy): the vocabulary comes from its
    stored text values; FTS5 cannot weigh terms, so weights leave its BM25 as it was."""
    with IndexVersion.open(root, NAME) as version:
        channels = version.products
        assert channels is not None
        vocabulary = channels.vocabulary()
        assert vocabulary.words["background"] == 10 and vocabulary.words["hintergrund"] == 8
        assert vocabulary.nearest("backgruond", [], 2) == Nearest("background", 1)
        plain = channels.lexical(["background"], 5, None)
        weighted = channels.lexical(["background"], 5, None, weights={"background": 0.5})
        assert plain.owners.size and weighted.owners.tolist() == plain.owners.tolist()
        np.testing.assert_array_equal(weighted.scores, plain.scores)
