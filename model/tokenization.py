"""Tokenizers: any Hugging Face tokenizer from a local directory (XLM-R's for official checkpoints), or the
byte-level BPE tokenizer the project trains on its own multilingual corpus for the demo model.

Byte-level BPE is chosen for the demo because every string is a byte sequence: unseen scripts, emoji and
junk always tokenize (to more pieces), never to an error or an all-unknown sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# XLM-R's special tokens and ids, so the demo tokenizer and XLM-R's are interchangeable for the model.
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
# GPT-2's pre-tokenizer pattern with combining marks (\p{M}) counted as letters: GPT-2's own splits words of
# Devanagari (and other abugidas) at every vowel sign, so no merge can span a word (measured on the synthetic
# Hindi captions: 45.9 tokens a caption with GPT-2's pattern, 14.7 with this one).
WORDS_WITH_MARKS = r"'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}\p{M}]+| ?\p{N}+| ?[^\s\p{L}\p{M}\p{N}]+|\s+(?!\S)|\s+"


class TokenizerError(ValueError):
    """A tokenizer directory is missing or unreadable."""


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, model_max_length: int, marks_in_words: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with XLM-R's special tokens on ``texts``.

    ``marks_in_words`` splits words with ``WORDS_WITH_MARKS`` (combining marks stay inside words) instead of
    GPT-2's pattern; the demo model's tokenizer uses GPT-2's, a language acquirer's (``model.acquisition``)
    this one."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    # NFKC folds full-width forms and compatibility characters that shoppers type interchangeably.
    tokenizer.normalizer = normalizers.NFKC()
    if marks_in_words:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(WORDS_WITH_MARKS), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=model_max_length,
    )


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved in a local directory; never reaches for a hub."""
    path = Path(path)
    if not path.is_dir():
        raise TokenizerError(f"tokenizer directory not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot load a tokenizer from {path}: {exc}") from exc


def tokenize(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> dict[str, torch.Tensor]:
    """Tokenize a batch for the model: pad to the longest, truncate to ``max_length``.

    Empty strings still yield ``<s></s>``; anything longer than ``max_length`` tokens is cut, so a
    10,000-character query costs the same as a 64-token one.
    """
    if isinstance(texts, str):
        raise TypeError("tokenize() takes a sequence of strings, not a single string")
    batch = tokenizer(
        [str(t) for t in texts],
        padding="longest",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
        return_token_type_ids=False,
    )
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
