"""Simplified Chinese captions.

Numerals take the measure word that fits each product (一件T恤, 两顶帽子, 三把椅子, 四盏台灯, 一本书,
两辆小汽车); 2 before a measure word is 两, not 二.
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, normalise_mention

N_PHRASINGS = 3

# category -> (noun, measure word)
_NOUNS: dict[str, tuple[str, str]] = {
    "mug": ("马克杯", "个"),
    "t_shirt": ("T恤", "件"),
    "hat": ("帽子", "顶"),
    "bag": ("手提包", "个"),
    "lamp": ("台灯", "盏"),
    "chair": ("椅子", "把"),
    "bottle": ("瓶子", "个"),
    "clock": ("时钟", "个"),
    "umbrella": ("雨伞", "把"),
    "ball": ("球", "个"),
    "book": ("书", "本"),
    "car": ("小汽车", "辆"),
}
_COLOURS: dict[str, str] = {
    "red": "红色",
    "orange": "橙色",
    "yellow": "黄色",
    "green": "绿色",
    "blue": "蓝色",
    "purple": "紫色",
    "pink": "粉色",
    "brown": "棕色",
    "black": "黑色",
    "white": "白色",
}
_PATTERNS: dict[str, str] = {"plain": "无花纹", "striped": "条纹", "dotted": "波点", "checked": "格子"}
_PATTERN_WITH: dict[str, str] = {
    "plain": "无图案",
    "striped": "带条纹",
    "dotted": "带波点",
    "checked": "带格子图案",
}
_PATTERN_PRINTED: dict[str, str] = {"striped": "印有条纹的", "dotted": "印有波点的", "checked": "印有格子的"}
_BACKGROUNDS: dict[str, str] = {"white": "白色", "grey": "灰色", "beige": "米色", "light_blue": "浅蓝色"}
_PLACE: dict[str, str] = {"left": "左边", "centre": "中间", "right": "右边"}
_PLACE_SIDE: dict[str, str] = {"left": "左侧", "centre": "中央", "right": "右侧"}
_NUMERALS: dict[int, str] = {1: "一", 2: "两", 3: "三", 4: "四"}


def _quantity(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    return f"{_NUMERALS[attrs.count]}{_NOUNS[attrs.category][1]}" if "count" in mention else ""


def _p_attributive(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "灰色背景上左边的三个红色条纹马克杯"
    background = f"{_BACKGROUNDS[attrs.background]}背景上" if "background" in mention else ""
    place = _PLACE[attrs.placement] if "placement" in mention else ""
    location = f"{background}{place}的" if background or place else ""
    colour = _COLOURS[attrs.colour] if "colour" in mention else ""
    pattern = _PATTERNS[attrs.pattern] if "pattern" in mention else ""
    return f"{location}{_quantity(attrs, mention)}{colour}{pattern}{_NOUNS[attrs.category][0]}"


def _p_features(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "三个红色的马克杯，带条纹，摆在左侧，背景为灰色"
    colour = f"{_COLOURS[attrs.colour]}的" if "colour" in mention else ""
    parts = [f"{_quantity(attrs, mention)}{colour}{_NOUNS[attrs.category][0]}"]
    if "pattern" in mention:
        parts.append(_PATTERN_WITH[attrs.pattern])
    if "placement" in mention:
        parts.append(f"摆在{_PLACE_SIDE[attrs.placement]}")
    if "background" in mention:
        parts.append(f"背景为{_BACKGROUNDS[attrs.background]}")
    return "，".join(parts)


def _printed_noun(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    """'印有条纹的红色马克杯'; plain becomes 纯 + colour ('纯红色马克杯')."""
    colour = _COLOURS[attrs.colour] if "colour" in mention else ""
    noun = _NOUNS[attrs.category][0]
    if "pattern" not in mention:
        return f"{colour}{noun}"
    if attrs.pattern == "plain":
        return f"纯{colour or '色'}{noun}"
    return f"{_PATTERN_PRINTED[attrs.pattern]}{colour}{noun}"


def _p_existential(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "灰色背景，左边摆着三个印有条纹的红色马克杯"
    np = f"{_quantity(attrs, mention)}{_printed_noun(attrs, mention)}"
    background = f"{_BACKGROUNDS[attrs.background]}背景" if "background" in mention else ""
    place = _PLACE[attrs.placement] if "placement" in mention else ""
    if background and place:
        return f"{background}，{place}摆着{np}"
    if background:
        return f"{background}上摆着{np}"
    if place:
        return f"{place}摆着{np}"
    return np


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_attributive,
    _p_features,
    _p_existential,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Chinese caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
