"""Hand-written caption lexicons, one module per language, each exposing `describe` and `N_PHRASINGS`.

`LANGUAGES` are the ten the default catalogue (and the shipped demo model) uses; `ADDED_LANGUAGES` are
written only when a `SynthConfig` names them in `languages=`. Their `N_PHRASINGS` never exceeds the
largest of the ten, so adding them leaves the original languages' captions byte-identical.
"""

from __future__ import annotations

from types import ModuleType

from synthetic.lexicons import ar, cs, de, en, es, fr, hi, id, it, ja, ko, ru, tr, zh

LANGUAGES: tuple[str, ...] = ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
ADDED_LANGUAGES: tuple[str, ...] = ("ko", "ar", "hi", "it")
ALL_LANGUAGES: tuple[str, ...] = LANGUAGES + ADDED_LANGUAGES
LEXICONS: dict[str, ModuleType] = {
    "en": en,
    "de": de,
    "fr": fr,
    "cs": cs,
    "ja": ja,
    "zh": zh,
    "es": es,
    "ru": ru,
    "tr": tr,
    "id": id,
    "ko": ko,
    "ar": ar,
    "hi": hi,
    "it": it,
}

__all__ = ["ADDED_LANGUAGES", "ALL_LANGUAGES", "LANGUAGES", "LEXICONS"]
