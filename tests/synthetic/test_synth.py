"""Catalogue generator, reference-format reader and image rendering."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from synthetic import synth
from synthetic.attributes import CATEGORIES, FULL_MENTION, N_COMBINATIONS, ProductAttributes
from synthetic.catalogue import CatalogueFormatError, load_split
from synthetic.lexicons import ADDED_LANGUAGES, LANGUAGES
from synthetic.render import BACKGROUND_RGB, COLOUR_RGB, render_image
from synthetic.synth import SPLITS, SynthConfig, generate_catalogue, iter_items, split_combinations

SMALL = SynthConfig(seed=3, n_train=30, n_val=6, n_test=12, image_size=64)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("catalogue")
    generate_catalogue(out, SMALL)
    return out


def test_layout_and_reference_format(small_catalogue: Path) -> None:
    files = _tree_bytes(small_catalogue)
    assert not [name for name in files if ".tmp-" in name]
    meta = json.loads(files["catalogue.json"])
    assert meta["counts"] == {"train": 30, "val": 6, "test": 12}
    assert meta["config"]["seed"] == 3
    for split in SPLITS:
        records = load_split(small_catalogue / f"{split}.jsonl")
        assert len(records) == SMALL.split_size(split)
        for i, record in enumerate(records):
            assert record.id == f"{split}-{i:06d}"
            assert record.image == (small_catalogue / "images" / split / f"{record.id}.png").resolve()
            with Image.open(record.image) as image:
                assert image.mode == "RGB" and image.size == (64, 64)
            assert list(record.captions) == list(LANGUAGES)
            assert all(len(texts) == SMALL.captions_per_language for texts in record.captions.values())
            assert ProductAttributes.from_dict(record.attributes or {})
    raw = (small_catalogue / "test.jsonl").read_text(encoding="utf-8")
    assert "\\u" not in raw and any(ord(ch) > 0x3000 for ch in raw)  # UTF-8 text, not ASCII escapes


def test_same_seed_is_byte_identical_and_other_seed_differs(small_catalogue: Path, tmp_path: Path) -> None:
    generate_catalogue(tmp_path / "again", SMALL)
    assert _tree_bytes(tmp_path / "again") == _tree_bytes(small_catalogue)
    generate_catalogue(tmp_path / "other", dataclasses.replace(SMALL, seed=4))
    other = _tree_bytes(tmp_path / "other")
    assert other["test.jsonl"] != _tree_bytes(small_catalogue)["test.jsonl"]
    assert other["images/test/test-000000.png"] != _tree_bytes(small_catalogue)["images/test/test-000000.png"]


def test_worker_processes_give_the_same_bytes(
    small_catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(synth, "_PARALLEL_MIN_IMAGES", 0)
    monkeypatch.setattr(synth, "_CHUNK", 8)
    seen: list[tuple[int, int]] = []
    generate_catalogue(tmp_path, SMALL, progress=lambda done, total: seen.append((done, total)), workers=2)
    assert _tree_bytes(tmp_path) == _tree_bytes(small_catalogue)
    assert seen[0] == (0, 48) and seen[-1] == (48, 48)


def test_rewrite_overwrites_per_file_and_keeps_others(tmp_path: Path) -> None:
    config = SynthConfig(n_train=4, n_val=2, n_test=2, image_size=32)
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    (tmp_path / "test.jsonl").write_text("stale\n")
    summary = generate_catalogue(tmp_path, config)
    assert keep.read_text() == "mine"
    assert len(load_split(summary.splits["test"])) == 2
    assert summary.counts == {"train": 4, "val": 2, "test": 2}


def test_splits_are_disjoint_and_held_out_items_unique() -> None:
    config = SynthConfig()
    combos = {split: split_combinations(split, config) for split in SPLITS}
    test, val, train = set(combos["test"]), set(combos["val"]), set(combos["train"])
    assert len(test) == len(combos["test"]) == 1000
    assert len(val) == len(combos["val"]) == 500
    assert not test & val and not train & (test | val)
    assert len(combos["train"]) == 20000
    assert len(train) == 20000  # the pool holds 21,540 combinations, so no repeats yet


def test_train_repeats_combinations_only_past_the_pool() -> None:
    config = SynthConfig(n_train=N_COMBINATIONS, n_val=40, n_test=60)
    train = split_combinations("train", config)
    held_out = set(split_combinations("test", config)) | set(split_combinations("val", config))
    assert len(set(train)) == N_COMBINATIONS - 100 and not set(train) & held_out


def test_too_many_held_out_items_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="exceeds the 23040 distinct attribute combinations"):
        SynthConfig(n_test=20000, n_val=5000)


def test_held_out_captions_never_coincide_and_mention_everything() -> None:
    config = SynthConfig(n_train=0)
    items = list(iter_items("test", config)) + list(iter_items("val", config))
    for lang in LANGUAGES:
        captions = [c for item in items for c in item.captions[lang]]
        assert len(set(captions)) == len(captions), lang
    for item in items:
        assert item.mentions == (FULL_MENTION, FULL_MENTION)
        assert item.phrasings[0] != item.phrasings[1]


def test_items_are_order_independent_and_captions_aligned() -> None:
    config = SynthConfig(n_train=200, n_val=10, n_test=10, captions_per_language=3)
    items = list(iter_items("train", config))
    assert items == list(iter_items("train", config))
    bigger = SynthConfig(n_train=400, n_val=10, n_test=10, captions_per_language=3)
    assert list(iter_items("train", bigger))[:200] == items
    dropped = {name for item in items for mention in item.mentions for name in FULL_MENTION - mention}
    assert {"placement", "background"} <= dropped
    for item in items:
        assert all(len(texts) == 3 and all(texts) for texts in item.captions.values())
        assert all("category" in mention and "colour" in mention for mention in item.mentions)
        # The j-th captions are translations: an unmentioned background is absent in every language.
        for j, mention in enumerate(item.mentions):
            if "background" not in mention:
                assert "background" not in item.captions["en"][j] and "backdrop" not in item.captions["en"][j]
                assert "Hintergrund" not in item.captions["de"][j] and "背景" not in item.captions["zh"][j]


_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def test_added_languages_leave_the_original_ten_byte_identical(small_catalogue: Path, tmp_path: Path) -> None:
    """With the added languages named in `languages=`, every record keeps the default catalogue's captions
    in the original ten (same seed) and gains captions in the added ones; images are unchanged."""
    generate_catalogue(tmp_path, dataclasses.replace(SMALL, languages=LANGUAGES + ADDED_LANGUAGES), workers=1)
    for split in SPLITS:
        default = load_split(small_catalogue / f"{split}.jsonl")
        extended = load_split(tmp_path / f"{split}.jsonl")
        assert [record.id for record in extended] == [record.id for record in default]
        for old, new in zip(default, extended, strict=True):
            assert list(new.captions) == [*LANGUAGES, *ADDED_LANGUAGES]
            assert {lang: new.captions[lang] for lang in LANGUAGES} == old.captions
            assert new.attributes == old.attributes
            for lang in ADDED_LANGUAGES:
                assert len(new.captions[lang]) == SMALL.captions_per_language
                assert len(set(new.captions[lang])) == len(new.captions[lang])  # different phrasings
            for text in new.captions["ar"]:
                assert any("\u0621" <= ch <= "\u064a" for ch in text), text  # Arabic letters
                assert not _BIDI_CONTROLS & set(text), ascii(text)
    meta = json.loads((tmp_path / "catalogue.json").read_text(encoding="utf-8"))
    assert meta["config"]["languages"] == [*LANGUAGES, *ADDED_LANGUAGES]
    images = {name: data for name, data in _tree_bytes(tmp_path).items() if name.startswith("images")}
    assert images == {n: d for n, d in _tree_bytes(small_catalogue).items() if n.startswith("images")}


def test_added_languages_keep_the_caption_plan_of_training_items() -> None:
    """Training captions drop attributes and cycle phrasings; both stay as in the default catalogue."""
    default = SynthConfig(seed=11, n_train=150, n_val=5, n_test=5, captions_per_language=4)
    extended = dataclasses.replace(default, languages=LANGUAGES + ADDED_LANGUAGES)
    for old, new in zip(iter_items("train", default), iter_items("train", extended), strict=True):
        assert (new.mentions, new.phrasings, new.image_seed) == (old.mentions, old.phrasings, old.image_seed)
        assert {lang: new.captions[lang] for lang in LANGUAGES} == old.captions
        assert all(len(new.captions[lang]) == 4 for lang in ADDED_LANGUAGES)


# ----------------------------------------------------------------------------------------------- reader


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "split.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"id": "a", "image": "images/a.png", "captions": {"en": ["red mug"]}})


def test_load_split_reads_minimal_records(tmp_path: Path) -> None:
    path = _write(
        tmp_path, [GOOD, "", json.dumps({"id": "b", "image": "/abs/b.png", "captions": {"de": ["x"]}})]
    )
    records = load_split(path)
    assert [r.id for r in records] == ["a", "b"]
    assert records[0].image == (tmp_path / "images" / "a.png").resolve()
    assert records[1].image == Path("/abs/b.png") and records[1].attributes is None


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "b", "image": ', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        (json.dumps({"image": "x.png", "captions": {"en": ["x"]}}), "missing field 'id'"),
        (json.dumps({"id": "b", "captions": {"en": ["x"]}}), "missing field 'image'"),
        (json.dumps({"id": "b", "image": "x.png"}), "missing field 'captions'"),
        (json.dumps({"id": "b", "image": "x.png", "captions": {"en": "x"}}), "captions\\['en'\\]"),
        (json.dumps({"id": "b", "image": "x.png", "captions": {"en": [""]}}), "non-empty string"),
        (json.dumps({"id": "b", "image": "x.png", "captions": {"en": ["x"]}, "attributes": 3}), "attributes"),
        (GOOD, "duplicate id 'a' \\(first on line 1\\)"),
    ],
)
def test_load_split_errors_name_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = _write(tmp_path, [GOOD, bad_line])
    with pytest.raises(CatalogueFormatError, match=message) as info:
        load_split(path)
    assert str(info.value).startswith(f"{path.resolve()}:2: ")
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------------------------- rendering


def _render(seed: int = 0, **changes: object) -> np.ndarray:
    fields = {"category": "mug", "colour": "red", "pattern": "plain", "count": 1, "placement": "centre"}
    fields["background"] = "grey"
    fields.update(changes)
    return np.asarray(
        render_image(ProductAttributes(**fields), 96, np.random.default_rng(seed)), dtype=np.int32
    )


def _share_near(pixels: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 30) -> float:
    return float((np.abs(pixels - np.asarray(rgb)).max(axis=-1) <= tolerance).mean())


def test_renders_are_seeded_and_jittered() -> None:
    assert np.array_equal(_render(1), _render(1))
    assert not np.array_equal(_render(1), _render(2))


def test_colour_dominates_the_object() -> None:
    for colour, rgb in COLOUR_RGB.items():
        pixels = _render(colour=colour, background="beige" if colour == "white" else "white")
        assert _share_near(pixels, rgb) > 0.08, colour
        # White would match the white background and black the dark outline, so they are left out.
        others = [c for c in COLOUR_RGB if c not in (colour, "white", "black")]
        assert all(_share_near(pixels, COLOUR_RGB[c], 12) < 0.02 for c in others), colour


def test_patterns_are_visible() -> None:
    plain = _render(pattern="plain", colour="blue", count=1)
    mean_abs_diff = {
        pattern: np.abs(np.diff(_render(pattern=pattern, colour="blue"), axis=1)).mean()
        for pattern in ("striped", "dotted", "checked")
    }
    baseline = np.abs(np.diff(plain, axis=1)).mean()
    assert all(value > 1.5 * baseline for value in mean_abs_diff.values()), (baseline, mean_abs_diff)
    assert _share_near(_render(pattern="striped", colour="blue"), COLOUR_RGB["blue"]) > 0.05


def test_white_products_stand_out_on_a_white_background() -> None:
    pixels = _render(colour="white", background="white")
    dark = (pixels.max(axis=-1) < 120).mean()
    assert dark > 0.01  # the outline and shadow


def test_placement_moves_the_group() -> None:
    def centre_of_mass(placement: str) -> float:
        pixels = _render(placement=placement, count=3, background="white")
        fg = np.abs(pixels - np.asarray(BACKGROUND_RGB["white"])).max(axis=-1) > 40
        return float(np.nonzero(fg)[1].mean())

    left, centre, right = (centre_of_mass(p) for p in ("left", "centre", "right"))
    assert left < 40 < centre < 56 < right


def _blobs(foreground: np.ndarray) -> int:
    """8-connected components of a boolean image (small images only)."""
    seen = np.zeros_like(foreground)
    height, width = foreground.shape
    blobs = 0
    for start in zip(*np.nonzero(foreground), strict=True):
        if seen[start]:
            continue
        blobs += 1
        stack = [start]
        seen[start] = True
        while stack:
            y, x = stack.pop()
            for ny in range(max(y - 1, 0), min(y + 2, height)):
                for nx in range(max(x - 1, 0), min(x + 2, width)):
                    if foreground[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        stack.append((ny, nx))
    return blobs


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_count_is_the_number_of_separate_products(count: int) -> None:
    """Products never touch each other or the border, so the count can be read off the image."""
    for seed, category in enumerate(CATEGORIES):
        placement = ("left", "centre", "right")[seed % 3]
        pixels = _render(seed, category=category, count=count, placement=placement, background="white")
        foreground = np.abs(pixels - np.asarray(BACKGROUND_RGB["white"])).max(axis=-1) > 40
        assert _blobs(foreground) == count, category
        border = np.concatenate([foreground[0], foreground[-1], foreground[:, 0], foreground[:, -1]])
        assert not border.any(), category
