"""Machine-translation-like noise for a new language's texts (issue 28): a share of the target-language
captions of a catalogue is corrupted the way machine translation goes wrong, and every corruption is
recorded, so that what a method learns from noisy translations can be measured against what was damaged.

Four kinds, each chosen uniformly among those that apply to a text:

- ``attribute``: one attribute word is replaced by another value's word in the same grammatical form (a wrong
  colour, pattern, background or placement: "tazze rosse" -> "tazze verdi"), so the text stays fluent but
  says something else;
- ``agreement``: the colour adjective takes another number or gender form of the same word ("tre tazze
  rosse" -> "tre tazze rosso"; Arabic "كوبان أحمران" -> "كوبان حمراء"): ungrammatical, same meaning;
- ``dropped``: one word is left out (a known attribute phrase in a language written without spaces);
- ``copied``: an attribute word is left untranslated, the source language's word copied in its place
  ("tazze rosse" -> "tazze red").

The word forms come from the lexicons themselves (``synthetic.lexicons``): each attribute value is described
in every context (product, count, phrasing) with every other value, and the segment where the two captions
differ is that value's form in that context. A swap therefore only replaces a form by another one of the
same context, and works for any language the lexicons write.

Which texts are corrupted is drawn once per (record, caption slot): exactly ``round(rate * N)`` of the N
slots, seeded, so the same slot carries the same error in the (native, new) pairs of NLT and in the captions
of LE, as a machine-translated catalogue would.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from synthetic.attributes import CATEGORIES, COUNTS, FULL_MENTION, VOCABULARY, ProductAttributes
from synthetic.catalogue import CatalogueRecord
from synthetic.lexicons import LEXICONS

KINDS: tuple[str, ...] = ("attribute", "agreement", "dropped", "copied")
# Attributes whose value a wrong-attribute error changes (the product noun is left: that would be a
# different product, not a translation slip).
SWAPPED: tuple[str, ...] = ("colour", "pattern", "background", "placement")
# Attributes whose forms vary with the noun's gender and number (agreement errors).
AGREEING: tuple[str, ...] = ("colour",)
_REFERENCE = ProductAttributes("mug", "red", "striped", 1, "left", "grey")
_END = r"(?=$|[\s,،.;:])"


class NoiseError(ValueError):
    """Bad noise options (a rate out of range, an unknown language)."""


@dataclass(frozen=True)
class Form:
    """A word form of one attribute value in one context (category, count, phrasing)."""

    attribute: str
    value: str
    context: tuple[str, int, int]
    text: str


@dataclass(frozen=True)
class Corruption:
    """What was done to one text: ``kind`` None when it was left clean."""

    id: str
    slot: int
    kind: str | None
    clean: str
    noisy: str
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "slot": self.slot,
            "kind": self.kind,
            "clean": self.clean,
            "noisy": self.noisy,
            "detail": self.detail,
        }


def _spaced(text: str) -> bool:
    return " " in text


def _differing_span(a: str, b: str, words: bool) -> tuple[int, int]:
    """[start, end) of the part of ``a`` that differs from ``b``, widened to whole words when ``words``."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
    if words:
        while start > 0 and not a[start - 1].isspace():
            start -= 1
        while end_a < len(a) and not (a[end_a].isspace() or a[end_a] in ",،.;:"):
            end_a += 1
    return start, end_a


@cache
def forms(lang: str) -> tuple[Form, ...]:
    """Every (attribute, value, context) form the lexicon of ``lang`` writes, found by difference."""
    if lang not in LEXICONS:
        raise NoiseError(f"no lexicon for language {lang!r}; known: {sorted(LEXICONS)}")
    lexicon = LEXICONS[lang]
    found: dict[tuple[str, str, tuple[str, int, int]], str] = {}
    for phrasing in range(lexicon.N_PHRASINGS):
        for category in CATEGORIES:
            for count in COUNTS:
                base = replace(_REFERENCE, category=category, count=count)
                for attribute in SWAPPED:
                    captions = {
                        str(v): lexicon.describe(replace(base, **{attribute: v}), phrasing, FULL_MENTION)
                        for v in VOCABULARY[attribute]
                    }
                    for value, caption in captions.items():
                        words = _spaced(caption)
                        spans = [
                            _differing_span(caption, other, words)
                            for key, other in captions.items()
                            if key != value and other != caption
                        ]
                        if not spans:
                            continue
                        start, end = min(s for s, _ in spans), max(e for _, e in spans)
                        text = caption[start:end].strip(" ,،")
                        if text:
                            found[(attribute, value, (category, count, phrasing))] = text
    return tuple(Form(a, v, ctx, t) for (a, v, ctx), t in found.items())


@cache
def _index(lang: str) -> dict[str, list[Form]]:
    by_text: dict[str, list[Form]] = {}
    for form in forms(lang):
        by_text.setdefault(form.text, []).append(form)
    return by_text


@cache
def _by_context(lang: str) -> dict[tuple[str, tuple[str, int, int]], dict[str, str]]:
    table: dict[tuple[str, tuple[str, int, int]], dict[str, str]] = {}
    for form in forms(lang):
        table.setdefault((form.attribute, form.context), {})[form.value] = form.text
    return table


@cache
def _by_value(lang: str) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for form in forms(lang):
        table.setdefault((form.attribute, form.value), set()).add(form.text)
    return table


def _find(text: str, segment: str) -> int:
    """Start of ``segment`` as whole words in ``text`` (any position for a text without spaces), or -1."""
    if not _spaced(text):
        return text.find(segment)
    match = re.search(r"(?<!\S)" + re.escape(segment) + _END, text)
    return match.start() if match else -1


def _occurring(text: str, lang: str) -> list[tuple[int, Form]]:
    """The known forms found in ``text``, longest first so that "zaino blu" is preferred over "blu"."""
    hits = []
    for segment, found in _index(lang).items():
        at = _find(text, segment)
        if at >= 0:
            hits.extend((at, form) for form in found)
    return sorted(hits, key=lambda hit: (-len(hit[1].text), hit[0], hit[1].attribute, hit[1].value))


def _swap(text: str, at: int, old: str, new: str) -> str:
    return text[:at] + new + text[at + len(old) :]


def _attribute(text: str, lang: str, rng: random.Random) -> tuple[str, str] | None:
    options = []
    for at, form in _occurring(text, lang):
        if form.attribute not in SWAPPED:
            continue
        others = _by_context(lang)[(form.attribute, form.context)]
        for value, other in sorted(others.items()):
            if value != form.value and other != form.text:
                options.append((at, form, value, other))
    if not options:
        return None
    at, form, value, other = rng.choice(options)
    return _swap(
        text, at, form.text, other
    ), f"{form.attribute} {form.value} -> {value}: {form.text} -> {other}"


def _agreement(text: str, lang: str, rng: random.Random) -> tuple[str, str] | None:
    options = []
    for at, form in _occurring(text, lang):
        if form.attribute not in AGREEING:
            continue
        variants = sorted(_by_value(lang)[(form.attribute, form.value)] - {form.text})
        # Another form of the same word, not a longer or shorter phrase around it.
        variants = [v for v in variants if len(v.split()) == len(form.text.split())]
        options.extend((at, form, v) for v in variants)
    if not options:
        return None
    at, form, other = rng.choice(options)
    return _swap(text, at, form.text, other), f"{form.attribute} {form.value}: {form.text} -> {other}"


def _dropped(text: str, lang: str, rng: random.Random) -> tuple[str, str] | None:
    if _spaced(text):
        words = text.split()
        if len(words) < 3:
            return None
        i = rng.randrange(len(words))
        kept = words[:i] + words[i + 1 :]
        return " ".join(kept), f"word {i} {words[i]!r}"
    hits = [(at, form) for at, form in _occurring(text, lang) if form.attribute in SWAPPED]
    if not hits:
        return None
    at, form = rng.choice(hits)
    return _swap(text, at, form.text, ""), f"{form.attribute} {form.text!r}"


def _copied(text: str, lang: str, source: str, rng: random.Random) -> tuple[str, str] | None:
    if source == lang:
        return None
    options = []
    for at, form in _occurring(text, lang):
        if form.attribute not in ("colour", "pattern"):
            continue
        copies = sorted(_by_value(source).get((form.attribute, form.value), set()) - {form.text})
        shortest = min((len(c.split()) for c in copies), default=0)  # "red", not "a red"
        options.extend((at, form, c) for c in copies if len(c.split()) == shortest)
    if not options:
        return None
    at, form, copy = rng.choice(options)
    return _swap(
        text, at, form.text, copy
    ), f"{form.attribute} {form.value}: {form.text} -> {copy} ({source})"


def corrupt(
    text: str, lang: str, source: str, rng: random.Random, kind: str | None = None
) -> tuple[str, str, str]:
    """(noisy text, kind, detail): one MT-like error in ``text`` (a ``lang`` caption translated from
    ``source``), of ``kind`` or of a kind drawn among those that apply. Raises ``NoiseError`` when none
    applies."""
    makers = {
        "attribute": lambda: _attribute(text, lang, rng),
        "agreement": lambda: _agreement(text, lang, rng),
        "dropped": lambda: _dropped(text, lang, rng),
        "copied": lambda: _copied(text, lang, source, rng),
    }
    if kind is not None and kind not in makers:
        raise NoiseError(f"unknown noise kind {kind!r}; one of {list(KINDS)}")
    order = [kind] if kind else rng.sample(list(KINDS), len(KINDS))
    for name in order:
        made = makers[name]()
        if made is not None and made[0] != text:
            return made[0], name, made[1]
    raise NoiseError(f"no MT-like error applies to the {lang} text {text!r}")


def corrupt_records(
    records: Sequence[CatalogueRecord], lang: str, source: str, rate: float, seed: int = 0
) -> tuple[list[CatalogueRecord], list[Corruption]]:
    """Records whose ``lang`` captions have exactly ``round(rate * N)`` of their N slots corrupted (drawn
    with ``seed``), and the log of every slot (``kind`` None for the clean ones), in record and slot order."""
    if not 0.0 <= rate <= 1.0:
        raise NoiseError(f"noise rate must be within 0..1, got {rate}")
    forms(lang), forms(source)  # unknown languages fail here
    slots = [(i, j) for i, r in enumerate(records) for j in range(len(r.captions.get(lang, ())))]
    rng = random.Random(f"noise:{seed}:{lang}")
    chosen = set(rng.sample(range(len(slots)), round(rate * len(slots))))
    out = list(records)
    log: list[Corruption] = []
    for n, (i, j) in enumerate(slots):
        record = out[i]
        clean = record.captions[lang][j]
        if n not in chosen:
            log.append(Corruption(record.id, j, None, clean, clean))
            continue
        noisy, kind, detail = corrupt(clean, lang, source, random.Random(f"noise:{seed}:{record.id}:{j}"))
        captions = {k: list(v) for k, v in record.captions.items()}
        captions[lang][j] = noisy
        out[i] = replace(record, captions=captions)
        log.append(Corruption(record.id, j, kind, clean, noisy, detail))
    return out, log


def write_records(records: Sequence[CatalogueRecord], path: Path) -> None:
    """A catalogue jsonl of ``records`` (absolute image paths, so it may live anywhere)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for r in records:
            row: dict[str, object] = {"id": r.id, "image": str(r.image), "captions": r.captions}
            if r.attributes is not None:
                row["attributes"] = r.attributes
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def write_log(log: Sequence[Corruption], path: Path, lines: dict[tuple[str, int], int] | None = None) -> None:
    """One JSON object per slot (``Corruption.to_json``), with ``line`` (the pair's 1-based line in the
    TSV) when ``lines`` maps (id, slot) to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for entry in log:
            row = entry.to_json()
            if lines is not None:
                row = {"line": lines[(entry.id, entry.slot)], **row}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def summarise(log: Sequence[Corruption]) -> dict[str, object]:
    """Share corrupted and count per kind."""
    kinds = {k: sum(e.kind == k for e in log) for k in KINDS}
    corrupted = sum(kinds.values())
    return {"slots": len(log), "corrupted": corrupted, "rate": corrupted / max(1, len(log)), "kinds": kinds}
