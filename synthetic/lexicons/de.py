"""German captions.

Adjectives are declined by case, gender and article type: strong after numerals and without article
("drei rote Tassen", "roter Hut", "auf grauem Hintergrund"), mixed after the indefinite article
("ein roter Hut", "mit einem roten Hut"). "rosa" stays invariable in the standard language; orange uses
the declinable "orangefarben", purple the declinable "violett".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3


@dataclass(frozen=True)
class _Noun:
    gender: str  # "m", "f" or "n"
    singular: str
    plural: str
    dative_plural: str


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("f", "Tasse", "Tassen", "Tassen"),
    "t_shirt": _Noun("n", "T-Shirt", "T-Shirts", "T-Shirts"),
    "hat": _Noun("m", "Hut", "Hüte", "Hüten"),
    "bag": _Noun("f", "Tasche", "Taschen", "Taschen"),
    "lamp": _Noun("f", "Lampe", "Lampen", "Lampen"),
    "chair": _Noun("m", "Stuhl", "Stühle", "Stühlen"),
    "bottle": _Noun("f", "Flasche", "Flaschen", "Flaschen"),
    "clock": _Noun("f", "Uhr", "Uhren", "Uhren"),
    "umbrella": _Noun("m", "Regenschirm", "Regenschirme", "Regenschirmen"),
    "ball": _Noun("m", "Ball", "Bälle", "Bällen"),
    "book": _Noun("n", "Buch", "Bücher", "Büchern"),
    "car": _Noun("n", "Auto", "Autos", "Autos"),
}
# Adjective stems; those in _INVARIABLE take no ending.
_COLOUR_STEMS: dict[str, str] = {
    "red": "rot",
    "orange": "orangefarben",
    "yellow": "gelb",
    "green": "grün",
    "blue": "blau",
    "purple": "violett",
    "pink": "rosa",
    "brown": "braun",
    "black": "schwarz",
    "white": "weiß",
}
_INVARIABLE: frozenset[str] = frozenset({"rosa"})
_COLOUR_NOUNS: dict[str, str] = {
    "red": "Rot",
    "orange": "Orange",
    "yellow": "Gelb",
    "green": "Grün",
    "blue": "Blau",
    "purple": "Violett",
    "pink": "Rosa",
    "brown": "Braun",
    "black": "Schwarz",
    "white": "Weiß",
}
_PATTERN_STEMS: dict[str, str] = {
    "plain": "einfarbig",
    "striped": "gestreift",
    "dotted": "gepunktet",
    "checked": "kariert",
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "ohne Muster",
    "striped": "mit Streifen",
    "dotted": "mit Punkten",
    "checked": "mit Karomuster",
}
_BACKGROUND_STEMS: dict[str, str] = {
    "white": "weiß",
    "grey": "grau",
    "beige": "beigefarben",
    "light_blue": "hellblau",
}
_NUMERALS: dict[int, str] = {2: "zwei", 3: "drei", 4: "vier"}
_PLACE: dict[str, str] = {"left": "links", "centre": "in der Mitte", "right": "rechts"}
_PLACE_PARTICIPLE: dict[str, str] = {
    "left": "links platziert",
    "centre": "mittig platziert",
    "right": "rechts platziert",
}
_PLACE_SIDE: dict[str, str] = {
    "left": "auf der linken Seite",
    "centre": "in der Mitte",
    "right": "auf der rechten Seite",
}

# (case, gender-or-"pl") -> ending
_STRONG: dict[tuple[str, str], str] = {
    ("nom", "m"): "er",
    ("nom", "f"): "e",
    ("nom", "n"): "es",
    ("nom", "pl"): "e",
    ("dat", "m"): "em",
    ("dat", "f"): "er",
    ("dat", "n"): "em",
    ("dat", "pl"): "en",
}
_MIXED: dict[tuple[str, str], str] = {
    ("nom", "m"): "er",
    ("nom", "f"): "e",
    ("nom", "n"): "es",
    ("dat", "m"): "en",
    ("dat", "f"): "en",
    ("dat", "n"): "en",
}
_INDEFINITE: dict[tuple[str, str], str] = {
    ("nom", "m"): "ein",
    ("nom", "f"): "eine",
    ("nom", "n"): "ein",
    ("dat", "m"): "einem",
    ("dat", "f"): "einer",
    ("dat", "n"): "einem",
}


def _decline(stem: str, case: str, slot: str, mixed: bool) -> str:
    if stem in _INVARIABLE:
        return stem
    return stem + (_MIXED if mixed else _STRONG)[(case, slot)]


def _noun_phrase(
    attrs: ProductAttributes,
    mention: frozenset[str],
    case: str,
    adjective_stems: list[str],
    need_det: bool = False,
) -> str:
    """Determiner + declined adjectives + noun; an unmentioned single item gets 'ein' only if needed."""
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    slot = "pl" if plural else noun.gender
    word = (noun.dative_plural if case == "dat" else noun.plural) if plural else noun.singular
    with_article = not plural and ("count" in mention or need_det)
    adjectives = [_decline(stem, case, slot, mixed=with_article) for stem in adjective_stems]
    if with_article:
        determiner: str | None = _INDEFINITE[(case, slot)]
    elif plural and "count" in mention:
        determiner = _NUMERALS[attrs.count]
    else:
        determiner = None
    return join_words(determiner, *adjectives, word)


def _stems(attrs: ProductAttributes, mention: frozenset[str]) -> list[str]:
    stems = []
    if "colour" in mention:
        stems.append(_COLOUR_STEMS[attrs.colour])
    if "pattern" in mention:
        stems.append(_PATTERN_STEMS[attrs.pattern])
    return stems


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "drei rote gestreifte Tassen links auf grauem Hintergrund"
    np = _noun_phrase(attrs, mention, "nom", _stems(attrs, mention))
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = None
    if "background" in mention:
        adjective = _decline(_BACKGROUND_STEMS[attrs.background], "dat", "m", mixed=False)
        background = f"auf {adjective} Hintergrund"
    return join_words(np, place, background)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "drei Tassen in Rot mit Streifen, links platziert, vor einem grauen Hintergrund"
    np = _noun_phrase(attrs, mention, "nom", [])
    colour = f"in {_COLOUR_NOUNS[attrs.colour]}" if "colour" in mention else None
    pattern = _PATTERN_WITH[attrs.pattern] if "pattern" in mention else None
    place = _PLACE_PARTICIPLE[attrs.placement] if "placement" in mention else None
    background = None
    if "background" in mention:
        adjective = _decline(_BACKGROUND_STEMS[attrs.background], "dat", "m", mixed=True)
        background = f"vor einem {adjective} Hintergrund"
    return join_words(join_words(np, colour, pattern), place, background, sep=", ")


def _p_background_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "grauer Hintergrund mit drei roten gestreiften Tassen auf der linken Seite"
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    if "background" not in mention:
        return join_words(_noun_phrase(attrs, mention, "nom", _stems(attrs, mention)), place)
    background = _decline(_BACKGROUND_STEMS[attrs.background], "nom", "m", mixed=False)
    np = _noun_phrase(attrs, mention, "dat", _stems(attrs, mention), need_det=True)
    return join_words(f"{background} Hintergrund mit {np}", place)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_background_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One German caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
