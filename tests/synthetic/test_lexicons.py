"""Caption lexicons: hand-checked grammar, injectivity and robustness to every mention subset."""

from __future__ import annotations

import itertools
import unicodedata

import pytest

from synthetic.attributes import (
    ATTRIBUTE_NAMES,
    COLOURS,
    FULL_MENTION,
    ProductAttributes,
    all_combinations,
)
from synthetic.lexicons import ADDED_LANGUAGES, ALL_LANGUAGES, LANGUAGES, LEXICONS, ar, it, ko, tr

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
    (
        "ko",
        attrs(pattern="striped", count=3),
        0,
        FULL_MENTION,
        "회색 배경의 왼쪽에 놓인 줄무늬 빨간 머그컵 세 개",
    ),
    ("ko", attrs("t_shirt", "white", count=2), 0, BASIC, "하얀 티셔츠 두 벌"),
    ("ko", attrs("car", "black", count=3), 1, BASIC, "검은색 자동차 세 대"),
    ("ko", attrs("hat", "yellow", count=4), 2, BASIC, "노란 모자가 네 개 놓여 있다"),
    ("ko", attrs("book", "blue"), 2, BASIC, "파란 책이 한 권 놓여 있다"),
    (
        "ko",
        attrs("hat", "blue"),
        1,
        frozenset({"category", "colour", "placement"}),
        "파란색 모자를 왼쪽에 배치",
    ),
    (
        "ko",
        attrs("umbrella", "green", "plain", 2, "right", "beige"),
        1,
        FULL_MENTION,
        "민무늬 초록색 우산 두 자루를 오른쪽에 배치, 배경은 베이지색",
    ),
    (
        "ko",
        attrs("book", "pink", "dotted", 3, "centre", "white"),
        1,
        FULL_MENTION,
        "물방울무늬 분홍색 책 세 권을 가운데에 배치, 배경은 흰색",
    ),
    (
        "ko",
        attrs("bag", "purple", "plain", 1, "left", "light_blue"),
        2,
        FULL_MENTION,
        "하늘색 배경의 왼쪽에 무늬가 없는 보라색 가방이 한 개 놓여 있다",
    ),
    (
        "ar",
        attrs(pattern="striped", count=3),
        0,
        FULL_MENTION,
        "ثلاثة أكواب حمراء مخططة على اليسار، على خلفية رمادية",
    ),
    ("ar", attrs("car", "white", count=2), 0, BASIC, "سيارتان بيضاوان"),
    ("ar", attrs("ball", "yellow", count=3), 0, BASIC, "ثلاث كرات صفراء"),
    ("ar", attrs("lamp", "black", count=4), 0, BASIC, "أربعة مصابيح سوداء"),
    ("ar", attrs("book", "blue"), 0, BASIC, "كتاب واحد أزرق"),
    ("ar", attrs("chair", "orange", count=2), 0, BASIC, "كرسيان برتقاليان"),
    ("ar", attrs("bag", "pink", "striped", 2), 0, WITH_PATTERN, "حقيبتان ورديتان مخططتان"),
    ("ar", attrs("mug", "white", count=2), 0, frozenset({"category", "colour"}), "أكواب بيضاء"),
    (
        "ar",
        attrs("clock", "green", "dotted", 2, "right", "beige"),
        1,
        FULL_MENTION,
        "ساعتان باللون الأخضر بنقشة نقاط، موضوعتان على اليمين، الخلفية بيج",
    ),
    (
        "ar",
        attrs("hat", "brown", "plain", 4, "centre", "light_blue"),
        2,
        FULL_MENTION,
        "على خلفية زرقاء فاتحة في المنتصف أربع قبعات بنية سادة",
    ),
    (
        "hi",
        attrs(pattern="striped", count=3),
        0,
        FULL_MENTION,
        "तीन लाल धारीदार मग बाईं ओर, स्लेटी पृष्ठभूमि पर",
    ),
    ("hi", attrs("umbrella", "black"), 0, BASIC, "एक काला छाता"),
    ("hi", attrs("umbrella", "black", count=2), 0, BASIC, "दो काले छाते"),
    ("hi", attrs("hat", "yellow", count=4), 0, BASIC, "चार पीली टोपियाँ"),
    ("hi", attrs("book", "red", count=3), 0, BASIC, "तीन लाल किताबें"),
    ("hi", attrs("clock", "brown", count=3), 2, BASIC, "तीन भूरी घड़ियाँ रखी हैं"),
    (
        "hi",
        attrs("bag", "blue", "dotted", 2, "centre", "white"),
        1,
        FULL_MENTION,
        "दो बिंदियों वाले नीले रंग के थैले, बीच में रखे हुए, पृष्ठभूमि सफ़ेद",
    ),
    (
        "hi",
        attrs("chair", "green", "plain", 1, "right", "light_blue"),
        2,
        FULL_MENTION,
        "हल्की नीली पृष्ठभूमि पर दाएँ हिस्से में एक हरी सादी कुर्सी रखी है",
    ),
    ("it", attrs(pattern="striped", count=3), 0, WITH_PATTERN, "tre tazze rosse a righe"),
    ("it", attrs("car", "pink"), 0, BASIC, "un'auto rosa"),
    ("it", attrs("car", "white", count=2), 0, BASIC, "due auto bianche"),
    ("it", attrs("t_shirt", "white"), 0, BASIC, "una maglietta bianca"),
    ("it", attrs("hat", "purple", count=4), 0, BASIC, "quattro cappelli viola"),
    ("it", attrs("umbrella", "green"), 0, BASIC, "un ombrello verde"),
    ("it", attrs("ball", "orange", count=3), 0, BASIC, "tre palloni arancioni"),
    (
        "it",
        attrs("car", "blue", count=3),
        1,
        frozenset({"category", "count", "placement"}),
        "tre auto, posizionate a sinistra",
    ),
    (
        "it",
        attrs("bag", "brown", "plain", 2, "centre", "beige"),
        0,
        FULL_MENTION,
        "due borse marroni a tinta unita al centro, su sfondo beige",
    ),
    (
        "it",
        attrs("clock", "black", "dotted", 2, "left", "white"),
        1,
        FULL_MENTION,
        "due orologi di colore nero con fantasia a pois, posizionati a sinistra, su uno sfondo bianco",
    ),
    (
        "it",
        attrs("bottle", "yellow", "checked", 1, "right", "light_blue"),
        2,
        FULL_MENTION,
        "sfondo azzurro con una bottiglia gialla a quadri sulla destra",
    ),
]


@pytest.mark.parametrize(("lang", "item", "phrasing", "mention", "expected"), EXPECTED)
def test_hand_checked_captions(
    lang: str, item: ProductAttributes, phrasing: int, mention: frozenset[str], expected: str
) -> None:
    assert LEXICONS[lang].describe(item, phrasing, mention) == expected


def test_registry() -> None:
    assert LANGUAGES == ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
    assert ADDED_LANGUAGES == ("ko", "ar", "hi", "it")
    assert ALL_LANGUAGES == LANGUAGES + ADDED_LANGUAGES
    assert tuple(LEXICONS) == ALL_LANGUAGES
    for module in LEXICONS.values():
        assert module.N_PHRASINGS >= 3
    # More phrasings in an added language would change the phrasing plan of the original ten's captions.
    most = max(LEXICONS[lang].N_PHRASINGS for lang in LANGUAGES)
    assert max(LEXICONS[lang].N_PHRASINGS for lang in ADDED_LANGUAGES) <= most


@pytest.mark.parametrize("lang", ALL_LANGUAGES)
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


@pytest.mark.parametrize("lang", ALL_LANGUAGES)
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
                assert not caption.startswith((",", "、", "，", "،"))
                assert ", ," not in caption and "، ،" not in caption


@pytest.mark.parametrize("lang", ALL_LANGUAGES)
def test_colours_get_distinct_words(lang: str) -> None:
    module = LEXICONS[lang]
    mention = frozenset({"category", "colour"})
    for phrasing in range(module.N_PHRASINGS):
        captions = {module.describe(attrs(colour=colour), phrasing, mention) for colour in COLOURS}
        assert len(captions) == len(COLOURS)


@pytest.mark.parametrize("lang", ALL_LANGUAGES)
def test_unmentioned_attributes_change_nothing(lang: str) -> None:
    module = LEXICONS[lang]
    base = attrs("lamp", "green", "plain", 2, "left", "grey")
    other = attrs("lamp", "green", "plain", 2, "right", "beige")
    mention = frozenset({"category", "colour", "count", "pattern"})
    for phrasing in range(module.N_PHRASINGS):
        assert module.describe(base, phrasing, mention) == module.describe(other, phrasing, mention)


@pytest.mark.parametrize("lang", ALL_LANGUAGES)
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


def test_korean_particles_follow_the_final_consonant() -> None:
    assert [ko.has_batchim(word) for word in ("모자", "머그컵", "개", "권", "자루", "배경")] == [
        False,
        True,
        False,
        True,
        False,
        True,
    ]
    assert (
        ko.particle("책", "을", "를") == "책을"
        and ko.particle("우산 두 자루", "을", "를") == "우산 두 자루를"
    )
    assert ko.particle("가방", "이", "가") == "가방이" and ko.particle("의자", "이", "가") == "의자가"
    assert ko.particle("배경", "은", "는") == "배경은" and ko.particle("시계", "은", "는") == "시계는"
    with pytest.raises(ValueError, match="Hangul"):
        ko.particle("T", "이", "가")


def test_italian_indefinite_article() -> None:
    assert [
        it.indefinite(gender, word)
        for gender, word in (
            ("m", "libro"),
            ("m", "ombrello"),
            ("m", "sfondo"),
            ("m", "zaino"),
            ("m", "gnomo"),
            ("m", "psicologo"),
            ("m", "sole"),
            ("f", "tazza"),
            ("f", "auto"),
            ("f", "sedia"),
        )
    ] == [
        "un libro",
        "un ombrello",
        "uno sfondo",
        "uno zaino",
        "uno gnomo",
        "uno psicologo",
        "un sole",
        "una tazza",
        "un'auto",
        "una sedia",
    ]


_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# The letters each added language writes outside ASCII: Unicode name prefixes.
_SCRIPTS = {"ko": ("HANGUL",), "ar": ("ARABIC",), "hi": ("DEVANAGARI",), "it": ("LATIN",)}


@pytest.mark.parametrize("lang", ADDED_LANGUAGES)
def test_added_languages_write_their_script_in_plain_logical_order(lang: str) -> None:
    """Letters of the language's own script (Arabic in logical order, without bidi controls or
    presentation forms), NFC-normalised."""
    module = LEXICONS[lang]
    combos = all_combinations()
    for item in combos[:: len(combos) // 211]:
        for phrasing in range(module.N_PHRASINGS):
            caption = module.describe(item, phrasing, FULL_MENTION)
            assert unicodedata.is_normalized("NFC", caption), caption
            assert not _BIDI_CONTROLS & set(caption), caption
            letters = [unicodedata.name(ch) for ch in caption if ch.isalpha()]
            assert letters and all(name.startswith(_SCRIPTS[lang]) for name in letters), caption
            assert not any("PRESENTATION FORM" in name or "ISOLATED FORM" in name for name in letters)
    assert "ال" in ar.describe(attrs(), 1, FULL_MENTION)


def test_invalid_attributes_are_rejected() -> None:
    with pytest.raises(ValueError, match="colour"):
        attrs(colour="teal")
    with pytest.raises(ValueError, match="count"):
        attrs(count=5)
