"""Language-neutral attribute vocabulary of the synthetic product catalogue.

Every attribute value is a key that each lexicon translates; keys never appear in captions themselves.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import cache

CATEGORIES: tuple[str, ...] = (
    "mug",
    "t_shirt",
    "hat",
    "bag",
    "lamp",
    "chair",
    "bottle",
    "clock",
    "umbrella",
    "ball",
    "book",
    "car",
)
COLOURS: tuple[str, ...] = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
)
PATTERNS: tuple[str, ...] = ("plain", "striped", "dotted", "checked")
COUNTS: tuple[int, ...] = (1, 2, 3, 4)
PLACEMENTS: tuple[str, ...] = ("left", "centre", "right")
BACKGROUNDS: tuple[str, ...] = ("white", "grey", "beige", "light_blue")

# Field order of ProductAttributes, of the combination enumeration and of the jsonl "attributes" object.
ATTRIBUTE_NAMES: tuple[str, ...] = ("category", "colour", "pattern", "count", "placement", "background")
VOCABULARY: Mapping[str, tuple[str, ...] | tuple[int, ...]] = {
    "category": CATEGORIES,
    "colour": COLOURS,
    "pattern": PATTERNS,
    "count": COUNTS,
    "placement": PLACEMENTS,
    "background": BACKGROUNDS,
}
FULL_MENTION: frozenset[str] = frozenset(ATTRIBUTE_NAMES)
N_COMBINATIONS: int = (
    len(CATEGORIES) * len(COLOURS) * len(PATTERNS) * len(COUNTS) * len(PLACEMENTS) * len(BACKGROUNDS)
)


@dataclass(frozen=True)
class ProductAttributes:
    """What one catalogue image shows: `count` identical products of one kind, colour and pattern."""

    category: str
    colour: str
    pattern: str
    count: int
    placement: str
    background: str

    def __post_init__(self) -> None:
        for name in ATTRIBUTE_NAMES:
            value = getattr(self, name)
            allowed = VOCABULARY[name]
            # bool is an int subclass; True must not pass as count 1.
            if isinstance(value, bool) or value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; expected one of {list(allowed)}")

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ProductAttributes:
        missing = [name for name in ATTRIBUTE_NAMES if name not in data]
        if missing:
            raise ValueError(f"attributes lack {missing}")
        return cls(**{name: data[name] for name in ATTRIBUTE_NAMES})  # type: ignore[arg-type]


@cache
def all_combinations() -> tuple[ProductAttributes, ...]:
    """All 23,040 attribute combinations in a fixed canonical order (the generator shuffles this)."""
    values = (VOCABULARY[name] for name in ATTRIBUTE_NAMES)
    return tuple(ProductAttributes(*combo) for combo in itertools.product(*values))


def normalise_mention(mention: Iterable[str]) -> frozenset[str]:
    """Validate the attribute names a caption must mention; the category is always mentioned."""
    names = frozenset(mention)
    unknown = names - FULL_MENTION
    if unknown:
        raise ValueError(f"unknown attribute names in mention: {sorted(unknown)}")
    if "category" not in names:
        raise ValueError("mention must include 'category': every caption names the product")
    return names


def check_phrasing(phrasing: int, n_phrasings: int) -> None:
    if not 0 <= phrasing < n_phrasings:
        raise ValueError(f"phrasing {phrasing} out of range 0..{n_phrasings - 1}")


def join_words(*parts: str | None, sep: str = " ") -> str:
    """Join the non-empty parts; lexicons build captions from optional pieces."""
    return sep.join(part for part in parts if part)
