"""CL2CM as an objective of add-language (issue 28): the word-alignment pseudo-labels on a hand-made pair, the
transport plan's marginals, the word-level relation and the relational distillation against values computed
by hand, and ``ccrk model add-language --objective cl2cm`` end to end on a tiny model (noisy pairs and
captions from ``ccrk data pairs --noise``; the base files, fingerprint and native embeddings unchanged; the
new language served by both runtimes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model.acquisition_format import acquired_languages
from model.cl2cm import (
    relational_kd_loss,
    sinkhorn,
    token_similarity,
    voted_relation,
    word_alignment_labels,
    word_alignment_loss,
    word_mask,
    word_relation,
)
from model.language_training import LanguageTrainConfig
from model.runtime import load_encoder
from store.version.manifest import model_fingerprint
from synthetic.catalogue import load_split
from synthetic.lexicons import LANGUAGES
from tests.model.tiny_base import save_tiny_base

N_ITEMS = 40


def hand_made_pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source "<s> A B C </s>", target "<s> C' A' B' X </s> <pad>": each primed token is its word plus a
    little of the others; X is like no source word."""
    e = torch.eye(5)
    source = torch.stack([e[4], e[0], e[1], e[2], e[4]])[None]
    target = torch.stack(
        [e[4], e[2] + 0.1 * e[0], e[0] + 0.1 * e[1], e[1] + 0.2 * e[2], e[3], e[4], torch.zeros(5)]
    )[None]
    source_ids = torch.tensor([[0, 10, 11, 12, 2]])
    target_ids = torch.tensor([[0, 20, 21, 22, 23, 2, 1]])
    specials = [0, 1, 2]
    source_mask = word_mask(source_ids, torch.ones_like(source_ids), specials)
    target_mask = word_mask(target_ids, target_ids.ne(1).long(), specials)
    return source, target, source_mask, target_mask


def test_word_alignment_pseudo_labels_on_a_hand_made_pair() -> None:
    source, target, source_mask, target_mask = hand_made_pair()
    assert source_mask.tolist() == [[False, True, True, True, False]]
    assert target_mask.tolist() == [[False, True, True, True, True, False, False]]
    sim = token_similarity(target, source)
    labels = word_alignment_labels(sim, target_mask, source_mask)
    # C' -> C (position 3), A' -> A (1), B' -> B (2); X is kept out (its best source word prefers another
    # target token), and so are the special and padding positions.
    assert labels.tolist() == [[-1, 3, 1, 2, -1, -1, -1]]
    # The loss is the cross-entropy of the labelled tokens over the three source words, computed by hand.
    t = 0.1
    expected = []
    for position, label in ((1, 3), (2, 1), (3, 2)):
        logits = [float(sim[0, position, s]) / t for s in (1, 2, 3)]
        expected.append(-(logits[label - 1] - math.log(sum(math.exp(x) for x in logits))))
    loss = word_alignment_loss(sim, labels, source_mask, t)
    assert float(loss) == pytest.approx(sum(expected) / 3, rel=1e-5)
    assert float(word_alignment_loss(sim, torch.full_like(labels, -1), source_mask, t)) == 0.0


def test_transport_plan_has_uniform_marginals_over_real_tokens() -> None:
    source, target, source_mask, target_mask = hand_made_pair()
    plan = sinkhorn(1 - token_similarity(target, source), target_mask, source_mask, iterations=200)[0]
    assert torch.allclose(plan.sum(dim=1)[1:5], torch.full((4,), 1 / 4), atol=1e-4)
    assert torch.allclose(plan.sum(dim=0)[1:4], torch.full((3,), 1 / 3), atol=1e-4)
    assert float(plan[[0, 5, 6]].abs().sum() + plan[:, [0, 4]].abs().sum()) == 0.0


def test_word_relation_is_the_mean_best_token_cosine() -> None:
    # Source 0: tokens (1,0), (0,1); source 1: token (1,1) and a masked one. Target 0: (1,0); target 1: (0,1),
    # (1,1) and a masked one.
    source = torch.tensor([[[1.0, 0], [0, 1]], [[1.0, 1], [5, -5]]])
    source_mask = torch.tensor([[True, True], [True, False]])
    target = torch.tensor([[[1.0, 0], [0, 0]], [[0.0, 1], [1, 1]]])
    target_mask = torch.tensor([[True, False], [True, True]])
    r = 1 / math.sqrt(2)
    expected = [1.0, (1 + r) / 2, r, (r + 1) / 2]
    relation = word_relation(source, source_mask, target, target_mask)
    assert relation.shape == (2, 2) and relation.flatten().tolist() == pytest.approx(expected)


def test_relational_loss_matches_a_hand_computed_value() -> None:
    """sentence [[1,0],[0,1]], word [[.5,.5],[0,1]], student [[1,0],[0,1]], temperature 1.

    Rows: teacher row 0 = mean(softmax(1,0), softmax(.5,.5)) = (0.61553, 0.38447), student (0.73106, 0.26894):
    KL 0.031522; row 1: both (0.26894, 0.73106): KL 0 -> rows 0.015761. Columns: column 0 = mean(softmax(1,0),
    softmax(.5,0)) = (0.67676, 0.32324), column 1 = mean(softmax(0,1), softmax(.5,1)) = (0.32324, 0.67676),
    student columns as its rows: KL 0.0072144 each... -> columns 0.0072144. Loss = (0.015761 + 0.0072144) / 2.
    """
    sentence = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    word = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert float(relational_kd_loss(sentence, word, student, 1.0)) == pytest.approx(0.0114877, abs=1e-6)
    # The voted teacher is a distribution along each direction, and a student equal to it costs nothing.
    votes = voted_relation(sentence, word, 0.5, dim=1)
    assert torch.allclose(votes.sum(dim=1), torch.ones(2))
    assert float(relational_kd_loss(sentence, sentence, sentence, 0.3)) == pytest.approx(0.0, abs=1e-7)
    # And the loss pulls a student towards the teacher: a step along its gradient lowers it.
    s = student.clone().requires_grad_(True)
    loss = relational_kd_loss(sentence, word, s, 1.0)
    loss.backward()
    with torch.no_grad():
        assert float(relational_kd_loss(sentence, word, s - 0.5 * s.grad, 1.0)) < float(loss)


def test_objective_must_be_known() -> None:
    with pytest.raises(ValueError, match="unknown objective"):
        LanguageTrainConfig(objective="cl2")
    assert F.normalize(torch.ones(2), dim=0).shape == (2,)


# -- end to end ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from synthetic.synth import SynthConfig, generate_catalogue

    out = tmp_path_factory.mktemp("catalogue")
    config = SynthConfig(
        seed=0, n_train=N_ITEMS, n_val=0, n_test=0, image_size=32, languages=(*LANGUAGES, "ar")
    )
    generate_catalogue(out, config, workers=1)
    return out / "train.jsonl"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory, catalogue: Path) -> Path:
    return save_tiny_base(tmp_path_factory.mktemp("base"), catalogue)


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cli(*args: str):
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    return CliRunner().invoke(app, list(args))


def test_cli_adds_arabic_with_cl2cm_from_noisy_data(base_dir: Path, catalogue: Path, tmp_path: Path) -> None:
    before = files_of(base_dir)
    tsv, noisy = tmp_path / "en-ar.tsv", tmp_path / "noisy.jsonl"
    result = cli(
        "data", "pairs", "--data", str(catalogue), "--out", str(tsv), "--source", "en", "--target", "ar",
        "--per-record", "2", "--noise", "0.4", "--captions-out", str(noisy),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    log = [json.loads(line) for line in (tmp_path / "en-ar.tsv.noise.jsonl").read_text("utf-8").splitlines()]
    lines = tsv.read_text("utf-8").splitlines()
    assert len(log) == len(lines) == 2 * N_ITEMS
    assert sum(e["kind"] is not None for e in log) == round(0.4 * 2 * N_ITEMS)
    noisy_records = {r.id: r for r in load_split(noisy)}
    for entry in log:  # the pair and the LE caption of a slot carry the same text (noisy or clean)
        assert lines[entry["line"] - 1].split("\t")[1] == entry["noisy"]
        assert noisy_records[entry["id"]].captions["ar"][entry["slot"]] == entry["noisy"]

    out = tmp_path / "model"
    result = cli(
        "model", "add-language", "--model", str(base_dir), "--lang", "ar", "--parallel", str(tsv),
        "--captions", str(noisy), "--out", str(out), "--objective", "cl2cm", "--kd-weight", "1.0",
        "--steps-nlt", "6", "--steps-le", "4", "--batch-size", "8", "--threads", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "objective cl2cm" in " ".join(result.output.split())
    # The original is untouched and copied byte for byte; only the language was added.
    assert files_of(base_dir) == before
    after = files_of(out)
    assert all(after[name] == content for name, content in before.items())
    assert model_fingerprint(out) == model_fingerprint(base_dir) and acquired_languages(out) == ("ar",)
    report = json.loads((out / "languages/ar/training.json").read_text())
    assert report["objective"] == "cl2cm" and "nlt" not in report
    assert report["cl"]["steps"] == 6 and report["le"]["steps"] == 4
    assert report["train_config"]["kd_weight"] == 1.0
    # Native embeddings unchanged through both runtimes; Arabic goes through its acquirer.
    texts = [t for r in load_split(catalogue)[:4] for lang in LANGUAGES for t in r.captions[lang]]
    arabic = [r.captions["ar"][0] for r in load_split(catalogue)[:4]]
    for backend in ("torch", "onnx"):
        base_encoder = load_encoder(base_dir, backend, device="cpu", threads=1)
        served = load_encoder(out, backend, device="cpu", threads=1)
        reference = base_encoder.encode_text(texts)
        native = served.encode_text(texts)
        assert np.array_equal(native.embeds, reference.embeds) and np.array_equal(
            native.states, reference.states
        )
        routed = served.encode_text(arabic, ["ar"] * len(arabic)).embeds
        assert routed.shape == (4, base_encoder.config.embed_dim)
        assert not np.allclose(routed, base_encoder.encode_text(arabic).embeds)


def test_cli_refuses_an_unknown_objective_and_noise_without_languages(
    base_dir: Path, catalogue: Path, tmp_path: Path
) -> None:
    result = cli(
        "model", "add-language", "--model", str(base_dir), "--lang", "ar", "--captions", str(catalogue),
        "--out", str(tmp_path / "m"), "--objective", "clcm", "--steps-nlt", "1", "--steps-le", "0",
    )  # fmt: skip
    assert result.exit_code == 2 and "unknown objective" in result.output
    result = cli(
        "data", "pairs", "--data", str(catalogue), "--out", str(tmp_path / "p.tsv"), "--noise", "0.2"
    )
    assert result.exit_code == 2 and "--source" in " ".join(result.output.split())
    assert not (tmp_path / "m").exists() and not (tmp_path / "p.tsv").exists()
