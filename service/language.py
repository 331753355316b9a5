"""Query language identification: py3langid (offline, no torch), with confidence; a hint overrides.

Short shop queries are hard for a general identifier. Measured on captions of the synthetic catalogue in
the model's ten languages cut to 2 / 3 words / whole: py3langid over all its languages was right 61 / 73 /
99.7 % of the time; the rule here 88.5 / 95 / 99.4 %. The decision is made among the model's languages,
unless an unsupported language is clearly more likely than all of them together (Polish, Korean, Greek...):
then the query is still served, labelled with that language and ``supported: false``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from service.schemas import LanguageInfo

# An unsupported language wins only above this probability and when it outweighs the supported ones.
UNSUPPORTED_MIN_P = 0.4
# Close relatives the identifier confuses with a supported language on short queries (on 2-3 word captions
# Indonesian came out Malay, Czech Slovak, Chinese Wu more often than any other error): their probability
# counts for the supported language, and they are never the label.
RELATIVES = {"ms": "id", "sk": "cs", "wuu": "zh", "yue": "zh"}
# Both halves of a query confidently in different languages -> "mixed".
MIXED_HALF_P = 0.9
_WORD = re.compile(r"\w+", re.UNICODE)


def normalise_code(code: str) -> str:
    """``EN``, ``en-US``, ``zh_Hans`` -> ``en``, ``en``, ``zh``."""
    return re.split(r"[-_]", code.strip(), maxsplit=1)[0].lower()


def _scripts(text: str) -> set[str]:
    """Coarse writing systems of the letters (Han and Kana count as one: Japanese uses both)."""
    if text.isascii():  # the common case, without a Unicode name lookup per character
        return {"LATIN"} if any(char.isalpha() for char in text) else set()
    found: set[str] = set()
    for char in text:
        if not char.isalpha():
            continue
        name = unicodedata.name(char, "")
        if name.startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL")):
            found.add("cjk")
        else:
            found.add(name.split(" ", 1)[0])  # LATIN, CYRILLIC, GREEK, ARABIC, ...
    return found


class LanguageDetector:
    """Thread-safe after construction (classification only reads the model)."""

    def __init__(self, supported: Sequence[str]) -> None:
        self.supported = tuple(dict.fromkeys(normalise_code(c) for c in supported))
        self._full = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._full.labels)
        self._restricted = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        restricted = [c for c in self.supported if c in known]
        if restricted:
            self._restricted.set_languages(restricted)
        # One column per label (py3langid folds a label's alias columns into its first one), in the
        # identifier's order: the order ``rank`` breaks ties in, which argmax over these columns keeps.
        first: dict[str, int] = {}
        for column, code in enumerate(self._full.nb_classes):
            first.setdefault(code, column)
        self._codes = list(first)
        self._columns = np.fromiter(first.values(), dtype=np.intp, count=len(first))
        self._counts_as_supported = np.array([RELATIVES.get(c, c) in self.supported for c in self._codes])
        self._is_supported = np.array([c in self.supported for c in self._codes])

    def _probabilities(self, text: str) -> np.ndarray:
        """Probability of each label (``self._codes``) as ``rank`` gives them, without building and sorting
        ~140 (code, p) tuples per query: ``_decide`` is what ``rank`` and ``classify`` call (py3langid is
        pinned in constraints.txt; tests/service/test_language.py checks the result against ``rank``)."""
        return self._full._decide(text)[self._columns].astype(np.float64)

    def hinted(self, hint: str) -> LanguageInfo:
        code = normalise_code(hint)
        return LanguageInfo(code=code, confidence=1.0, source="hint", supported=code in self.supported)

    def detect(self, text: str) -> LanguageInfo:
        if not any(char.isalpha() for char in text):  # digits, symbols: no language to tell
            return LanguageInfo(code="und", confidence=0.0, source="detected", supported=False)
        probs = self._probabilities(text)
        supported_mass = float(probs[self._counts_as_supported].sum())
        outside = np.where(self._counts_as_supported, -1.0, probs)
        top = int(outside.argmax()) if not self._counts_as_supported.all() else int(probs.argmax())
        top_code, top_p = self._codes[top], float(probs[top])
        mixed = self._mixed(text)
        if top_code not in self.supported and top_p >= UNSUPPORTED_MIN_P and top_p > supported_mass:
            return LanguageInfo(
                code=top_code, confidence=round(top_p, 4), source="detected", supported=False, mixed=mixed
            )
        # Restricting the identifier to the supported languages = renormalising its probabilities over them
        # (same raw scores, same temperature), so the full distribution already holds the answer.
        strict = np.where(self._is_supported, probs, -1.0)
        best = int(strict.argmax())
        p = probs[best] / max(float(probs[self._is_supported].sum()), 1e-12)
        return LanguageInfo(
            code=self._codes[best],
            confidence=round(float(p), 4),
            source="detected",
            supported=self._codes[best] in self.supported,
            mixed=mixed,
        )

    def _mixed(self, text: str) -> bool:
        if len(_scripts(text) - {"DIGIT"}) > 1:
            return True
        words = _WORD.findall(text)
        if len(words) < 4:
            return False
        half = len(words) // 2
        first = self._restricted.classify(" ".join(words[:half]))
        second = self._restricted.classify(" ".join(words[half:]))
        return first[0] != second[0] and min(first[1], second[1]) >= MIXED_HALF_P

    def resolve(self, text: str, hint: str | None) -> LanguageInfo:
        return self.hinted(hint) if hint else self.detect(text)
