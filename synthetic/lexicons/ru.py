"""Russian captions.

Numerals govern case: 1 agrees (один/одна) with a nominative singular noun; 2-4 take the genitive
singular of the noun, "два" for masculine and "две" for feminine nouns; the adjective then stands in the
genitive plural for masculine nouns ("два красных мяча") and, as is usual, in the nominative plural for
feminine ones ("две красные кружки"). "часы" (clock) is plurale tantum: "одни часы", and collective
numerals with genitive plural for 2-4 ("двое красных часов").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3


@dataclass(frozen=True)
class _Noun:
    gender: str  # "m", "f" or "pt" (plurale tantum)
    nom_sg: str
    gen_sg: str
    nom_pl: str
    gen_pl: str


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("f", "кружка", "кружки", "кружки", "кружек"),
    "t_shirt": _Noun("f", "футболка", "футболки", "футболки", "футболок"),
    "hat": _Noun("f", "шляпа", "шляпы", "шляпы", "шляп"),
    "bag": _Noun("f", "сумка", "сумки", "сумки", "сумок"),
    "lamp": _Noun("f", "лампа", "лампы", "лампы", "ламп"),
    "chair": _Noun("m", "стул", "стула", "стулья", "стульев"),
    "bottle": _Noun("f", "бутылка", "бутылки", "бутылки", "бутылок"),
    "clock": _Noun("pt", "часы", "часов", "часы", "часов"),
    "umbrella": _Noun("m", "зонт", "зонта", "зонты", "зонтов"),
    "ball": _Noun("m", "мяч", "мяча", "мячи", "мячей"),
    "book": _Noun("f", "книга", "книги", "книги", "книг"),
    "car": _Noun("f", "машина", "машины", "машины", "машин"),
}

# Adjective endings by declension type: hard (-ый), soft (-ий) and end-stressed (-ой).
_ENDINGS: dict[str, dict[str, str]] = {
    "hard": {"m": "ый", "f": "ая", "pl": "ые", "gen_pl": "ых", "gen_m": "ого", "prep_m": "ом"},
    "soft": {"m": "ий", "f": "яя", "pl": "ие", "gen_pl": "их", "gen_m": "его", "prep_m": "ем"},
    "stressed": {"m": "ой", "f": "ая", "pl": "ые", "gen_pl": "ых", "gen_m": "ого", "prep_m": "ом"},
}


@dataclass(frozen=True)
class _Adj:
    stem: str
    kind: str = "hard"

    def form(self, slot: str) -> str:
        return self.stem + _ENDINGS[self.kind][slot]


_COLOURS: dict[str, _Adj] = {
    "red": _Adj("красн"),
    "orange": _Adj("оранжев"),
    "yellow": _Adj("жёлт"),
    "green": _Adj("зелён"),
    "blue": _Adj("син", "soft"),
    "purple": _Adj("фиолетов"),
    "pink": _Adj("розов"),
    "brown": _Adj("коричнев"),
    "black": _Adj("чёрн"),
    "white": _Adj("бел"),
}
# "в горошек" has no adjective form in use, so dotted stays a postposed phrase even in adjective slots.
_PATTERN_ADJ: dict[str, _Adj | str] = {
    "plain": _Adj("однотонн"),
    "striped": _Adj("полосат"),
    "dotted": "в горошек",
    "checked": _Adj("клетчат"),
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "без узора",
    "striped": "в полоску",
    "dotted": "в горошек",
    "checked": "в клетку",
}
_BACKGROUNDS: dict[str, _Adj] = {
    "white": _Adj("бел"),
    "grey": _Adj("сер"),
    "beige": _Adj("бежев"),
    "light_blue": _Adj("голуб", "stressed"),
}
_PLACED = _Adj("расположенн")
_PLACE: dict[str, str] = {"left": "слева", "centre": "в центре", "right": "справа"}
_PLACE_SIDE: dict[str, str] = {"left": "с левой стороны", "centre": "посередине", "right": "с правой стороны"}
_ONE: dict[str, str] = {"m": "один", "f": "одна", "pt": "одни"}
_TWO: dict[str, str] = {"m": "два", "f": "две"}
_THREE_FOUR: dict[int, str] = {3: "три", 4: "четыре"}
_COLLECTIVE: dict[int, str] = {2: "двое", 3: "трое", 4: "четверо"}


def _agreement(attrs: ProductAttributes, counted: bool) -> tuple[str, str]:
    """(adjective slot, noun form) for the noun phrase; `counted` says whether a numeral precedes it."""
    noun = _NOUNS[attrs.category]
    if attrs.count == 1:
        return ("pl", noun.nom_pl) if noun.gender == "pt" else (noun.gender, noun.nom_sg)
    if not counted:
        return "pl", noun.nom_pl
    if noun.gender == "pt":
        return "gen_pl", noun.gen_pl
    return ("pl" if noun.gender == "f" else "gen_pl"), noun.gen_sg


def _numeral(attrs: ProductAttributes) -> str:
    gender = _NOUNS[attrs.category].gender
    if attrs.count == 1:
        return _ONE[gender]
    if gender == "pt":
        return _COLLECTIVE[attrs.count]
    return _TWO[gender] if attrs.count == 2 else _THREE_FOUR[attrs.count]


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str], *, adjectives: bool) -> str:
    counted = "count" in mention
    slot, noun = _agreement(attrs, counted)
    before: list[str] = []
    after: list[str] = []
    if adjectives:
        if "colour" in mention:
            before.append(_COLOURS[attrs.colour].form(slot))
        if "pattern" in mention:
            pattern = _PATTERN_ADJ[attrs.pattern]
            if isinstance(pattern, _Adj):
                before.append(pattern.form(slot))
            else:
                after.append(pattern)
    else:
        if "colour" in mention:
            after.append(f"{_COLOURS[attrs.colour].form('gen_m')} цвета")
        if "pattern" in mention:
            after.append(_PATTERN_WITH[attrs.pattern])
    return join_words(_numeral(attrs) if counted else None, *before, noun, *after)


def _on_background(attrs: ProductAttributes) -> str:
    return f"на {_BACKGROUNDS[attrs.background].form('prep_m')} фоне"


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "две красные полосатые кружки слева на сером фоне"
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = _on_background(attrs) if "background" in mention else None
    return join_words(_noun_phrase(attrs, mention, adjectives=True), place, background)


def _p_colour_genitive(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "две кружки красного цвета в полоску, расположенные слева, фон серый"
    place = None
    if "placement" in mention:
        # The participle after the comma agrees with the whole group: plural unless a single item.
        gender = _NOUNS[attrs.category].gender
        slot = gender if attrs.count == 1 and gender != "pt" else "pl"
        place = f"{_PLACED.form(slot)} {_PLACE[attrs.placement]}"
    background = f"фон {_BACKGROUNDS[attrs.background].form('m')}" if "background" in mention else None
    return join_words(_noun_phrase(attrs, mention, adjectives=False), place, background, sep=", ")


def _p_location_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "на сером фоне с левой стороны — две красные кружки в полоску"
    colour_only = mention - {"pattern"}
    np = _noun_phrase(attrs, colour_only, adjectives=True)
    if "pattern" in mention:
        np = f"{np} {_PATTERN_WITH[attrs.pattern]}"
    background = _on_background(attrs) if "background" in mention else None
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    location = join_words(background, place)
    return f"{location} — {np}" if location else np


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_genitive,
    _p_location_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Russian caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
