"""Shop-style product titles for the synthetic catalogue, written the way a shop lists products ("Regenschirm
gestreift in Gelb, 3er-Set"), in a shop language of their own: not the training captions, so the demo shows
what hybrid search adds over image search (the title's words found lexically, its meaning by the text
tower). German only: a demo shop writes in one language; queries come in all ten.
"""

from __future__ import annotations

from synthetic.attributes import ProductAttributes

SHOP_LANGUAGES = ("de",)

# The ordinary nouns a shop lists them under (a shop's own coinages, "Stockschirm" for an umbrella, were tried
# first: words the demo model never read, which its text encoder could not place).
_PRODUCT_DE = {
    "mug": "Tasse", "t_shirt": "T-Shirt", "hat": "Hut", "bag": "Tasche", "lamp": "Lampe", "chair": "Stuhl",
    "bottle": "Flasche", "clock": "Uhr", "umbrella": "Regenschirm", "ball": "Ball", "book": "Buch",
    "car": "Auto",
}  # fmt: skip
_COLOUR_DE = {
    "red": "Rot", "orange": "Orange", "yellow": "Gelb", "green": "Grün", "blue": "Blau", "purple": "Violett",
    "pink": "Rosa", "brown": "Braun", "black": "Schwarz", "white": "Weiß",
}  # fmt: skip
_PATTERN_DE = {"plain": "einfarbig", "striped": "gestreift", "dotted": "gepunktet", "checked": "kariert"}
_COUNT_DE = {1: "", 2: ", 2er-Set", 3: ", 3er-Set", 4: ", 4er-Pack"}


def shop_title(attrs: ProductAttributes, lang: str = "de") -> str:
    """The product's title as a shop lists it."""
    if lang not in SHOP_LANGUAGES:
        raise ValueError(f"shop titles exist in {', '.join(SHOP_LANGUAGES)}, not {lang!r}")
    return (
        f"{_PRODUCT_DE[attrs.category]} {_PATTERN_DE[attrs.pattern]} in {_COLOUR_DE[attrs.colour]}"
        f"{_COUNT_DE[attrs.count]}"
    )
