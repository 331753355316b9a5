"""MLA language acquisition (issue 18): a new language added to a frozen tiny model without changing it.

One module-scoped run adds Korean (NLT then LE, a few dozen steps on 40 catalogue items); the tests read it:
the original files stay byte-identical, native texts encode bit-identically through both runtimes, the new
language retrieves its own images far above chance where a random acquirer does not, ONNX matches torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model.acquisition import (
    LanguageAcquirer,
    freeze,
    init_embeddings_from_base,
    load_acquirer,
    train_language_tokenizer,
)
from model.acquisition_format import AcquirerConfig, acquired_languages
from model.add_language import AddLanguageError, add_language
from model.evaluation import evaluate_encoder
from model.language_baseline import full_finetune_baseline
from model.language_training import LanguageData, LanguageTrainConfig, train_acquirer
from model.modeling import CCRkModel
from model.parallel_corpus import pairs_from_catalogue, write_pairs_tsv
from model.preprocessing import ImagePreprocessor
from model.runtime import EncoderError, load_encoder
from model.runtime.torch_runtime import TorchEncoder
from model.tokenization import load_tokenizer
from model.training_data import load_captioned_images
from store.version.manifest import model_fingerprint
from synthetic.catalogue import load_split
from synthetic.lexicons import ADDED_LANGUAGES, LANGUAGES
from tests.model.tiny_base import save_tiny_base

STEPS = LanguageTrainConfig(steps_nlt=40, steps_le=60, batch_size=16, learning_rate=3e-3, warmup_steps=5)
N_ITEMS = 40
CHANCE_R5 = 5 / N_ITEMS


def quiet(_: str) -> None:
    pass


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from synthetic.synth import SynthConfig, generate_catalogue

    out = tmp_path_factory.mktemp("catalogue")
    config = SynthConfig(
        seed=0, n_train=N_ITEMS, n_val=0, n_test=0, image_size=32, languages=(*LANGUAGES, "ko", "it")
    )
    generate_catalogue(out, config, workers=1)
    return out / "train.jsonl"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory, catalogue: Path) -> Path:
    """A tiny (untrained) model of the ten languages, with its ONNX export."""
    return save_tiny_base(tmp_path_factory.mktemp("base"), catalogue)


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory, base_dir: Path, catalogue: Path):
    before = files_of(base_dir)
    out = tmp_path_factory.mktemp("added") / "model"
    result = add_language(base_dir, "ko", captions=catalogue, out=out, config=STEPS, log=quiet)
    return result, before


def native_texts(catalogue: Path) -> tuple[list[str], list[str]]:
    records = load_split(catalogue)[:6]
    pairs = [(t, lang) for r in records for lang in LANGUAGES for t in r.captions[lang]]
    return [t for t, _ in pairs], [lang for _, lang in pairs]


def test_original_files_are_byte_identical_and_the_fingerprint_unchanged(added, base_dir: Path) -> None:
    result, before = added
    out = result.out
    assert files_of(base_dir) == before  # the original directory is untouched
    copied = files_of(out)
    for name, content in before.items():  # config, weights, tokenizer, onnx/*.onnx, export.json
        assert copied[name] == content, name
    assert model_fingerprint(out) == model_fingerprint(base_dir)
    new = set(copied) - set(before)
    assert new == {
        "languages/ko/acquirer.json",
        "languages/ko/acquirer.safetensors",
        "languages/ko/tokenizer.json",
        "languages/ko/tokenizer_config.json",
        "languages/ko/training.json",
        "onnx/text_encoder.ko.onnx",
    }
    assert acquired_languages(out) == ("ko",) and acquired_languages(base_dir) == ()
    config = AcquirerConfig.load(out / "languages/ko/acquirer.json")
    assert config.base_fingerprint == model_fingerprint(base_dir)
    assert config.onnx_graph == "text_encoder.ko.onnx" and config.steps_le == STEPS.steps_le
    report = json.loads((out / "languages/ko/training.json").read_text())
    assert report["parameters_added"] == sum(
        p.numel() for p in load_acquirer(out / "languages/ko", CCRkModel.from_pretrained(out))[0].parameters()
    )
    assert report["nlt"]["steps"] == STEPS.steps_nlt and report["le"]["steps"] == STEPS.steps_le
    assert report["minutes"] > 0 and report["tokenizer"]["tokens_per_text_own"] > 0


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_native_languages_encode_bit_identically(
    added, base_dir: Path, catalogue: Path, backend: str
) -> None:
    result, _ = added
    texts, langs = native_texts(catalogue)
    before = load_encoder(base_dir, backend, device="cpu", threads=1)
    after = load_encoder(result.out, backend, device="cpu", threads=1)
    assert after.acquired_languages == ("ko",) and before.acquired_languages == ()
    reference = before.encode_text(texts)
    for encoded in (
        after.encode_text(texts),
        after.encode_text(texts, langs),
        after.encode_text(texts, [None] * len(texts)),
    ):
        assert np.array_equal(encoded.embeds, reference.embeds)
        assert np.array_equal(encoded.states, reference.states)
        assert np.array_equal(encoded.mask, reference.mask)
    # Mixed with Korean: native rows are the base tower's (on their own sub-batch), Korean the acquirer's.
    ko = [r.captions["ko"][0] for r in load_split(catalogue)[:3]]
    mixed = after.encode_text([ko[0], texts[0], ko[1], texts[1], ko[2]], ["ko", "en", "ko", "de", "ko"])
    native = before.encode_text(texts[:2])
    assert np.array_equal(mixed.embeds[[1, 3]], native.embeds)
    assert np.array_equal(mixed.embeds[[0, 2, 4]], after.encode_text(ko, ["ko"] * 3).embeds)
    assert not np.allclose(mixed.embeds[[0, 2, 4]], before.encode_text(ko).embeds)
    with pytest.raises(EncoderError, match="one entry per text"):
        after.encode_text(texts, langs[:-1])


def test_nlt_loss_falls(added) -> None:
    losses = added[0].report["nlt"]["losses"]
    assert len(losses) == STEPS.steps_nlt
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def ko_recall_at_5(encoder, catalogue: Path) -> float:
    data = load_captioned_images(catalogue, ImagePreprocessor(encoder.config.vision), languages=("ko",))
    assert len(data) == N_ITEMS
    return evaluate_encoder(encoder, data).report()["dual"]["IR"]["recall"]["R@5"]["ko"]


def test_new_language_retrieves_far_above_chance_and_a_random_acquirer_does_not(
    added, catalogue: Path
) -> None:
    """Text -> image R@5 of Korean captions among the 40 training images (chance 5/40); the same model with
    an untrained, randomly initialised Korean acquirer stays near chance."""
    out = added[0].out
    trained = ko_recall_at_5(load_encoder(out, "torch", device="cpu", threads=1), catalogue)
    base = CCRkModel.from_pretrained(out)
    _, tokenizer = load_acquirer(out / "languages/ko", base)
    config = AcquirerConfig.load(out / "languages/ko/acquirer.json")
    torch.manual_seed(1)
    random_acquirer = LanguageAcquirer(config, base)
    with torch.no_grad():  # also break the zero-init identity: a random acquirer, not a pass-through one
        for adapter in random_acquirer.adapters:
            torch.nn.init.normal_(adapter.up.weight, std=0.02)
    untrained = TorchEncoder.from_model(
        base, load_tokenizer(out), acquirers={"ko": (random_acquirer, tokenizer)}
    )
    random_r5 = ko_recall_at_5(untrained, catalogue)
    print(f"ko R@5: trained {trained:.3f}, random acquirer {random_r5:.3f}, chance {CHANCE_R5:.3f}")
    # Measured over 3 tiny models x 2 seeds: trained 0.68-0.89, random 0.14-0.15 (chance 0.125).
    assert trained >= 3.5 * CHANCE_R5
    assert random_r5 < 2 * CHANCE_R5


def test_onnx_acquirer_matches_torch(added, catalogue: Path) -> None:
    out = added[0].out
    ko = [t for r in load_split(catalogue)[:8] for t in r.captions["ko"]] + ["", "우산 " * 80]
    torch_enc = load_encoder(out, "torch", device="cpu", threads=1)
    onnx_enc = load_encoder(out, "onnx", device="cpu", threads=1)
    for batch in (ko[:1], ko):
        a, b = (
            torch_enc.encode_text(batch, ["ko"] * len(batch)),
            onnx_enc.encode_text(batch, ["ko"] * len(batch)),
        )
        assert np.array_equal(a.mask, b.mask) and a.mask.shape[1] <= 32  # the long text is truncated
        assert np.abs(a.embeds - b.embeds).max() <= 1e-4
        assert np.abs(a.states - b.states).max() <= 1e-4
    # The fusion scorer reads the acquirer's states like any query's.
    tokens = onnx_enc.encode_images(np.zeros((3, 3, 32, 32), dtype=np.uint8)).tokens
    query = onnx_enc.encode_text(ko[:2], ["ko", "ko"]).row(1)
    assert onnx_enc.score_pairs(query, tokens).shape == (3,)


def test_untrained_acquirer_with_the_base_vocabulary_is_the_base_tower(base_dir: Path) -> None:
    """The non-native block uses the frozen positions the way XLM-R does, and zero-init adapters pass states
    through: with the base's own word embeddings it computes exactly the base text tower."""
    base = freeze(CCRkModel.from_pretrained(base_dir))
    text = base.config.text
    config = AcquirerConfig(
        lang="ko", native=("en",), base_model="tiny", base_fingerprint="-", hidden_size=text.hidden_size,
        num_text_layers=text.num_text_layers, pooling=text.pooling, vocab_size=text.vocab_size,
        max_length=text.max_length, bottleneck=8,
    )  # fmt: skip
    acquirer = LanguageAcquirer(config, base)
    acquirer.word_embeddings.load_state_dict(base.text_encoder.embeddings.word_embeddings.state_dict())
    assert {n.split(".")[0] for n, _ in acquirer.named_parameters()} == {
        "word_embeddings",
        "layer_norm",
        "adapters",
    }
    ids = torch.tensor([[0, 17, 40, 99, 2], [0, 23, 2, 1, 1]])
    mask = (ids != 1).long()
    with torch.no_grad():
        a, b = acquirer.encode_text(ids, mask), base.encode_text(ids, mask)
    assert torch.allclose(a.text_embeds, b.text_embeds, atol=1e-6)
    assert torch.allclose(a.last_hidden_state, b.last_hidden_state, atol=1e-5)


def test_base_pieces_init_averages_the_base_embeddings(base_dir: Path, catalogue: Path) -> None:
    base = freeze(CCRkModel.from_pretrained(base_dir))
    base_tokenizer = load_tokenizer(base_dir)
    tokenizer = train_language_tokenizer(
        [t for r in load_split(catalogue) for t in r.captions["ko"]], 4000, 32
    )
    text = base.config.text
    config = AcquirerConfig(
        lang="ko", native=("en",), base_model="tiny", base_fingerprint="-", hidden_size=text.hidden_size,
        num_text_layers=1, pooling=text.pooling, vocab_size=len(tokenizer), max_length=32, bottleneck=8,
    )  # fmt: skip
    acquirer = LanguageAcquirer(config, base)
    assert init_embeddings_from_base(acquirer, tokenizer, base_tokenizer) == len(tokenizer) - 1  # not <pad>
    token = max(tokenizer.get_vocab(), key=len)  # a whole Korean word, in byte-level letters
    pieces = [t.id for t in base_tokenizer.backend_tokenizer.model.tokenize(token)]
    assert len(pieces) > 1
    expected = base.text_encoder.embeddings.word_embeddings.weight[pieces].mean(dim=0)
    assert torch.allclose(acquirer.word_embeddings.weight[tokenizer.convert_tokens_to_ids(token)], expected)


def test_nlt_only_is_deterministic_and_a_second_language_adds_a_folder(
    added, base_dir: Path, catalogue: Path, tmp_path: Path
) -> None:
    """NLT from a TSV alone (no images) makes a working acquirer; the same seed gives the same weights;
    adding Italian to the Korean model keeps Korean and the base files."""
    pairs = pairs_from_catalogue(load_split(catalogue), 2, 0, source="en", target="it")
    tsv = tmp_path / "en-it.tsv"
    write_pairs_tsv(pairs, tsv)
    nlt_only = LanguageTrainConfig(
        steps_nlt=30, steps_le=50, batch_size=16, learning_rate=3e-3, warmup_steps=5
    )
    out = tmp_path / "ko-it"
    result = add_language(added[0].out, "it", parallel=tsv, out=out, config=nlt_only, log=quiet)
    assert "le" not in result.report and result.report["nlt"]["steps"] == 30
    assert AcquirerConfig.load(out / "languages/it/acquirer.json").steps_le == 0
    assert acquired_languages(out) == ("it", "ko")
    assert files_of(out / "languages/ko") == files_of(added[0].out / "languages/ko")
    assert model_fingerprint(out) == model_fingerprint(base_dir)
    losses = result.report["nlt"]["losses"]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])

    # The Italian embedding of a sentence approaches the frozen model's English one: closer than the base
    # tower's reading of the Italian (the random tiny model maps every text near one direction, so the
    # distances are small; their ratio is what NLT changes).
    english, italian = [a for a, _ in pairs[:20]], [b for _, b in pairs[:20]]
    for backend in ("torch", "onnx"):
        encoder = load_encoder(out, backend, device="cpu", threads=1)
        assert encoder.acquired_languages == ("it", "ko")
        en = encoder.encode_text(english).embeds
        acquired = 1 - (en * encoder.encode_text(italian, ["it"] * 20).embeds).sum(1).mean()
        shared = 1 - (en * encoder.encode_text(italian).embeds).sum(1).mean()
        print(f"{backend}: 1 - cos(en, it): acquirer {acquired:.4f}, base tower {shared:.4f}")
        assert acquired < 0.5 * shared

    # Deterministic: the same data, config and seed give the same acquirer, bit for bit.
    base = CCRkModel.from_pretrained(base_dir)
    data = LanguageData(lang="it", native=("en",), pairs=pairs)
    runs = [
        train_acquirer(base, load_tokenizer(base_dir), data, nlt_only, "-", quiet).acquirer.state_dict()
        for _ in range(2)
    ]
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_onnx_runtime_with_acquirers_never_imports_torch(added) -> None:
    code = (
        "import sys; from model.runtime import load_encoder; "
        f"enc = load_encoder({str(added[0].out)!r}, 'onnx', device='cpu', threads=1); "
        "q = enc.encode_text(['노란 우산', 'red mug'], ['ko', 'en']); "
        "assert enc.acquired_languages == ('ko',) and q.embeds.shape[0] == 2; "
        "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_language_is_added_in_place_without_touching_the_rest(
    added, catalogue: Path, tmp_path: Path
) -> None:
    model_dir = Path(shutil.copytree(added[0].out, tmp_path / "m"))
    before = files_of(model_dir)
    tsv = tmp_path / "en-it.tsv"
    write_pairs_tsv(pairs_from_catalogue(load_split(catalogue), 1, 0, source="en", target="it"), tsv)
    cfg = LanguageTrainConfig(steps_nlt=3, steps_le=0, batch_size=8)
    result = add_language(model_dir, "it", parallel=tsv, config=cfg, log=quiet)
    assert result.out == model_dir and acquired_languages(model_dir) == ("it", "ko")
    after = files_of(model_dir)
    assert {k: after[k] for k in before} == before
    assert sorted(set(after) - set(before))[-1] == "onnx/text_encoder.it.onnx"
    assert not [p for p in (model_dir / "languages").iterdir() if p.name.startswith(".")]
    with pytest.raises(AddLanguageError, match="already has an acquirer"):
        add_language(model_dir, "it", parallel=tsv, config=cfg, log=quiet)


def test_acquirer_over_other_weights_is_refused(added, tmp_path: Path) -> None:
    out = Path(shutil.copytree(added[0].out, tmp_path / "m"))
    path = out / "languages/ko/acquirer.json"
    config = json.loads(path.read_text())
    config["base_fingerprint"] = "0" * 64
    path.write_text(json.dumps(config))
    for backend in ("torch", "onnx"):
        with pytest.raises(EncoderError, match="other weights"):
            load_encoder(out, backend, device="cpu", threads=1)


def test_full_finetune_baseline_writes_a_new_model(base_dir: Path, catalogue: Path, tmp_path: Path) -> None:
    pairs = pairs_from_catalogue(load_split(catalogue), 2, 0, source="en", target="ko")
    data = LanguageData(lang="ko", native=("en",), pairs=pairs)
    cfg = LanguageTrainConfig(steps_nlt=10, steps_le=0, batch_size=16, baseline_learning_rate=1e-3)
    report = full_finetune_baseline(base_dir, data, cfg, tmp_path / "ft", log=quiet, export=False)
    assert model_fingerprint(tmp_path / "ft") != model_fingerprint(base_dir)
    assert report["native_drift"] > 0 and report["nlt"]["steps"] == 10
    assert "ko" in CCRkModel.from_pretrained(tmp_path / "ft").config.languages


def run_cli(*args: str):
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    return CliRunner().invoke(app, ["model", "add-language", *args])


def test_cli_errors_name_the_file(base_dir: Path, catalogue: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("only one column\nsecond\tline\n", encoding="utf-8")
    common = ("--model", str(base_dir), "--steps-nlt", "2", "--steps-le", "0")
    cases = [
        (
            ("--lang", "ko", "--out", str(tmp_path / "a"), "--parallel", str(tmp_path / "missing.tsv")),
            "missing.tsv",
        ),
        (("--lang", "ko", "--out", str(tmp_path / "a"), "--parallel", str(bad)), f"{bad}:1"),
        (
            ("--lang", "ko", "--out", str(tmp_path / "a"), "--captions", str(tmp_path / "none.jsonl")),
            "none.jsonl",
        ),
        (("--lang", "en", "--out", str(tmp_path / "a"), "--captions", str(catalogue)), "natively"),
        (("--lang", "ko", "--out", str(base_dir), "--captions", str(catalogue)), "--out"),
        (
            ("--lang", "ko", "--out", str(tmp_path / "a"), "--captions", str(catalogue), "--native", "ko"),
            "--native",
        ),
        (("--lang", "../x", "--out", str(tmp_path / "a"), "--captions", str(catalogue)), "language code"),
        (("--lang", "ko", "--out", str(tmp_path / "a")), "--parallel"),
    ]
    for args, expected in cases:
        result = run_cli(*common, *args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in " ".join(result.output.split()), (args, result.output)
    assert not (tmp_path / "a").exists()
    with pytest.raises(AddLanguageError, match="not empty"):
        add_language(base_dir, "ko", captions=catalogue, out=catalogue.parent, log=quiet)


def test_cli_writes_pairs_and_adds_a_language(base_dir: Path, catalogue: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    tsv = tmp_path / "en-ko.tsv"
    args = ["data", "pairs", "--data", str(catalogue), "--out", str(tsv), "--source", "en", "--target", "ko"]
    result = CliRunner().invoke(app, [*args, "--per-record", "2"])
    assert result.exit_code == 0, result.output
    lines = tsv.read_text(encoding="utf-8").splitlines()
    first = load_split(catalogue)[0].captions
    assert len(lines) == 2 * N_ITEMS and lines[0] == f"{first['en'][0]}\t{first['ko'][0]}"
    result = run_cli(
        "--model", str(base_dir), "--lang", "ko", "--parallel", str(tsv), "--captions", str(catalogue),
        "--out", str(tmp_path / "m"), "--steps-nlt", "3", "--steps-le", "2", "--batch-size", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert acquired_languages(tmp_path / "m") == ("ko",)
    report = json.loads((tmp_path / "m/languages/ko/training.json").read_text())
    assert report["data"]["pairs"] == 2 * N_ITEMS and report["data"]["parallel"] == str(tsv)


def test_added_languages_are_absent_from_the_shipped_demo_model() -> None:
    """The demo model never saw ko, ar, hi or it: they are not among its languages, nor anywhere in what its
    training recorded, so an evaluation of them measures acquisition, not memory."""
    root = Path(__file__).resolve().parents[2] / "model/pretrained/ccrk-demo"
    config = json.loads((root / "config.json").read_text())
    assert set(config["languages"]) == set(LANGUAGES)
    assert not set(config["languages"]) & set(ADDED_LANGUAGES)

    def strings(node: object) -> list[str]:
        if isinstance(node, dict):
            return [*map(str, node), *(s for v in node.values() for s in strings(v))]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    training = json.loads((root / "training.json").read_text())
    assert training["train_config"]["languages"] in (None, list(LANGUAGES))
    assert not set(strings(training)) & set(ADDED_LANGUAGES)
    assert acquired_languages(root) == ()


def test_tokenizer_of_the_language_keeps_captions_short(catalogue: Path) -> None:
    """The reason for a vocabulary of its own: Korean through its own BPE takes a fraction of the tokens."""
    ko = [t for r in load_split(catalogue) for t in r.captions["ko"]]
    own = train_language_tokenizer(ko, 4000, 64)
    assert own.pad_token_id == 1 and own.convert_ids_to_tokens([0, 1, 2, 3, 4]) == [
        "<s>", "<pad>", "</s>", "<unk>", "<mask>"
    ]  # fmt: skip
    shared = load_tokenizer(Path(__file__).resolve().parents[2] / "model/pretrained/ccrk-demo")
    own_len = np.mean([len(x) for x in own(ko)["input_ids"]])
    shared_len = np.mean([len(x) for x in shared(ko, verbose=False)["input_ids"]])
    assert own_len * 3 < shared_len, (own_len, shared_len)
