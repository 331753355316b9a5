"""Spanish captions.

Adjectives follow the noun and agree in gender and number ("tres tazas rojas rayadas"); "naranja" and
"rosa" are invariable, "marrón" varies only in number ("marrones"); "de lunares"/"a cuadros" are
invariable phrases. After "de color" the adjective agrees with the masculine "color" ("de color rojo").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3


@dataclass(frozen=True)
class _Noun:
    gender: str  # "m" or "f"
    singular: str
    plural: str


@dataclass(frozen=True)
class _Adj:
    """The four forms (m sg, f sg, m pl, f pl); one form means invariable."""

    forms: tuple[str, ...]

    def agree(self, gender: str, plural: bool) -> str:
        if len(self.forms) == 1:
            return self.forms[0]
        return self.forms[(2 if plural else 0) + (1 if gender == "f" else 0)]


def _inv(word: str) -> _Adj:
    return _Adj((word,))


def _o_a(stem: str) -> _Adj:
    """Four-form adjective in -o/-a/-os/-as."""
    return _Adj((stem + "o", stem + "a", stem + "os", stem + "as"))


def _two_form(singular: str, plural: str) -> _Adj:
    """Adjective with one form per number ("verde/verdes", "azul/azules", "marrón/marrones")."""
    return _Adj((singular, singular, plural, plural))


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("f", "taza", "tazas"),
    "t_shirt": _Noun("f", "camiseta", "camisetas"),
    "hat": _Noun("m", "sombrero", "sombreros"),
    "bag": _Noun("m", "bolso", "bolsos"),
    "lamp": _Noun("f", "lámpara", "lámparas"),
    "chair": _Noun("f", "silla", "sillas"),
    "bottle": _Noun("f", "botella", "botellas"),
    "clock": _Noun("m", "reloj", "relojes"),
    "umbrella": _Noun("m", "paraguas", "paraguas"),
    "ball": _Noun("f", "pelota", "pelotas"),
    "book": _Noun("m", "libro", "libros"),
    "car": _Noun("m", "coche", "coches"),
}
_COLOURS: dict[str, _Adj] = {
    "red": _o_a("roj"),
    "orange": _inv("naranja"),
    "yellow": _o_a("amarill"),
    "green": _two_form("verde", "verdes"),
    "blue": _two_form("azul", "azules"),
    "purple": _o_a("morad"),
    "pink": _inv("rosa"),
    "brown": _two_form("marrón", "marrones"),
    "black": _o_a("negr"),
    "white": _o_a("blanc"),
}
_PATTERNS: dict[str, _Adj] = {
    "plain": _o_a("lis"),
    "striped": _o_a("rayad"),
    "dotted": _inv("de lunares"),
    "checked": _inv("a cuadros"),
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "sin estampado",
    "striped": "con rayas",
    "dotted": "con lunares",
    "checked": "con estampado de cuadros",
}
_PLACED = _o_a("colocad")
_NUMERALS: dict[int, str] = {2: "dos", 3: "tres", 4: "cuatro"}
_INDEFINITE: dict[str, str] = {"m": "un", "f": "una"}
_PLACE: dict[str, str] = {"left": "a la izquierda", "centre": "en el centro", "right": "a la derecha"}
_PLACE_PART: dict[str, str] = {
    "left": "en la parte izquierda",
    "centre": "en la parte central",
    "right": "en la parte derecha",
}
_BACKGROUNDS: dict[str, str] = {
    "white": "blanco",
    "grey": "gris",
    "beige": "beige",
    "light_blue": "azul claro",
}


def _determiner(attrs: ProductAttributes, mention: frozenset[str], need_det: bool) -> str | None:
    gender = _NOUNS[attrs.category].gender
    if "count" in mention:
        return _INDEFINITE[gender] if attrs.count == 1 else _NUMERALS[attrs.count]
    # A bare plural is fine after "con"; a bare singular count noun is not.
    return _INDEFINITE[gender] if need_det and attrs.count == 1 else None


def _noun_phrase(
    attrs: ProductAttributes, mention: frozenset[str], *, adjectives: bool, need_det: bool = False
) -> str:
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    words = [_determiner(attrs, mention, need_det), noun.plural if plural else noun.singular]
    if adjectives:
        if "colour" in mention:
            words.append(_COLOURS[attrs.colour].agree(noun.gender, plural))
        if "pattern" in mention:
            words.append(_PATTERNS[attrs.pattern].agree(noun.gender, plural))
    else:
        if "colour" in mention:
            words.append(f"de color {_COLOURS[attrs.colour].agree('m', False)}")
        if "pattern" in mention:
            words.append(_PATTERN_WITH[attrs.pattern])
    return join_words(*words)


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tres tazas rojas rayadas a la izquierda, sobre fondo gris"
    np = _noun_phrase(attrs, mention, adjectives=True)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"sobre fondo {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    if place and background:
        return f"{np} {place}, {background}"
    return join_words(np, place, background)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tres tazas de color rojo con rayas, colocadas a la izquierda, sobre un fondo gris"
    np = _noun_phrase(attrs, mention, adjectives=False)
    place = None
    if "placement" in mention:
        participle = _PLACED.agree(_NOUNS[attrs.category].gender, attrs.count > 1)
        place = f"{participle} {_PLACE[attrs.placement]}"
    background = f"sobre un fondo {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(np, place, background, sep=", ")


def _p_background_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "fondo gris con tres tazas rojas rayadas en la parte izquierda"
    place = _PLACE_PART[attrs.placement] if "placement" in mention else None
    if "background" not in mention:
        return join_words(_noun_phrase(attrs, mention, adjectives=True), place)
    np = _noun_phrase(attrs, mention, adjectives=True, need_det=True)
    return join_words(f"fondo {_BACKGROUNDS[attrs.background]} con {np}", place)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_background_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Spanish caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
