"""Japanese captions.

Counts use the counter that fits each product (マグカップ3個, Tシャツ2枚, 椅子4脚, 傘1本, 本3冊, 車2台),
written with Arabic digits in listing style and with kanji numerals in the sentence phrasing.
i-adjective colours attach directly (赤い), noun colours take の (緑の); the pattern precedes the colour
so that "赤いストライプ" cannot be read as "red stripes".
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, normalise_mention

N_PHRASINGS = 3

# category -> (noun, counter)
_NOUNS: dict[str, tuple[str, str]] = {
    "mug": ("マグカップ", "個"),
    "t_shirt": ("Tシャツ", "枚"),
    "hat": ("帽子", "個"),
    "bag": ("バッグ", "個"),
    "lamp": ("ランプ", "台"),
    "chair": ("椅子", "脚"),
    "bottle": ("ボトル", "本"),
    "clock": ("時計", "個"),
    "umbrella": ("傘", "本"),
    "ball": ("ボール", "個"),
    "book": ("本", "冊"),
    "car": ("車", "台"),
}
# Attributive forms (before a noun).
_COLOURS: dict[str, str] = {
    "red": "赤い",
    "orange": "オレンジ色の",
    "yellow": "黄色い",
    "green": "緑の",
    "blue": "青い",
    "purple": "紫の",
    "pink": "ピンクの",
    "brown": "茶色の",
    "black": "黒い",
    "white": "白い",
}
# Colour nouns ending in 色, for "赤色で…" ("red and …").
_COLOUR_NOUNS: dict[str, str] = {
    "red": "赤色",
    "orange": "オレンジ色",
    "yellow": "黄色",
    "green": "緑色",
    "blue": "青色",
    "purple": "紫色",
    "pink": "ピンク色",
    "brown": "茶色",
    "black": "黒色",
    "white": "白色",
}
_PATTERNS: dict[str, str] = {
    "plain": "無地",
    "striped": "ストライプ",
    "dotted": "水玉",
    "checked": "チェック",
}
_PATTERNS_GARA: dict[str, str] = {
    "plain": "無地",
    "striped": "ストライプ柄",
    "dotted": "水玉柄",
    "checked": "チェック柄",
}
_BACKGROUNDS: dict[str, str] = {
    "white": "白い",
    "grey": "灰色の",
    "beige": "ベージュの",
    "light_blue": "水色の",
}
_BACKGROUND_NOUNS: dict[str, str] = {"white": "白", "grey": "灰色", "beige": "ベージュ", "light_blue": "水色"}
_PLACE: dict[str, str] = {"left": "左側", "centre": "中央", "right": "右側"}
_KANJI_NUMERALS: dict[int, str] = {1: "一", 2: "二", 3: "三", 4: "四"}


def _modified_noun(attrs: ProductAttributes, mention: frozenset[str], patterns: dict[str, str]) -> str:
    pattern = f"{patterns[attrs.pattern]}の" if "pattern" in mention else ""
    colour = _COLOURS[attrs.colour] if "colour" in mention else ""
    return f"{pattern}{colour}{_NOUNS[attrs.category][0]}"


def _location(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    """'灰色の背景の左側' / '灰色の背景' / '左側' / '' (without a particle)."""
    background = f"{_BACKGROUNDS[attrs.background]}背景" if "background" in mention else ""
    place = _PLACE[attrs.placement] if "placement" in mention else ""
    if background and place:
        return f"{background}の{place}"
    return background or place


def _p_listing(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "灰色の背景の左側に置かれたストライプの赤いマグカップ3個"
    location = _location(attrs, mention)
    prefix = f"{location}に置かれた" if location else ""
    count = f"{attrs.count}{_NOUNS[attrs.category][1]}" if "count" in mention else ""
    return f"{prefix}{_modified_noun(attrs, mention, _PATTERNS)}{count}"


def _p_features(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "3個の赤色でストライプ柄のマグカップ、左側に配置、背景は灰色"
    colour = _COLOUR_NOUNS[attrs.colour] if "colour" in mention else ""
    pattern = _PATTERNS_GARA[attrs.pattern] if "pattern" in mention else ""
    if colour and pattern:
        modifier = f"{colour}で{pattern}の"
    else:
        modifier = f"{colour or pattern}の" if colour or pattern else ""
    noun, counter = _NOUNS[attrs.category]
    count = f"{attrs.count}{counter}の" if "count" in mention else ""
    parts = [f"{count}{modifier}{noun}"]
    if "placement" in mention:
        parts.append(f"{_PLACE[attrs.placement]}に配置")
    if "background" in mention:
        parts.append(f"背景は{_BACKGROUND_NOUNS[attrs.background]}")
    return "、".join(parts)


def _p_sentence(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "灰色の背景の左側に、ストライプ柄の赤いマグカップが三個ある"
    location = _location(attrs, mention)
    prefix = f"{location}に、" if location else ""
    count = f"{_KANJI_NUMERALS[attrs.count]}{_NOUNS[attrs.category][1]}" if "count" in mention else ""
    return f"{prefix}{_modified_noun(attrs, mention, _PATTERNS_GARA)}が{count}ある"


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_listing,
    _p_features,
    _p_sentence,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Japanese caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
