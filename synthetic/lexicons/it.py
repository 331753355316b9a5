"""Italian captions.

Adjectives follow the noun and agree in gender and number ("tre tazze rosse", "due auto bianche");
"bianco" keeps its hard c in the plural ("bianchi/bianche"), "verde", "arancione" and "marrone" vary
only in number ("palloni arancioni"), "rosa", "viola" and "blu" are invariable ("cappelli viola"), and
"auto" is an invariable feminine noun. The indefinite article follows the next word: "un" (masculine),
"uno" before s + consonant, z, gn, ps, x ("su uno sfondo grigio"), "una" (feminine), elided "un'" before
a feminine vowel ("un'auto"). Patterns are invariable phrases ("a righe", "a pois", "a quadri", "a tinta
unita"); after "di colore" the adjective agrees with the masculine "colore" ("di colore rosso").
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


def _o_a(stem: str, plural_stem: str | None = None) -> _Adj:
    """Four-form adjective in -o/-a/-i/-e; `plural_stem` for "bianc-hi/-he"."""
    plural_stem = plural_stem or stem
    return _Adj((stem + "o", stem + "a", plural_stem + "i", plural_stem + "e"))


def _e_i(stem: str) -> _Adj:
    """Two-form adjective in -e/-i, one form per number ("verde/verdi")."""
    return _Adj((stem + "e", stem + "e", stem + "i", stem + "i"))


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("f", "tazza", "tazze"),
    "t_shirt": _Noun("f", "maglietta", "magliette"),
    "hat": _Noun("m", "cappello", "cappelli"),
    "bag": _Noun("f", "borsa", "borse"),
    "lamp": _Noun("f", "lampada", "lampade"),
    "chair": _Noun("f", "sedia", "sedie"),
    "bottle": _Noun("f", "bottiglia", "bottiglie"),
    "clock": _Noun("m", "orologio", "orologi"),
    "umbrella": _Noun("m", "ombrello", "ombrelli"),
    "ball": _Noun("m", "pallone", "palloni"),
    "book": _Noun("m", "libro", "libri"),
    "car": _Noun("f", "auto", "auto"),
}
_COLOURS: dict[str, _Adj] = {
    "red": _o_a("ross"),
    "orange": _e_i("arancion"),
    "yellow": _o_a("giall"),
    "green": _e_i("verd"),
    "blue": _inv("blu"),
    "purple": _inv("viola"),
    "pink": _inv("rosa"),
    "brown": _e_i("marron"),
    "black": _o_a("ner"),
    "white": _o_a("bianc", "bianch"),
}
_PATTERNS: dict[str, str] = {
    "plain": "a tinta unita",
    "striped": "a righe",
    "dotted": "a pois",
    "checked": "a quadri",
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "senza fantasia",
    "striped": "con fantasia a righe",
    "dotted": "con fantasia a pois",
    "checked": "con fantasia a quadri",
}
_PLACED = _o_a("posizionat")
_NUMERALS: dict[int, str] = {2: "due", 3: "tre", 4: "quattro"}
_PLACE: dict[str, str] = {"left": "a sinistra", "centre": "al centro", "right": "a destra"}
_PLACE_SIDE: dict[str, str] = {"left": "sulla sinistra", "centre": "nel mezzo", "right": "sulla destra"}
# Masculine singular, agreeing with "sfondo".
_BACKGROUNDS: dict[str, str] = {
    "white": "bianco",
    "grey": "grigio",
    "beige": "beige",
    "light_blue": "azzurro",
}

_VOWELS = "aeiouàèéìòù"


def indefinite(gender: str, word: str) -> str:
    """Indefinite article joined to `word`: un/uno/una/un' by gender and the word's first sounds."""
    lower = word.lower()
    if gender == "f":
        return f"un'{word}" if lower[0] in _VOWELS else f"una {word}"
    s_impura = lower[0] == "s" and len(lower) > 1 and lower[1] not in _VOWELS
    if s_impura or lower.startswith(("z", "gn", "ps", "pn", "x", "y")):
        return f"uno {word}"
    return f"un {word}"


def _noun_phrase(
    attrs: ProductAttributes, mention: frozenset[str], *, adjectives: bool, need_det: bool = False
) -> str:
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    head = noun.plural if plural else noun.singular
    if plural and "count" in mention:
        head = f"{_NUMERALS[attrs.count]} {head}"
    elif not plural and ("count" in mention or need_det):
        head = indefinite(noun.gender, head)
    words = [head]
    if adjectives:
        if "colour" in mention:
            words.append(_COLOURS[attrs.colour].agree(noun.gender, plural))
        if "pattern" in mention:
            words.append(_PATTERNS[attrs.pattern])
    else:
        if "colour" in mention:
            # "colore" is masculine singular whatever the noun.
            words.append(f"di colore {_COLOURS[attrs.colour].agree('m', False)}")
        if "pattern" in mention:
            words.append(_PATTERN_WITH[attrs.pattern])
    return join_words(*words)


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tre tazze rosse a righe a sinistra, su sfondo grigio"
    np = _noun_phrase(attrs, mention, adjectives=True)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"su sfondo {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    if place and background:
        return f"{np} {place}, {background}"
    return join_words(np, place, background)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tre tazze di colore rosso con fantasia a righe, posizionate a sinistra, su uno sfondo grigio"
    np = _noun_phrase(attrs, mention, adjectives=False)
    place = None
    if "placement" in mention:
        participle = _PLACED.agree(_NOUNS[attrs.category].gender, attrs.count > 1)
        place = f"{participle} {_PLACE[attrs.placement]}"
    background = None
    if "background" in mention:
        background = f"su {indefinite('m', 'sfondo')} {_BACKGROUNDS[attrs.background]}"
    return join_words(np, place, background, sep=", ")


def _p_background_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "sfondo grigio con tre tazze rosse a righe sulla sinistra"
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    if "background" not in mention:
        return join_words(_noun_phrase(attrs, mention, adjectives=True), place)
    # A bare plural is fine after "con"; a bare singular count noun is not.
    np = _noun_phrase(attrs, mention, adjectives=True, need_det=True)
    return join_words(f"sfondo {_BACKGROUNDS[attrs.background]} con {np}", place)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_background_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Italian caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
