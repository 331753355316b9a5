"""Indonesian captions.

Modifiers follow the noun ("tiga cangkir merah bergaris"); nouns are not reduplicated after numerals.
One item is "sebuah" with the classifier "buah" ("tiga buah cangkir" in the catalogue phrasing).
"""

from __future__ import annotations

from collections.abc import Callable

from synthetic.attributes import ProductAttributes, check_phrasing, join_words, normalise_mention

N_PHRASINGS = 3

_NOUNS: dict[str, str] = {
    "mug": "cangkir",
    "t_shirt": "kaus",
    "hat": "topi",
    "bag": "tas",
    "lamp": "lampu",
    "chair": "kursi",
    "bottle": "botol",
    "clock": "jam",
    "umbrella": "payung",
    "ball": "bola",
    "book": "buku",
    "car": "mobil",
}
_COLOURS: dict[str, str] = {
    "red": "merah",
    "orange": "oranye",
    "yellow": "kuning",
    "green": "hijau",
    "blue": "biru",
    "purple": "ungu",
    "pink": "merah muda",
    "brown": "cokelat",
    "black": "hitam",
    "white": "putih",
}
_PATTERNS: dict[str, str] = {
    "plain": "polos",
    "striped": "bergaris",
    "dotted": "polkadot",
    "checked": "kotak-kotak",
}
_PATTERN_MOTIF: dict[str, str] = {
    "plain": "tanpa motif",
    "striped": "dengan motif garis-garis",
    "dotted": "dengan motif polkadot",
    "checked": "dengan motif kotak-kotak",
}
_NUMERALS: dict[int, str] = {1: "satu", 2: "dua", 3: "tiga", 4: "empat"}
_CLASSIFIED: dict[int, str] = {1: "sebuah", 2: "dua buah", 3: "tiga buah", 4: "empat buah"}
_PLACE: dict[str, str] = {"left": "di kiri", "centre": "di tengah", "right": "di kanan"}
_PLACE_SIDE: dict[str, str] = {"left": "di sebelah kiri", "centre": "di tengah", "right": "di sebelah kanan"}
_PLACE_PART: dict[str, str] = {
    "left": "di bagian kiri",
    "centre": "di bagian tengah",
    "right": "di bagian kanan",
}
_BACKGROUNDS: dict[str, str] = {
    "white": "putih",
    "grey": "abu-abu",
    "beige": "krem",
    "light_blue": "biru muda",
}


def _noun_phrase(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    return join_words(
        _NUMERALS[attrs.count] if "count" in mention else None,
        _NOUNS[attrs.category],
        _COLOURS[attrs.colour] if "colour" in mention else None,
        _PATTERNS[attrs.pattern] if "pattern" in mention else None,
    )


def _p_adjectives(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tiga cangkir merah bergaris di kiri dengan latar belakang abu-abu"
    place = _PLACE[attrs.placement] if "placement" in mention else None
    background = None
    if "background" in mention:
        background = f"dengan latar belakang {_BACKGROUNDS[attrs.background]}"
    return join_words(_noun_phrase(attrs, mention), place, background)


def _p_catalogue(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "tiga buah cangkir berwarna merah dengan motif garis-garis, diletakkan di sebelah kiri,
    #  berlatar abu-abu"
    np = join_words(
        _CLASSIFIED[attrs.count] if "count" in mention else None,
        _NOUNS[attrs.category],
        f"berwarna {_COLOURS[attrs.colour]}" if "colour" in mention else None,
        _PATTERN_MOTIF[attrs.pattern] if "pattern" in mention else None,
    )
    place = f"diletakkan {_PLACE_SIDE[attrs.placement]}" if "placement" in mention else None
    background = f"berlatar {_BACKGROUNDS[attrs.background]}" if "background" in mention else None
    return join_words(np, place, background, sep=", ")


def _p_location_first(attrs: ProductAttributes, mention: frozenset[str]) -> str:
    # "di bagian kiri latar abu-abu terdapat tiga cangkir merah bergaris"
    np = _noun_phrase(attrs, mention)
    background = _BACKGROUNDS[attrs.background] if "background" in mention else None
    if "placement" in mention:
        place = _PLACE_PART[attrs.placement]
        location = f"{place} latar {background}" if background else place
    elif background:
        location = f"di atas latar {background}"
    else:
        return np
    return f"{location} terdapat {np}"


_PHRASINGS: tuple[Callable[[ProductAttributes, frozenset[str]], str], ...] = (
    _p_adjectives,
    _p_catalogue,
    _p_location_first,
)


def describe(attrs: ProductAttributes, phrasing: int, mention: frozenset[str]) -> str:
    """One Indonesian caption of `attrs` in phrasing `phrasing`, naming only the attributes in `mention`."""
    check_phrasing(phrasing, N_PHRASINGS)
    return _PHRASINGS[phrasing](attrs, normalise_mention(mention))
