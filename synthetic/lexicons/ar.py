"""Arabic (Modern Standard) captions, unvocalised, stored in logical order without bidi controls.

Adjectives follow the noun and agree with it: masculine or feminine singular for one item ("كوب أحمر",
"سيارة حمراء"), dual for two ("كوبان أحمران", "سيارتان بيضاوان"; the dual noun alone says "two"), and,
as non-human plurals do, feminine singular with a plural noun ("ثلاثة أكواب حمراء"). Nouns take their
real plurals, broken where the language has one (أكواب، حقائب، مصابيح، كراسي، كتب). "واحد/واحدة"
follows the noun for one; 3 and 4 precede a plural noun with reverse gender agreement: "ثلاثة أكواب" for a
masculine singular noun, "ثلاث سيارات" for a feminine one. After "باللون" (in the colour) the colour takes
the definite article and the masculine of "اللون" ("باللون الأحمر"). Nouns stay in the nominative: the
product is the subject or a fronted-predicate sentence's subject ("على خلفية رمادية ثلاثة أكواب").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3

_SEP = "، "  # Arabic comma


@dataclass(frozen=True)
class _Noun:
    gender: str  # "m" or "f"
    singular: str
    dual: str  # nominative
    plural: str


@dataclass(frozen=True)
class _Adj:
    """Forms (m sg, f sg, m dual, f dual); one form means invariable. A non-human plural takes f sg."""

    forms: tuple[str, ...]

    def agree(self, gender: str, number: str) -> str:
        if len(self.forms) == 1:
            return self.forms[0]
        if number == "pl":
            return self.forms[1]
        return self.forms[(2 if number == "du" else 0) + (1 if gender == "f" else 0)]


def _inv(word: str) -> _Adj:
    return _Adj((word,))


def _colour(m: str, f: str) -> _Adj:
    """Colour of the أفعل/فعلاء pattern: duals أحمران/حمراوان (the hamza of فعلاء turns into و)."""
    return _Adj((m, f, m + "ان", f[:-1] + "وان"))


def _nisba(m: str) -> _Adj:
    """Adjective in -ي: برتقالي/برتقالية/برتقاليان/برتقاليتان."""
    return _Adj((m, m + "ة", m + "ان", m + "تان"))


def _regular(m: str) -> _Adj:
    """Adjective or participle with feminine -ة: مخطط/مخططة/مخططان/مخططتان."""
    return _Adj((m, m + "ة", m + "ان", m + "تان"))


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("m", "كوب", "كوبان", "أكواب"),
    "t_shirt": _Noun("m", "تيشيرت", "تيشيرتان", "تيشيرتات"),
    "hat": _Noun("f", "قبعة", "قبعتان", "قبعات"),
    "bag": _Noun("f", "حقيبة", "حقيبتان", "حقائب"),
    "lamp": _Noun("m", "مصباح", "مصباحان", "مصابيح"),
    "chair": _Noun("m", "كرسي", "كرسيان", "كراسي"),
    "bottle": _Noun("f", "زجاجة", "زجاجتان", "زجاجات"),
    "clock": _Noun("f", "ساعة", "ساعتان", "ساعات"),
    "umbrella": _Noun("f", "مظلة", "مظلتان", "مظلات"),
    "ball": _Noun("f", "كرة", "كرتان", "كرات"),
    "book": _Noun("m", "كتاب", "كتابان", "كتب"),
    "car": _Noun("f", "سيارة", "سيارتان", "سيارات"),
}
_COLOURS: dict[str, _Adj] = {
    "red": _colour("أحمر", "حمراء"),
    "orange": _nisba("برتقالي"),
    "yellow": _colour("أصفر", "صفراء"),
    "green": _colour("أخضر", "خضراء"),
    "blue": _colour("أزرق", "زرقاء"),
    "purple": _nisba("بنفسجي"),
    "pink": _nisba("وردي"),
    "brown": _nisba("بني"),
    "black": _colour("أسود", "سوداء"),
    "white": _colour("أبيض", "بيضاء"),
}
_PATTERNS: dict[str, _Adj] = {
    "plain": _inv("سادة"),
    "striped": _regular("مخطط"),
    "dotted": _regular("منقط"),
    "checked": _inv("بمربعات"),
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "بدون نقشة",
    "striped": "بنقشة خطوط",
    "dotted": "بنقشة نقاط",
    "checked": "بنقشة مربعات",
}
_PLACED = _regular("موضوع")
_ONE: dict[str, str] = {"m": "واحد", "f": "واحدة"}
# Reverse agreement: the form in -ة goes with a masculine singular noun.
_THREE_FOUR: dict[tuple[int, str], str] = {
    (3, "m"): "ثلاثة",
    (3, "f"): "ثلاث",
    (4, "m"): "أربعة",
    (4, "f"): "أربع",
}
_PLACE: dict[str, str] = {"left": "على اليسار", "centre": "في الوسط", "right": "على اليمين"}
_PLACE_SIDE: dict[str, str] = {"left": "في الجهة اليسرى", "centre": "في المنتصف", "right": "في الجهة اليمنى"}
# Feminine singular, agreeing with "خلفية" (background).
_BACKGROUNDS: dict[str, str] = {
    "white": "بيضاء",
    "grey": "رمادية",
    "beige": "بيج",
    "light_blue": "زرقاء فاتحة",
}


def definite(word: str) -> str:
    """The article ال, written joined and unvocalised whether the letter is a sun or a moon letter."""
    return f"ال{word}"


def _number(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    """'sg', 'du' (only for a mentioned two) or 'pl'."""
    if attrs.count == 1:
        return "sg"
    return "du" if attrs.count == 2 and "count" in mention else "pl"


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str], *, adjectives: bool) -> str:
    noun = _NOUNS[attrs.category]
    number = _number(attrs, mention)
    counted = "count" in mention
    words: list[str | None] = []
    if number == "pl" and counted:
        words.append(_THREE_FOUR[(attrs.count, noun.gender)])
    words.append({"sg": noun.singular, "du": noun.dual, "pl": noun.plural}[number])
    if number == "sg" and counted:
        words.append(_ONE[noun.gender])
    if adjectives:
        if "colour" in mention:
            words.append(_COLOURS[attrs.colour].agree(noun.gender, number))
        if "pattern" in mention:
            words.append(_PATTERNS[attrs.pattern].agree(noun.gender, number))
    else:
        if "colour" in mention:
            # "اللون" is masculine singular and definite whatever the noun.
            words.append(f"ب{definite('لون')} {definite(_COLOURS[attrs.colour].agree('m', 'sg'))}")
        if "pattern" in mention:
            words.append(_PATTERN_WITH[attrs.pattern])
    return join_words(*words)


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "ثلاثة أكواب حمراء مخططة على اليسار، على خلفية رمادية"
    np = _noun_phrase(attrs, mention, adjectives=True)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"على خلفية {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(join_words(np, place), background, sep=_SEP)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "ثلاثة أكواب باللون الأحمر بنقشة خطوط، موضوعة على اليسار، الخلفية رمادية"
    np = _noun_phrase(attrs, mention, adjectives=False)
    place = None
    if "placement" in mention:
        participle = _PLACED.agree(_NOUNS[attrs.category].gender, _number(attrs, mention))
        place = f"{participle} {_PLACE[attrs.placement]}"
    background = f"{definite('خلفية')} {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(np, place, background, sep=_SEP)


def _p_location_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "على خلفية رمادية في الجهة اليسرى ثلاثة أكواب حمراء مخططة"
    background = f"على خلفية {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    return join_words(background, place, _noun_phrase(attrs, mention, adjectives=True))


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_location_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Arabic caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
