"""English captions.

Adjective order follows English usage: colour before a pattern adjective ("red striped mugs"), except
"plain", which reads naturally first ("plain red mugs"). Articles a/an depend on the next word's sound.
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3

# category -> (singular, plural)
_NOUNS: dict[str, tuple[str, str]] = {
    "mug": ("mug", "mugs"),
    "t_shirt": ("T-shirt", "T-shirts"),
    "hat": ("hat", "hats"),
    "bag": ("bag", "bags"),
    "lamp": ("lamp", "lamps"),
    "chair": ("chair", "chairs"),
    "bottle": ("bottle", "bottles"),
    "clock": ("clock", "clocks"),
    "umbrella": ("umbrella", "umbrellas"),
    "ball": ("ball", "balls"),
    "book": ("book", "books"),
    "car": ("car", "cars"),
}
_COLOURS: dict[str, str] = {
    "red": "red",
    "orange": "orange",
    "yellow": "yellow",
    "green": "green",
    "blue": "blue",
    "purple": "purple",
    "pink": "pink",
    "brown": "brown",
    "black": "black",
    "white": "white",
}
_PATTERN_ADJ: dict[str, str] = {
    "plain": "plain",
    "striped": "striped",
    "dotted": "polka-dot",
    "checked": "checked",
}
_PATTERN_WITH: dict[str, str] = {
    "plain": "with no pattern",
    "striped": "with stripes",
    "dotted": "with polka dots",
    "checked": "with a checked pattern",
}
_NUMERALS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
_SETS: dict[int, str] = {1: "a single", 2: "a pair of", 3: "a set of three", 4: "a set of four"}
_PLACE: dict[str, str] = {"left": "on the left", "centre": "in the centre", "right": "on the right"}
_PLACE_SIDE: dict[str, str] = {
    "left": "on the left side",
    "centre": "in the middle",
    "right": "on the right side",
}
_BACKGROUNDS: dict[str, str] = {
    "white": "white",
    "grey": "grey",
    "beige": "beige",
    "light_blue": "light blue",
}


def _article(next_word: str) -> str:
    # Only the spelling matters for this vocabulary ("an orange", "an umbrella", "a T-shirt").
    return "an" if next_word[0] in "aeiou" else "a"


def _with_article(phrase: str) -> str:
    return f"{_article(phrase)} {phrase}"


def _adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> list[str]:
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    pattern = _PATTERN_ADJ[attrs.pattern] if "pattern" in mention else None
    ordered = [pattern, colour] if attrs.pattern == "plain" else [colour, pattern]
    return [word for word in ordered if word]


def _noun(attrs: ProductAttributes) -> str:
    singular, plural = _NOUNS[attrs.category]
    return singular if attrs.count == 1 else plural


def _quantify(head: str, attrs: ProductAttributes, mention: frozenset[str], need_det: bool) -> str:
    """Prefix the numeral; an unmentioned single item gets 'a' only where syntax needs a determiner."""
    if "count" in mention:
        return _with_article(head) if attrs.count == 1 else f"{_NUMERALS[attrs.count]} {head}"
    return _with_article(head) if need_det and attrs.count == 1 else head


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "three red striped mugs on the left, on a grey background"
    head = join_words(*_adjectives(attrs, mention), _noun(attrs))
    np = _quantify(head, attrs, mention, need_det=False)
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = None
    if "background" in mention:
        background = f"on {_with_article(_BACKGROUNDS[attrs.background])} background"
    if place and background:
        return f"{np} {place}, {background}"
    return join_words(np, place, background)


def _p_set(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "a set of three striped red mugs placed on the left against a grey backdrop"
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    pattern = _PATTERN_ADJ[attrs.pattern] if "pattern" in mention else None
    head = join_words(pattern, colour, _noun(attrs))
    np = f"{_SETS[attrs.count]} {head}" if "count" in mention else head
    place = f"placed {_PLACE[attrs.placement]}" if "placement" in mention else None
    background = None
    if "background" in mention:
        background = f"against {_with_article(_BACKGROUNDS[attrs.background])} backdrop"
    return join_words(np, place, background)


def _p_background_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "grey background with three red mugs with stripes on the left side"
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    head = join_words(colour, _noun(attrs))
    pattern = _PATTERN_WITH[attrs.pattern] if "pattern" in mention else None
    place = _PLACE_SIDE[attrs.placement] if "placement" in mention else None
    if "background" in mention:
        np = _quantify(head, attrs, mention, need_det=True)
        return join_words(f"{_BACKGROUNDS[attrs.background]} background with {np}", pattern, place)
    return join_words(_quantify(head, attrs, mention, need_det=False), pattern, place)


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_set,
    _p_background_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One English caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
