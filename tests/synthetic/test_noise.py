"""Machine-translation-like noise (issue 28): exact rates, every kind on hand-made captions, determinism,
and the same error in the pairs and the captions of one slot."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from synthetic.attributes import FULL_MENTION, ProductAttributes
from synthetic.catalogue import load_split
from synthetic.lexicons import LEXICONS
from synthetic.noise import KINDS, NoiseError, corrupt, corrupt_records, summarise, write_records

N_ITEMS = 150


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory):
    from synthetic.synth import SynthConfig, generate_catalogue

    out = tmp_path_factory.mktemp("noise-catalogue")
    config = SynthConfig(
        seed=0, n_train=N_ITEMS, n_val=0, n_test=0, image_size=16, languages=("en", "ar", "it")
    )
    generate_catalogue(out, config, workers=1)
    return load_split(out / "train.jsonl")


@pytest.mark.parametrize("lang", ["ar", "it"])
@pytest.mark.parametrize("rate", [0.0, 0.2, 0.4, 1.0])
def test_exactly_the_share_asked_is_corrupted_and_logged(records, lang: str, rate: float) -> None:
    noisy, log = corrupt_records(records, lang, "en", rate, seed=3)
    slots = sum(len(r.captions[lang]) for r in records)
    assert slots == 2 * N_ITEMS and len(log) == slots
    corrupted = [e for e in log if e.kind is not None]
    assert len(corrupted) == round(rate * slots)
    assert summarise(log)["rate"] == pytest.approx(round(rate * slots) / slots)
    by_id = {r.id: r for r in noisy}
    clean_by_id = {r.id: r for r in records}
    for entry in log:
        assert clean_by_id[entry.id].captions[lang][entry.slot] == entry.clean
        assert by_id[entry.id].captions[lang][entry.slot] == entry.noisy
        assert (entry.noisy != entry.clean) == (entry.kind is not None)
    # Only the target language changes.
    for before, after in zip(records, noisy, strict=True):
        assert before.captions["en"] == after.captions["en"] and before.image == after.image
    if rate >= 0.4:  # every kind is drawn
        kinds = Counter(e.kind for e in corrupted)
        assert set(kinds) == set(KINDS), kinds
        assert min(kinds.values()) >= 0.1 * len(corrupted), kinds


def test_noise_is_deterministic_per_seed(records) -> None:
    a = corrupt_records(records, "it", "en", 0.3, seed=1)[1]
    b = corrupt_records(records, "it", "en", 0.3, seed=1)[1]
    c = corrupt_records(records, "it", "en", 0.3, seed=2)[1]
    assert a == b
    assert [e.kind is None for e in a] != [e.kind is None for e in c]


def test_each_kind_on_hand_made_captions() -> None:
    italian = "tre tazze rosse a righe"
    out, kind, _ = corrupt(italian, "it", "en", random.Random(0), "agreement")
    assert kind == "agreement" and out in {f"tre tazze {f} a righe" for f in ("rosso", "rossa", "rossi")}
    out, _, detail = corrupt(italian, "it", "en", random.Random(0), "attribute")
    colours = {"arancioni", "gialle", "verdi", "blu", "viola", "rosa", "marroni", "nere", "bianche"}
    words = out.split()
    # Either the colour (in the feminine plural "tazze" needs) or the pattern changed, nothing else.
    assert (words[2] in colours and words[3:] == ["a", "righe"]) or (
        words[:3] == ["tre", "tazze", "rosse"] and out != italian
    ), (out, detail)
    assert corrupt(italian, "it", "en", random.Random(0), "copied")[0] in {
        "tre tazze red a righe",
        "tre tazze rosse striped",
        "tre tazze rosse a striped",
        "tre tazze rosse stripes",
    }
    dropped = corrupt(italian, "it", "en", random.Random(0), "dropped")[0].split()
    assert len(dropped) == 4 and Counter(italian.split()) - Counter(dropped)
    arabic = LEXICONS["ar"].describe(
        ProductAttributes("mug", "red", "striped", 2, "left", "grey"), 0, FULL_MENTION
    )
    assert "كوبان أحمران" in arabic  # the dual noun and the dual adjective
    out, _, _ = corrupt(arabic, "ar", "en", random.Random(0), "agreement")
    assert "كوبان" in out and "أحمران" not in out and any(f in out for f in ("أحمر", "حمراء", "حمراوان"))
    copied = corrupt(arabic, "ar", "en", random.Random(1), "copied")[0].split()
    assert {"red", "striped", "stripes"} & set(copied) and len(copied) == len(arabic.split()), copied


def test_bad_options_are_refused(records) -> None:
    with pytest.raises(NoiseError, match=r"within 0\.\.1"):
        corrupt_records(records, "it", "en", 1.5)
    with pytest.raises(NoiseError, match="no lexicon"):
        corrupt_records(records, "xx", "en", 0.2)
    with pytest.raises(NoiseError, match="unknown noise kind"):
        corrupt("tre tazze rosse", "it", "en", random.Random(0), "typo")


def test_noisy_records_round_trip(records, tmp_path: Path) -> None:
    noisy, _ = corrupt_records(records, "ar", "en", 0.2, seed=0)
    write_records(noisy, tmp_path / "noisy.jsonl")
    again = load_split(tmp_path / "noisy.jsonl")
    assert [(r.id, r.image, r.captions, r.attributes) for r in again] == [
        (r.id, r.image, r.captions, r.attributes) for r in noisy
    ]
