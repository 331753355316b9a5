"""Czech captions.

Hard adjectives (-ý) agree with the noun: nominative singular -ý/-á/-é (m/f/n), plural -é for masculine
inanimate and feminine nouns, -á for neuter ("dvě červená trička"). Numerals: 1 agrees in gender
(jeden/jedna/jedno), 2 is "dva" (m) or "dvě" (f, n), 2-4 take the nominative plural. "hodiny" (clock) is
plurale tantum and is counted with set numerals: jedny, dvoje, troje, čtvery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3


@dataclass(frozen=True)
class _Noun:
    gender: str  # "m" (all inanimate here), "f" or "n"
    singular: str
    plural: str
    plurale_tantum: bool = False


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("m", "hrnek", "hrnky"),
    "t_shirt": _Noun("n", "tričko", "trička"),
    "hat": _Noun("m", "klobouk", "klobouky"),
    "bag": _Noun("f", "taška", "tašky"),
    "lamp": _Noun("f", "lampa", "lampy"),
    "chair": _Noun("f", "židle", "židle"),
    "bottle": _Noun("f", "láhev", "láhve"),
    "clock": _Noun("f", "hodiny", "hodiny", plurale_tantum=True),
    "umbrella": _Noun("m", "deštník", "deštníky"),
    "ball": _Noun("m", "míč", "míče"),
    "book": _Noun("f", "kniha", "knihy"),
    "car": _Noun("n", "auto", "auta"),
}
# Hard adjective stems (nominative masculine singular = stem + "ý").
_COLOURS: dict[str, str] = {
    "red": "červen",
    "orange": "oranžov",
    "yellow": "žlut",
    "green": "zelen",
    "blue": "modr",
    "purple": "fialov",
    "pink": "růžov",
    "brown": "hněd",
    "black": "čern",
    "white": "bíl",
}
_PATTERNS: dict[str, str] = {
    "plain": "jednobarevn",
    "striped": "pruhovan",
    "dotted": "puntíkovan",
    "checked": "kostkovan",
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "bez vzoru",
    "striped": "s pruhy",
    "dotted": "s puntíky",
    "checked": "s kostkovaným vzorem",
}
_BACKGROUNDS: dict[str, str] = {"white": "bíl", "grey": "šed", "beige": "béžov", "light_blue": "světle modr"}
_PLACED = "umístěn"
_PLACE: dict[str, str] = {"left": "vlevo", "centre": "uprostřed", "right": "vpravo"}
# "ve středu" would also read "on Wednesday", so the centre stays "uprostřed".
_PLACE_SIDE: dict[str, str] = {"left": "na levé straně", "centre": "uprostřed", "right": "na pravé straně"}

# Hard-adjective nominative endings by (gender, plural).
_NOM_ENDINGS: dict[tuple[str, bool], str] = {
    ("m", False): "ý",
    ("f", False): "á",
    ("n", False): "é",
    ("m", True): "é",
    ("f", True): "é",
    ("n", True): "á",
}
_ONE: dict[str, str] = {"m": "jeden", "f": "jedna", "n": "jedno"}
_TWO: dict[str, str] = {"m": "dva", "f": "dvě", "n": "dvě"}
_THREE_FOUR: dict[int, str] = {3: "tři", 4: "čtyři"}
_SET_NUMERALS: dict[int, str] = {1: "jedny", 2: "dvoje", 3: "troje", 4: "čtvery"}


def _is_plural(attrs: ProductAttributes) -> bool:
    return attrs.count > 1 or _NOUNS[attrs.category].plurale_tantum


def _adj(stem: str, attrs: ProductAttributes) -> str:
    return stem + _NOM_ENDINGS[(_NOUNS[attrs.category].gender, _is_plural(attrs))]


def _numeral(attrs: ProductAttributes) -> str:
    noun = _NOUNS[attrs.category]
    if noun.plurale_tantum:
        return _SET_NUMERALS[attrs.count]
    if attrs.count == 1:
        return _ONE[noun.gender]
    if attrs.count == 2:
        return _TWO[noun.gender]
    return _THREE_FOUR[attrs.count]


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str], modifiers: list[str]) -> str:
    """Numeral + agreeing adjective stems + noun in the nominative."""
    noun = _NOUNS[attrs.category]
    numeral = _numeral(attrs) if "count" in mention else None
    word = noun.plural if attrs.count > 1 else noun.singular
    return join_words(numeral, *(_adj(stem, attrs) for stem in modifiers), word)


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tři červené pruhované hrnky vlevo na šedém pozadí"
    stems = []
    if "colour" in mention:
        stems.append(_COLOURS[attrs.colour])
    if "pattern" in mention:
        stems.append(_PATTERNS[attrs.pattern])
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"na {_BACKGROUNDS[attrs.background]}ém pozadí" if "background" in mention else None
    return join_words(_noun_phrase(attrs, mention, stems), place, background)


def _p_colour_genitive(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tři pruhované hrnky červené barvy, umístěné vlevo, šedé pozadí"
    stems = [_PATTERNS[attrs.pattern]] if "pattern" in mention else []
    np = _noun_phrase(attrs, mention, stems)
    if "colour" in mention:
        np = f"{np} {_COLOURS[attrs.colour]}é barvy"  # genitive feminine singular
    place = f"{_adj(_PLACED, attrs)} {_PLACE[attrs.placement]}" if "placement" in mention else None
    background = f"{_BACKGROUNDS[attrs.background]}é pozadí" if "background" in mention else None
    return join_words(np, place, background, sep=", ")


def _p_location_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "na šedém pozadí jsou na levé straně tři červené hrnky s pruhy"
    stems = [_COLOURS[attrs.colour]] if "colour" in mention else []
    pattern = _PATTERN_WITH[attrs.pattern] if "pattern" in mention else None
    np = join_words(_noun_phrase(attrs, mention, stems), pattern)
    background = f"na {_BACKGROUNDS[attrs.background]}ém pozadí" if "background" in mention else None
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    if not (background or place):
        return np
    verb = "jsou" if _is_plural(attrs) else "je"
    if background:
        return join_words(background, verb, place, np)
    return join_words(place, verb, np)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_genitive,
    _p_location_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Czech caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
