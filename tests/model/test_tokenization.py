"""The tokenizer never fails: ten scripts, emoji, mixed scripts, empty and huge strings."""

from pathlib import Path

import pytest

from model.tokenization import SPECIAL_TOKENS, TokenizerError, load_tokenizer, tokenize, train_tokenizer

CORPUS = [
    "three red striped mugs on the left",
    "drei rote gestreifte Tassen links",
    "trois tasses rouges rayées à gauche",
    "tři červené pruhované hrnky vlevo",
    "左側に赤いストライプのマグカップが3個",
    "左边有三个红色条纹马克杯",
    "tres tazas rojas a rayas a la izquierda",
    "три красные полосатые кружки слева",
    "solda üç kırmızı çizgili kupa",
    "tiga mug merah bergaris di kiri",
] * 20

# Scripts and junk the training corpus never saw.
UNSEEN = [
    "",
    " ",
    "ελληνικά κόκκινη κούπα",  # Greek
    "كوب أحمر مخطط",  # Arabic
    "लाल धारीदार मग",  # Devanagari
    "빨간 줄무늬 머그",  # Hangul
    "แก้วสีแดง",  # Thai
    "כוס אדומה",  # Hebrew
    "😀🛍️👟🇩🇪",
    "red マグ 杯子 кружка 🛍",
    "\x00\x01\ufffd\u200b\u202e",
    "x" * 10_000,
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=600, model_max_length=32)


def test_special_tokens_follow_xlmr(tokenizer) -> None:
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.pad_token_id == 1 and tokenizer.mask_token_id == 4


@pytest.mark.parametrize("text", CORPUS[:10])
def test_ten_scripts_round_trip(tokenizer, text: str) -> None:
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True).strip() == text


def test_unseen_input_never_fails(tokenizer) -> None:
    batch = tokenize(tokenizer, UNSEEN, max_length=32)
    assert batch["input_ids"].shape == (len(UNSEEN), 32)  # the 10,000-char string is truncated
    lengths = batch["attention_mask"].sum(dim=1)
    assert lengths[0] == 2  # empty string: <s></s>
    assert (lengths >= 2).all()
    # Byte-level: nothing maps to <unk>.
    assert not (batch["input_ids"] == tokenizer.unk_token_id).any()
    assert (
        tokenizer.decode(tokenizer("빨간 줄무늬 머그")["input_ids"], skip_special_tokens=True).strip()
        == "빨간 줄무늬 머그"
    )


def test_tokenize_rejects_a_bare_string(tokenizer) -> None:
    with pytest.raises(TypeError, match="sequence of strings"):
        tokenize(tokenizer, "red mug", 32)


def test_save_and_load(tokenizer, tmp_path: Path) -> None:
    tokenizer.save_pretrained(str(tmp_path))
    loaded = load_tokenizer(tmp_path)
    for text in [*CORPUS[:10], *UNSEEN[:-1]]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="cannot load"):
        load_tokenizer(tmp_path)


def test_real_multi30k_sentences_tokenize_losslessly(shared_data: Path) -> None:
    """A tokenizer trained only on the synthetic catalogue still handles real captions in en/de/fr/cs."""
    import gzip

    from synthetic.synth import SynthConfig, iter_items

    corpus = [
        t for item in iter_items("train", SynthConfig(n_train=300)) for v in item.captions.values() for t in v
    ]
    tok = train_tokenizer(corpus, vocab_size=2000, model_max_length=64)
    for lang in ("en", "de", "fr", "cs"):
        path = shared_data / "multi30k" / f"val.{lang}.gz"
        if not path.is_file():
            pytest.skip(f"{path} not found")
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = [next(handle).strip() for _ in range(200)]
        batch = tokenize(tok, lines, max_length=64)
        assert not (batch["input_ids"] == tok.unk_token_id).any()
        for line in lines[:50]:
            ids = tok(line, truncation=True, max_length=512)["input_ids"]
            assert tok.decode(ids, skip_special_tokens=True).strip() == line, lang
