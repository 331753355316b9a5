"""French captions.

Adjectives follow the noun and agree in gender and number ("trois tasses rouges rayées"); "orange" and
"marron" are invariable, "rose" agrees; "à pois"/"à carreaux" are invariable phrases. After "de couleur"
the adjective agrees with the feminine "couleur" ("de couleur verte").
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


def _reg(m: str, f: str | None = None) -> _Adj:
    """Regular adjective: plural adds -s unless the form already ends in s or x."""
    f = f or m
    return _Adj((m, f, m if m[-1] in "sx" else m + "s", f + "s"))


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("f", "tasse", "tasses"),
    "t_shirt": _Noun("m", "t-shirt", "t-shirts"),
    "hat": _Noun("m", "chapeau", "chapeaux"),
    "bag": _Noun("m", "sac", "sacs"),
    "lamp": _Noun("f", "lampe", "lampes"),
    "chair": _Noun("f", "chaise", "chaises"),
    "bottle": _Noun("f", "bouteille", "bouteilles"),
    "clock": _Noun("f", "horloge", "horloges"),
    "umbrella": _Noun("m", "parapluie", "parapluies"),
    "ball": _Noun("m", "ballon", "ballons"),
    "book": _Noun("m", "livre", "livres"),
    "car": _Noun("f", "voiture", "voitures"),
}
_COLOURS: dict[str, _Adj] = {
    "red": _reg("rouge"),
    "orange": _inv("orange"),
    "yellow": _reg("jaune"),
    "green": _reg("vert", "verte"),
    "blue": _reg("bleu", "bleue"),
    "purple": _reg("violet", "violette"),
    "pink": _reg("rose"),
    "brown": _inv("marron"),
    "black": _reg("noir", "noire"),
    "white": _reg("blanc", "blanche"),
}
_PATTERNS: dict[str, _Adj] = {
    "plain": _reg("uni", "unie"),
    "striped": _reg("rayé", "rayée"),
    "dotted": _inv("à pois"),
    "checked": _inv("à carreaux"),
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "sans motif",
    "striped": "avec des rayures",
    "dotted": "avec des pois",
    "checked": "avec un motif à carreaux",
}
_PLACED = _reg("placé", "placée")
_NUMERALS: dict[int, str] = {2: "deux", 3: "trois", 4: "quatre"}
_INDEFINITE: dict[str, str] = {"m": "un", "f": "une"}
_PLACE: dict[str, str] = {"left": "à gauche", "centre": "au centre", "right": "à droite"}
_PLACE_SIDE: dict[str, str] = {"left": "sur la gauche", "centre": "au milieu", "right": "sur la droite"}
_BACKGROUNDS: dict[str, str] = {
    "white": "blanc",
    "grey": "gris",
    "beige": "beige",
    "light_blue": "bleu clair",
}


def _determiner(attrs: ProductAttributes, mention: frozenset[str], need_det: bool) -> str | None:
    gender = _NOUNS[attrs.category].gender
    if "count" in mention:
        return _INDEFINITE[gender] if attrs.count == 1 else _NUMERALS[attrs.count]
    if not need_det:
        return None
    return _INDEFINITE[gender] if attrs.count == 1 else "des"


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
            # "couleur" is feminine singular whatever the noun.
            words.append(f"de couleur {_COLOURS[attrs.colour].agree('f', False)}")
        if "pattern" in mention:
            words.append(_PATTERN_WITH[attrs.pattern])
    return join_words(*words)


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "trois tasses rouges rayées à gauche, sur fond gris"
    np = _noun_phrase(attrs, mention, adjectives=True)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"sur fond {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    if place and background:
        return f"{np} {place}, {background}"
    return join_words(np, place, background)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "trois tasses de couleur rouge avec des rayures, placées à gauche, sur un fond gris"
    np = _noun_phrase(attrs, mention, adjectives=False)
    place = None
    if "placement" in mention:
        participle = _PLACED.agree(_NOUNS[attrs.category].gender, attrs.count > 1)
        place = f"{participle} {_PLACE[attrs.placement]}"
    background = f"sur un fond {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(np, place, background, sep=", ")


def _p_background_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "fond gris avec trois tasses rouges rayées sur la gauche"
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    if "background" not in mention:
        return join_words(_noun_phrase(attrs, mention, adjectives=True), place)
    np = _noun_phrase(attrs, mention, adjectives=True, need_det=True)
    return join_words(f"fond {_BACKGROUNDS[attrs.background]} avec {np}", place)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_background_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One French caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
