"""A language added to the served model without re-embedding anything (MLA, ``ccrk model add-language``):
a service started on the new model directory serves the index built with the original model as it is
(same fingerprint: no rebuild, the version untouched), detects Korean queries and answers them through the
Korean acquirer well above chance, and answers the ten native languages exactly as the original model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as cli
from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from model.add_language import add_language
from model.language_training import LanguageTrainConfig
from store.version.manifest import model_fingerprint
from store.version.versions import current_version
from synthetic.lexicons import LANGUAGES
from synthetic.synth import SynthConfig, generate_catalogue
from tests.fixtures import LiveServer, make_settings

NAME = "shop"
TOP = 5


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(index root of 40 products built with the original demo model, the demo model plus Korean, the
    catalogue folder with Korean captions)."""
    folder = tmp_path_factory.mktemp("catalogue")
    config = SynthConfig(seed=5, n_train=160, n_val=0, n_test=40, image_size=64, languages=(*LANGUAGES, "ko"))
    generate_catalogue(folder, config, workers=1)
    root = tmp_path_factory.mktemp("indexes")
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR, backend="onnx", device="cpu", threads=2, index_root=root,
        index_workers=0, index_batch_size=16,
    )  # fmt: skip
    assert build(NAME, [folder / "test.jsonl"], settings=settings).published
    model = tmp_path_factory.mktemp("models") / "ccrk-demo-ko"
    train = LanguageTrainConfig(steps_nlt=150, steps_le=60, warmup_steps=10, threads=2)
    add_language(
        DEFAULT_MODEL_DIR, "ko", captions=folder / "train.jsonl", out=model, config=train, log=lambda *a: None
    )
    return root, model, folder


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines() if line.strip()]


def _search(client: httpx.Client, text: str, **extra: object) -> dict:
    response = client.post("/v1/search", json={"query": text, "top_k": TOP, "rerank": False, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_new_model_serves_the_old_index_with_korean(shop: tuple[Path, Path, Path]) -> None:
    root, model, folder = shop
    version = current_version(root, NAME)
    index_files = {p: p.stat().st_mtime_ns for p in (root / NAME / version).rglob("*") if p.is_file()}
    assert model_fingerprint(model) == model_fingerprint(DEFAULT_MODEL_DIR)
    verified = CliRunner().invoke(
        cli, ["index", "verify", "--name", NAME, "--index-root", str(root), "--model", str(model)]
    )
    assert verified.exit_code == 0, verified.output

    recs = _records(folder)
    native = [recs[i]["captions"][lang][0] for i, lang in enumerate(("en", "de", "ja", "zh", "ru") * 2)]
    with LiveServer(make_settings(root, index_name=NAME)) as before, before.client() as client:
        want = [[hit["id"] for hit in _search(client, text)["results"]] for text in native]
        base_ko = [_search(client, r["captions"]["ko"][0]) for r in recs]
    with LiveServer(make_settings(root, index_name=NAME, model_dir=model)) as after, after.client() as client:
        assert client.get("/readyz").status_code == 200
        info = client.get("/v1/index").json()
        assert info["version"] == version and info["count"] == 40
        got = [[hit["id"] for hit in _search(client, text)["results"]] for text in native]
        answers = [_search(client, r["captions"]["ko"][0]) for r in recs]
    # Re-ranking on by default: not for an acquired language (the fusion encoder never saw its states),
    # unless a request asks; still for the native ones.
    ko, en = recs[0]["captions"]["ko"][0], recs[0]["captions"]["en"][0]
    # Policy full: every candidate re-ranked (adaptive may keep a clear dual answer, tests/service/
    # test_rerank_policy.py); here only whether a query is re-ranked at all is asked.
    reranking = make_settings(root, index_name=NAME, model_dir=model, rerank=True, rerank_policy="full")
    with LiveServer(reranking) as live, live.client() as client:
        assert not any(h.get("rerank_score") for h in _search(client, ko, rerank=None)["results"])
        assert all(h.get("rerank_score") for h in _search(client, ko, rerank=True)["results"])
        assert all(h.get("rerank_score") for h in _search(client, en, rerank=None)["results"])
    assert got == want  # the native languages: the original model's answers

    assert {a["language"]["code"] for a in answers} == {"ko"}
    assert all(a["language"]["supported"] for a in answers)
    assert not any(a["language"]["supported"] for a in base_ko)  # the original model lacks Korean
    hits = sum(r["id"] in [h["id"] for h in a["results"]] for r, a in zip(recs, answers, strict=True))
    base_hits = sum(r["id"] in [h["id"] for h in a["results"]] for r, a in zip(recs, base_ko, strict=True))
    chance = TOP / len(recs)  # 0.125
    assert hits / len(recs) >= 4 * chance, (hits, base_hits)
    assert base_hits / len(recs) < 2.5 * chance, (hits, base_hits)
    # Nothing was re-embedded: the version's files are the ones the build wrote.
    assert {p: p.stat().st_mtime_ns for p in (root / NAME / version).rglob("*") if p.is_file()} == index_files
