"""Hindi captions (Devanagari).

The numeral comes first, then the adjectives, then the noun ("तीन लाल धारीदार मग"); the sentence phrasing
is SOV with postpositions after their noun ("स्लेटी पृष्ठभूमि पर", "बीच में") and a verb that agrees with
the product ("रखा है", "रखे हैं", "रखी है", "रखी हैं"). Adjectives in -ा agree in gender and number
(masculine singular -ा, masculine plural and oblique -े, feminine -ी: "काला छाता", "दो काले छाते",
"चार पीली टोपियाँ"); others are invariable ("लाल", "नारंगी", "गुलाबी", "सफ़ेद", "धारीदार"). In "नीले रंग
का/के/की" the colour stands in the oblique before "रंग" and the postposition agrees with the product, as
"वाला/वाले/वाली" does in "धारियों वाली". Nouns take their plurals: -ा → -े for masculine nouns, -ी → -ियाँ
and consonant → -ें for feminine ones; masculine consonant stems stay unchanged ("तीन मग").
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
    """The forms (m sg direct, m pl or oblique, f); one form means invariable."""

    forms: tuple[str, ...]

    def agree(self, gender: str, plural: bool) -> str:
        if len(self.forms) == 1:
            return self.forms[0]
        if gender == "f":
            return self.forms[2]
        return self.forms[1 if plural else 0]

    @property
    def oblique(self) -> str:
        """Masculine singular oblique, before a postposition or "रंग"/"डिज़ाइन": "नीले रंग"."""
        return self.agree("m", True)


def _adj(word: str) -> _Adj:
    """An adjective ending in the vowel sign -ा inflects (-ा/-े/-ी); any other is invariable."""
    if word.endswith("ा"):
        stem = word[:-1]
        return _Adj((word, stem + "े", stem + "ी"))
    return _Adj((word,))


_NOUNS: dict[str, _Noun] = {
    "mug": _Noun("m", "मग", "मग"),
    "t_shirt": _Noun("f", "टी-शर्ट", "टी-शर्टें"),
    "hat": _Noun("f", "टोपी", "टोपियाँ"),
    "bag": _Noun("m", "थैला", "थैले"),
    "lamp": _Noun("m", "लैंप", "लैंप"),
    "chair": _Noun("f", "कुर्सी", "कुर्सियाँ"),
    "bottle": _Noun("f", "बोतल", "बोतलें"),
    "clock": _Noun("f", "घड़ी", "घड़ियाँ"),
    "umbrella": _Noun("m", "छाता", "छाते"),
    "ball": _Noun("f", "गेंद", "गेंदें"),
    "book": _Noun("f", "किताब", "किताबें"),
    "car": _Noun("f", "कार", "कारें"),
}
_COLOURS: dict[str, _Adj] = {
    "red": _adj("लाल"),
    "orange": _adj("नारंगी"),
    "yellow": _adj("पीला"),
    "green": _adj("हरा"),
    "blue": _adj("नीला"),
    "purple": _adj("बैंगनी"),
    "pink": _adj("गुलाबी"),
    "brown": _adj("भूरा"),
    "black": _adj("काला"),
    "white": _adj("सफ़ेद"),
}
_PATTERNS: dict[str, _Adj] = {
    "plain": _adj("सादा"),
    "striped": _adj("धारीदार"),
    "dotted": _adj("बिंदीदार"),
    "checked": _adj("चेकदार"),
}
# "… वाला": the modifier before "वाला" stays as is, "वाला" agrees with the product.
_PATTERN_WALA: dict[str, str] = {
    "plain": "सादे डिज़ाइन",
    "striped": "धारियों",
    "dotted": "बिंदियों",
    "checked": "चारख़ानों",
}
_WALA = _adj("वाला")
_OF = _Adj(("का", "के", "की"))
_PLACED = (_adj("रखा"), _Adj(("हुआ", "हुए", "हुई")))
_NUMERALS: dict[int, str] = {1: "एक", 2: "दो", 3: "तीन", 4: "चार"}
_PLACE: dict[str, str] = {"left": "बाईं ओर", "centre": "बीच में", "right": "दाईं ओर"}
_PLACE_SIDE: dict[str, str] = {"left": "बाईं तरफ़", "centre": "बीच में", "right": "दाईं तरफ़"}
_PLACE_PART: dict[str, str] = {"left": "बाएँ हिस्से में", "centre": "केंद्र में", "right": "दाएँ हिस्से में"}
# Adjectives agreeing with the feminine "पृष्ठभूमि" (background).
_BACKGROUNDS: dict[str, tuple[_Adj, ...]] = {
    "white": (_adj("सफ़ेद"),),
    "grey": (_adj("स्लेटी"),),
    "beige": (_adj("बेज"),),
    "light_blue": (_adj("हल्का"), _adj("नीला")),
}


def _background(attrs: ProductAttributes) -> str:
    return join_words(*(adj.agree("f", False) for adj in _BACKGROUNDS[attrs.background]))


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    """Numeral, adjectives, noun: 'तीन लाल धारीदार मग'."""
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    return join_words(
        _NUMERALS[attrs.count] if "count" in mention else None,
        _COLOURS[attrs.colour].agree(noun.gender, plural) if "colour" in mention else None,
        _PATTERNS[attrs.pattern].agree(noun.gender, plural) if "pattern" in mention else None,
        noun.plural if plural else noun.singular,
    )


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "तीन लाल धारीदार मग बाईं ओर, स्लेटी पृष्ठभूमि पर"
    np = _noun_phrase(attrs, mention)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = f"{_background(attrs)} पृष्ठभूमि पर" if "background" in mention else None
    if place and background:
        return f"{np} {place}, {background}"
    return join_words(np, place, background)


def _p_colour_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "तीन धारियों वाले लाल रंग के मग, बाईं तरफ़ रखे हुए, पृष्ठभूमि स्लेटी"
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    pattern = None
    if "pattern" in mention:
        pattern = f"{_PATTERN_WALA[attrs.pattern]} {_WALA.agree(noun.gender, plural)}"
    colour = None
    if "colour" in mention:
        colour = f"{_COLOURS[attrs.colour].oblique} रंग {_OF.agree(noun.gender, plural)}"
    np = join_words(
        _NUMERALS[attrs.count] if "count" in mention else None,
        pattern,
        colour,
        noun.plural if plural else noun.singular,
    )
    place = None
    if "placement" in mention:
        participle = join_words(*(word.agree(noun.gender, plural) for word in _PLACED))
        place = f"{_PLACE_SIDE[attrs.placement]} {participle}"
    background = f"पृष्ठभूमि {_background(attrs)}" if "background" in mention else None
    return join_words(np, place, background, sep=", ")


def _p_sentence(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "स्लेटी पृष्ठभूमि पर बाएँ हिस्से में तीन लाल धारीदार मग रखे हैं"
    noun = _NOUNS[attrs.category]
    plural = attrs.count > 1
    background = f"{_background(attrs)} पृष्ठभूमि पर" if "background" in mention else None
    place = _PLACE_PART[attrs.placement] if "placement" in mention else None
    verb = f"{_adj('रखा').agree(noun.gender, plural)} {'हैं' if plural else 'है'}"
    return join_words(background, place, _noun_phrase(attrs, mention), verb)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_colour_noun,
    _p_sentence,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Hindi caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
