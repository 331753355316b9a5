"""Korean captions.

Word order is SOV and modifiers precede the noun. Counts use native numerals (한, 두, 세, 네) before the
counter that fits each product, after the noun: 머그컵 세 개, 티셔츠 두 벌, 책 한 권, 자동차 네 대,
우산 두 자루. Particles take the allomorph the preceding syllable asks for: 이/가, 은/는 and 을/를 by
whether it ends in a final consonant (batchim): "머그컵이" but "모자가", "우산 두 자루를" but "책 세 권을";
locations take 에. Adjectival colours take their attributive form (빨간, 노란, 파란, 검은, 하얀), other
colours are nouns used as modifiers (주황색, 초록색); the pattern precedes the colour so that "빨간 줄무늬"
cannot be read as "red stripes", and the sentence phrasing states it as a relative clause (줄무늬가 있는).
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3

# category -> (noun, counter)
_NOUNS: dict[str, tuple[str, str]] = {
    "mug": ("머그컵", "개"),
    "t_shirt": ("티셔츠", "벌"),
    "hat": ("모자", "개"),
    "bag": ("가방", "개"),
    "lamp": ("램프", "개"),
    "chair": ("의자", "개"),
    "bottle": ("병", "개"),
    "clock": ("시계", "개"),
    "umbrella": ("우산", "자루"),
    "ball": ("공", "개"),
    "book": ("책", "권"),
    "car": ("자동차", "대"),
}
# Attributive forms (before a noun).
_COLOURS: dict[str, str] = {
    "red": "빨간",
    "orange": "주황색",
    "yellow": "노란",
    "green": "초록색",
    "blue": "파란",
    "purple": "보라색",
    "pink": "분홍색",
    "brown": "갈색",
    "black": "검은",
    "white": "하얀",
}
# Colour nouns ending in 색.
_COLOUR_NOUNS: dict[str, str] = {
    "red": "빨간색",
    "orange": "주황색",
    "yellow": "노란색",
    "green": "초록색",
    "blue": "파란색",
    "purple": "보라색",
    "pink": "분홍색",
    "brown": "갈색",
    "black": "검은색",
    "white": "흰색",
}
_PATTERNS: dict[str, str] = {
    "plain": "민무늬",
    "striped": "줄무늬",
    "dotted": "물방울무늬",
    "checked": "체크무늬",
}
# (pattern noun, whether it is there): "줄무늬가 있는", "무늬가 없는".
_PATTERN_CLAUSES: dict[str, tuple[str, bool]] = {
    "plain": ("무늬", False),
    "striped": ("줄무늬", True),
    "dotted": ("물방울무늬", True),
    "checked": ("체크무늬", True),
}
_BACKGROUNDS: dict[str, str] = {"white": "흰색", "grey": "회색", "beige": "베이지색", "light_blue": "하늘색"}
_PLACE: dict[str, str] = {"left": "왼쪽", "centre": "가운데", "right": "오른쪽"}
_NATIVE_NUMERALS: dict[int, str] = {1: "한", 2: "두", 3: "세", 4: "네"}

_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3


def has_batchim(word: str) -> bool:
    """Whether the last syllable of `word` ends in a final consonant (가 no, 각 yes)."""
    code = ord(word[-1])
    if not _HANGUL_FIRST <= code <= _HANGUL_LAST:
        raise ValueError(f"{word!r} does not end in a Hangul syllable")
    return (code - _HANGUL_FIRST) % 28 != 0


def particle(word: str, after_consonant: str, after_vowel: str) -> str:
    """`word` with the particle allomorph its last syllable asks for: particle('책', '을', '를') = '책을'."""
    return word + (after_consonant if has_batchim(word) else after_vowel)


def _quantity(attrs: ProductAttributes, mention: frozenset[str]) -> str | None:
    """'세 개', '두 벌' (native numeral, space, counter)."""
    if "count" not in mention:
        return None
    return f"{_NATIVE_NUMERALS[attrs.count]} {_NOUNS[attrs.category][1]}"


def _location(attrs: ProductAttributes, mention: frozenset[str]) -> str | None:
    """'회색 배경의 왼쪽' / '회색 배경' / '왼쪽' / None (without the particle 에)."""
    background = f"{_BACKGROUNDS[attrs.background]} 배경" if "background" in mention else None
    place = _PLACE[attrs.placement] if "placement" in mention else None
    if background and place:
        return f"{background}의 {place}"
    return background or place


def _p_listing(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "회색 배경의 왼쪽에 놓인 줄무늬 빨간 머그컵 세 개"
    location = _location(attrs, mention)
    placed = f"{location}에 놓인" if location else None
    pattern = _PATTERNS[attrs.pattern] if "pattern" in mention else None
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    return join_words(placed, pattern, colour, _NOUNS[attrs.category][0], _quantity(attrs, mention))


def _p_arranged(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "줄무늬 빨간색 머그컵 세 개를 왼쪽에 배치, 배경은 회색"
    pattern = _PATTERNS[attrs.pattern] if "pattern" in mention else None
    colour = _COLOUR_NOUNS[attrs.colour] if "colour" in mention else None
    np = join_words(pattern, colour, _NOUNS[attrs.category][0], _quantity(attrs, mention))
    if "placement" in mention:
        np = f"{particle(np, '을', '를')} {_PLACE[attrs.placement]}에 배치"
    background = (
        f"{particle('배경', '은', '는')} {_BACKGROUNDS[attrs.background]}"
        if "background" in mention
        else None
    )
    return join_words(np, background, sep=", ")


def _p_sentence(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "회색 배경의 왼쪽에 줄무늬가 있는 빨간 머그컵이 세 개 놓여 있다"
    location = _location(attrs, mention)
    pattern = None
    if "pattern" in mention:
        noun, present = _PATTERN_CLAUSES[attrs.pattern]
        pattern = f"{particle(noun, '이', '가')} {'있는' if present else '없는'}"
    colour = _COLOURS[attrs.colour] if "colour" in mention else None
    subject = particle(_NOUNS[attrs.category][0], "이", "가")
    return join_words(
        f"{location}에" if location else None,
        pattern,
        colour,
        subject,
        _quantity(attrs, mention),
        "놓여 있다",
    )


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_listing,
    _p_arranged,
    _p_sentence,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Korean caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
