"""Hand-written caption lexicons, one module per language, each exposing `describe` and `N_PHRASINGS`."""

from __future__ import annotations

from types import ModuleType

from synthetic.lexicons import cs, de, en, es, fr, id, ja, ru, tr, zh

LANGUAGES: tuple[str, ...] = ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
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
}

__all__ = ["LANGUAGES", "LEXICONS"]
