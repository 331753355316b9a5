"""Build-time languages of untagged text values (``indexer.products.identify_languages``): each field's
language from its values together, then each value with it as the prior. A value written in another field's
language takes it (the Swedish retailer titles among English ones that issue 45 found read as English); a
short or unsure value keeps its field's; a language no field is in needs a long, certain value. Values
written here, in the manner of a grocery's (English titles, a Swedish description field)."""

from __future__ import annotations

from collections import Counter

from indexer.products import TextValue, identify_languages
from model.starter.config import USE_M3_LANGUAGES

RETAILER_TITLES = {
    "Pear Conference Class 1": "en",
    "Skimmed milk lactose free 1,5%": "en",
    "Cucumber Class 1": "en",
    "Carrot Class 1": "en",
    "Leek Class 1": "en",
    "Galia melon Class 1": "en",
    "Lemon Class 1": "en",
    "Onion Yellow Class 1": "en",
    "Apple Granny Smith Class 1": "en",
    "Forest mushroom Class 1": "en",
    "Mellanmjölk Ekologisk 1,5%": "sv",
    "Apelsinjuice": "sv",
    "Standardmjölk Ekologisk 3%": "sv",
    "Blodgrape Juice med Fruktkött": "sv",
    "Filmjölk 3%": "sv",
    "Apfelsaft naturtrüb": "en",  # German, which no field is in, in 2 words: the field's language stays
    "Naturtrüber Apfelsaft aus frischen deutschen Äpfeln gepresst": "de",  # long and certain: its own
}
DESCRIPTIONS_SV = [
    "Mjölk från svenska gårdar med en fetthalt på tre procent.",
    "Färskpressad juice av mogna apelsiner, utan tillsatt socker.",
    "Krispiga gurkor odlade i växthus i Sverige.",
    "Söta päron med saftig frukt, perfekta som mellanmål.",
]


def test_each_value_gets_its_own_language_with_its_fields_as_prior() -> None:
    values = [TextValue(i, "retailer_title", None, text) for i, text in enumerate(RETAILER_TITLES)]
    values += [TextValue(i, "description_sv", None, text) for i, text in enumerate(DESCRIPTIONS_SV)]
    values.append(TextValue(0, "title", "en", "Pear Conference"))  # tagged: left as tagged
    identify_languages(values, USE_M3_LANGUAGES)  # the starter model's languages: no Swedish
    got = {v.text: v.lang for v in values if v.field == "retailer_title"}
    assert got == RETAILER_TITLES
    assert {v.lang for v in values if v.field == "description_sv"} == {"sv"}
    assert values[-1].lang == "en"


def test_a_field_without_letters_is_unknown_and_repeated_values_agree() -> None:
    values = [TextValue(i, "size", None, text) for i, text in enumerate(["42", "44", "1,5"])]
    values += [TextValue(i, "title", None, "Fresh yellow onions") for i in range(3)]
    identify_languages(values, USE_M3_LANGUAGES)
    assert Counter(v.lang for v in values) == {None: 3, "en": 3}  # the build writes "und" for None
