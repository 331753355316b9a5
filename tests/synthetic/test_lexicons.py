"""Caption lexicons: hand-checked grammar, injectivity and robustness to every mention subset."""

from __future__ import annotations

import itertools

import pytest

from synthetic.attributes import (
    ATTRIBUTE_NAMES,
    COLOURS,
    FULL_MENTION,
    ProductAttributes,
    all_combinations,
)
from synthetic.lexicons import LANGUAGES, LEXICONS, tr

BASIC = frozenset({"category", "colour", "count"})
WITH_PATTERN = BASIC | {"pattern"}


def attrs(
    category: str = "mug",
    colour: str = "red",
    pattern: str = "plain",
    count: int = 1,
    placement: str = "left",
    background: str = "grey",
) -> ProductAttributes:
    return ProductAttributes(category, colour, pattern, count, placement, background)


# (language, attributes, phrasing, mention, expected caption), each checked by hand.
EXPECTED: list[tuple[str, ProductAttributes, int, frozenset[str], str]] = [
    (
        "en",
        attrs(pattern="striped", count=3),
        0,
        FULL_MENTION,
        "three red striped mugs on the left, on a grey background",
    ),
    ("en", attrs("umbrella", "orange"), 0, BASIC, "an orange umbrella"),
    ("en", attrs("t_shirt", "white", count=2), 1, BASIC, "a pair of white T-shirts"),
    ("en", attrs("book", "pink", "plain", 4), 0, WITH_PATTERN, "four plain pink books"),
    ("de", attrs(pattern="striped", count=3), 0, WITH_PATTERN, "drei rote gestreifte Tassen"),
    ("de", attrs("hat", "blue"), 0, BASIC, "ein blauer Hut"),
    ("de", attrs("book", "white"), 0, BASIC, "ein weißes Buch"),
    ("de", attrs("bag", "orange", count=2), 0, BASIC, "zwei orangefarbene Taschen"),
    ("de", attrs("hat", "blue"), 0, frozenset({"category", "colour"}), "blauer Hut"),
    (
        "de",
        attrs("book", "pink", "dotted", 1, "right", "white"),
        2,
        FULL_MENTION,
        "weißer Hintergrund mit einem rosa gepunkteten Buch auf der rechten Seite",
    ),
    (
        "de",
        attrs("ball", "orange", "checked", 2, "left", "beige"),
        2,
        FULL_MENTION,
        "beigefarbener Hintergrund mit zwei orangefarbenen karierten Bällen auf der linken Seite",
    ),
    (
        "de",
        attrs("clock", "green", "striped", 4, "centre", "light_blue"),
        0,
        FULL_MENTION,
        "vier grüne gestreifte Uhren in der Mitte auf hellblauem Hintergrund",
    ),
    ("fr", attrs(pattern="striped", count=3), 0, WITH_PATTERN, "trois tasses rouges rayées"),
    ("fr", attrs("bag", "orange", "striped", 2), 0, WITH_PATTERN, "deux sacs orange rayés"),
    ("fr", attrs("chair", "white", count=2), 0, BASIC, "deux chaises blanches"),
    ("fr", attrs("hat", "brown", "dotted", 4), 0, WITH_PATTERN, "quatre chapeaux marron à pois"),
    (
        "fr",
        attrs("car", "green"),
        1,
        FULL_MENTION,
        "une voiture de couleur verte sans motif, placée à gauche, sur un fond gris",
    ),
    ("cs", attrs(count=2), 0, BASIC, "dva červené hrnky"),
    ("cs", attrs("t_shirt", count=2), 0, BASIC, "dvě červená trička"),
    ("cs", attrs("bag", "yellow", count=4), 0, BASIC, "čtyři žluté tašky"),
    ("cs", attrs("clock", "black", count=3), 0, BASIC, "troje černé hodiny"),
    ("cs", attrs("ball", "green"), 0, BASIC, "jeden zelený míč"),
    ("cs", attrs("car", "white"), 0, BASIC, "jedno bílé auto"),
    (
        "cs",
        attrs("book", "pink", "striped", 1, "right", "light_blue"),
        0,
        FULL_MENTION,
        "jedna růžová pruhovaná kniha vpravo na světle modrém pozadí",
    ),
    (
        "cs",
        attrs("t_shirt", "blue", "plain", 3, "left", "grey"),
        1,
        FULL_MENTION,
        "tři jednobarevná trička modré barvy, umístěná vlevo, šedé pozadí",
    ),
    ("ru", attrs(count=2), 0, BASIC, "две красные кружки"),
    ("ru", attrs("ball", count=2), 0, BASIC, "два красных мяча"),
    ("ru", attrs("chair", "blue", count=3), 0, BASIC, "три синих стула"),
    ("ru", attrs("clock", "black", count=2), 0, BASIC, "двое чёрных часов"),
    ("ru", attrs("clock", "white"), 0, BASIC, "одни белые часы"),
    ("ru", attrs("umbrella", "blue", "striped"), 0, WITH_PATTERN, "один синий полосатый зонт"),
    (
        "ru",
        attrs("mug", "red", "striped", 2, "left", "grey"),
        1,
        FULL_MENTION,
        "две кружки красного цвета в полоску, расположенные слева, фон серый",
    ),
    (
        "ru",
        attrs("bag", "green", "dotted", 1, "right", "light_blue"),
        0,
        FULL_MENTION,
        "одна зелёная сумка в горошек справа на голубом фоне",
    ),
    ("ja", attrs("chair", count=4), 0, BASIC, "赤い椅子4脚"),
    ("ja", attrs("book", "blue", count=3), 2, BASIC, "青い本が三冊ある"),
    ("ja", attrs("t_shirt", "white", count=2), 1, BASIC, "2枚の白色のTシャツ"),
    (
        "ja",
        attrs("umbrella", "green", "striped", 1, "right", "beige"),
        0,
        FULL_MENTION,
        "ベージュの背景の右側に置かれたストライプの緑の傘1本",
    ),
    ("zh", attrs("hat", "black", count=2), 0, BASIC, "两顶黑色帽子"),
    ("zh", attrs("lamp", "yellow"), 0, BASIC, "一盏黄色台灯"),
    ("zh", attrs("car", count=3), 0, BASIC, "三辆红色小汽车"),
    ("zh", attrs("umbrella", "green", count=4), 0, BASIC, "四把绿色雨伞"),
    (
        "zh",
        attrs("t_shirt", "blue", "dotted", 2, "left", "grey"),
        1,
        FULL_MENTION,
        "两件蓝色的T恤，带波点，摆在左侧，背景为灰色",
    ),
    ("es", attrs(pattern="striped", count=3), 0, WITH_PATTERN, "tres tazas rojas rayadas"),
    ("es", attrs("umbrella", "pink", count=2), 0, BASIC, "dos paraguas rosa"),
    ("es", attrs("clock", "brown", count=2), 0, BASIC, "dos relojes marrones"),
    ("es", attrs("lamp", "orange", "dotted", 4), 0, WITH_PATTERN, "cuatro lámparas naranja de lunares"),
    (
        "es",
        attrs("book", "white", "plain", 1, "centre", "beige"),
        1,
        FULL_MENTION,
        "un libro de color blanco sin estampado, colocado en el centro, sobre un fondo beige",
    ),
    ("tr", attrs(count=3), 0, BASIC, "üç kırmızı kupa"),
    ("tr", attrs("book"), 0, BASIC, "kırmızı bir kitap"),
    (
        "tr",
        attrs("mug", "red", "striped", 3, "left", "grey"),
        0,
        FULL_MENTION,
        "üç kırmızı çizgili kupa solda, gri arka planda",
    ),
    (
        "tr",
        attrs("clock", "white", "checked", 2, "right", "white"),
        1,
        FULL_MENTION,
        "beyaz zeminde sağ tarafta duran iki kareli beyaz saat",
    ),
    ("id", attrs(count=3), 0, BASIC, "tiga cangkir merah"),
    (
        "id",
        attrs("bag", "pink", "striped", 1, "right", "beige"),
        1,
        FULL_MENTION,
        "sebuah tas berwarna merah muda dengan motif garis-garis, diletakkan di sebelah kanan, berlatar krem",
    ),
]


@pytest.mark.parametrize(("lang", "item", "phrasing", "mention", "expected"), EXPECTED)
def test_hand_checked_captions(
    lang: str, item: ProductAttributes, phrasing: int, mention: frozenset[str], expected: str
) -> None:
    assert LEXICONS[lang].describe(item, phrasing, mention) == expected


def test_registry() -> None:
    assert LANGUAGES == ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
    assert tuple(LEXICONS) == LANGUAGES
    for module in LEXICONS.values():
        assert module.N_PHRASINGS >= 3


@pytest.mark.parametrize("lang", LANGUAGES)
def test_full_captions_identify_the_combination(lang: str) -> None:
    """Over all 23,040 combinations and all phrasings, no two combinations share a full caption."""
    module = LEXICONS[lang]
    owner: dict[str, ProductAttributes] = {}
    for item in all_combinations():
        for phrasing in range(module.N_PHRASINGS):
            caption = module.describe(item, phrasing, FULL_MENTION)
            assert owner.setdefault(caption, item) == item, (
                f"{caption!r} describes {owner[caption]} and {item}"
            )


def _mention_subsets() -> list[frozenset[str]]:
    optional = [name for name in ATTRIBUTE_NAMES if name != "category"]
    return [
        frozenset({"category", *subset})
        for size in range(len(optional) + 1)
        for subset in itertools.combinations(optional, size)
    ]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_mention_subset_gives_clean_text(lang: str) -> None:
    module = LEXICONS[lang]
    combos = all_combinations()
    for item in combos[:: len(combos) // 97]:
        for mention in _mention_subsets():
            for phrasing in range(module.N_PHRASINGS):
                caption = module.describe(item, phrasing, mention)
                assert caption and caption == caption.strip() and "  " not in caption, (
                    item,
                    mention,
                    caption,
                )
                assert not caption.startswith((",", "、", "，")) and ", ," not in caption


@pytest.mark.parametrize("lang", LANGUAGES)
def test_colours_get_distinct_words(lang: str) -> None:
    module = LEXICONS[lang]
    mention = frozenset({"category", "colour"})
    for phrasing in range(module.N_PHRASINGS):
        captions = {module.describe(attrs(colour=colour), phrasing, mention) for colour in COLOURS}
        assert len(captions) == len(COLOURS)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_unmentioned_attributes_change_nothing(lang: str) -> None:
    module = LEXICONS[lang]
    base = attrs("lamp", "green", "plain", 2, "left", "grey")
    other = attrs("lamp", "green", "plain", 2, "right", "beige")
    mention = frozenset({"category", "colour", "count", "pattern"})
    for phrasing in range(module.N_PHRASINGS):
        assert module.describe(base, phrasing, mention) == module.describe(other, phrasing, mention)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_bad_arguments_are_rejected(lang: str) -> None:
    module = LEXICONS[lang]
    with pytest.raises(ValueError, match="phrasing"):
        module.describe(attrs(), module.N_PHRASINGS, FULL_MENTION)
    with pytest.raises(ValueError, match="category"):
        module.describe(attrs(), 0, frozenset({"colour"}))
    with pytest.raises(ValueError, match="unknown attribute"):
        module.describe(attrs(), 0, frozenset({"category", "size"}))


def test_turkish_locative_harmony() -> None:
    assert [
        tr.locative(w) for w in ("sol", "orta", "sağ", "zemin", "sol taraf", "gri arka plan", "kitap", "göz")
    ] == [
        "solda",
        "ortada",
        "sağda",
        "zeminde",
        "sol tarafta",
        "gri arka planda",
        "kitapta",
        "gözde",
    ]


def test_invalid_attributes_are_rejected() -> None:
    with pytest.raises(ValueError, match="colour"):
        attrs(colour="teal")
    with pytest.raises(ValueError, match="count"):
        attrs(count=5)
