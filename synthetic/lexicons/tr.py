"""Turkish captions.

Nouns stay singular after numerals ("üç kırmızı kupa"); a single indefinite item puts "bir" after the
adjectives ("kırmızı çizgili bir kupa"). Locative suffixes follow vowel harmony and voicing
(solda, sağda, zeminde, sol tarafta).
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3

# category -> (singular, plural); plural only for an unmentioned count above one ("saat" takes -ler).
_NOUNS: dict[str, tuple[str, str]] = {
    "mug": ("kupa", "kupalar"),
    "t_shirt": ("tişört", "tişörtler"),
    "hat": ("şapka", "şapkalar"),
    "bag": ("çanta", "çantalar"),
    "lamp": ("lamba", "lambalar"),
    "chair": ("sandalye", "sandalyeler"),
    "bottle": ("şişe", "şişeler"),
    "clock": ("saat", "saatler"),
    "umbrella": ("şemsiye", "şemsiyeler"),
    "ball": ("top", "toplar"),
    "book": ("kitap", "kitaplar"),
    "car": ("araba", "arabalar"),
}
_COLOURS: dict[str, str] = {
    "red": "kırmızı",
    "orange": "turuncu",
    "yellow": "sarı",
    "green": "yeşil",
    "blue": "mavi",
    "purple": "mor",
    "pink": "pembe",
    "brown": "kahverengi",
    "black": "siyah",
    "white": "beyaz",
}
_PATTERNS: dict[str, str] = {
    "plain": "düz",
    "striped": "çizgili",
    "dotted": "puantiyeli",
    "checked": "kareli",
}
_PATTERN_DESC: dict[str, str] = {
    "plain": "desensiz",
    "striped": "çizgili desenli",
    "dotted": "puantiyeli desenli",
    "checked": "kareli desenli",
}
_NUMERALS: dict[int, str] = {1: "bir", 2: "iki", 3: "üç", 4: "dört"}
_PLACE_WORDS: dict[str, str] = {"left": "sol", "centre": "orta", "right": "sağ"}
_SIDE_WORDS: dict[str, str] = {"left": "sol taraf", "centre": "orta", "right": "sağ taraf"}
_BACKGROUNDS: dict[str, str] = {"white": "beyaz", "grey": "gri", "beige": "bej", "light_blue": "açık mavi"}

_FRONT_VOWELS = "eiöü"
_BACK_VOWELS = "aıou"
_VOICELESS = "çfhkpsşt"


def locative(word: str) -> str:
    """Add the locative -da/-de/-ta/-te by the last vowel's frontness and the last sound's voicing."""
    last_vowel = next(ch for ch in reversed(word) if ch in _FRONT_VOWELS + _BACK_VOWELS)
    vowel = "e" if last_vowel in _FRONT_VOWELS else "a"
    consonant = "t" if word[-1] in _VOICELESS else "d"
    return f"{word}{consonant}{vowel}"


def _noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    singular, plural = _NOUNS[attrs.category]
    return plural if attrs.count > 1 and "count" not in mention else singular


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str], adjectives: list[str]) -> str:
    noun = _noun(attrs, mention)
    if "count" not in mention:
        return join_words(*adjectives, noun)
    if attrs.count == 1:
        # Indefinite "bir" sits between the adjectives and the noun.
        return join_words(*adjectives, "bir", noun)
    return join_words(_NUMERALS[attrs.count], *adjectives, noun)


def _adjectives(attrs: ProductAttributes, mention: frozenset[str], pattern_first: bool) -> list[str]:
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    pattern = _PATTERNS[attrs.pattern] if "pattern" in mention else None
    # "düz" (plain) reads naturally before the colour, like English "plain red".
    ordered = [pattern, colour] if pattern_first or attrs.pattern == "plain" else [colour, pattern]
    return [word for word in ordered if word]


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "üç kırmızı çizgili kupa solda, gri arka planda"
    np = _noun_phrase(attrs, mention, _adjectives(attrs, mention, pattern_first=False))
    place = locative(_PLACE_WORDS[attrs.placement]) if "placement" in mention else None
    background = locative(f"{_BACKGROUNDS[attrs.background]} arka plan") if "background" in mention else None
    return join_words(join_words(np, place), background, sep=", ")


def _p_relative(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "gri zeminde sol tarafta duran üç çizgili kırmızı kupa"
    np = _noun_phrase(attrs, mention, _adjectives(attrs, mention, pattern_first=True))
    background = locative(f"{_BACKGROUNDS[attrs.background]} zemin") if "background" in mention else None
    place = locative(_SIDE_WORDS[attrs.placement]) if "placement" in mention else None
    if not (background or place):
        return np
    return join_words(background, place, "duran", np)


def _p_catalogue(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "üç adet kırmızı renkli kupa, çizgili desenli, sol tarafta, arka plan gri"
    colour = f"{_COLOURS[attrs.colour]} renkli" if "colour" in mention else None
    quantity = f"{_NUMERALS[attrs.count]} adet" if "count" in mention else None
    np = join_words(quantity, colour, _noun(attrs, mention))
    pattern = _PATTERN_DESC[attrs.pattern] if "pattern" in mention else None
    place = locative(_SIDE_WORDS[attrs.placement]) if "placement" in mention else None
    background = f"arka plan {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(np, pattern, place, background, sep=", ")


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_relative,
    _p_catalogue,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Turkish caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
