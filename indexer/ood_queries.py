"""Queries that match nothing in any shop catalogue, to calibrate "no good match" against: strings a user
could type that carry no product meaning (keyboard mashes, random letters in each script, digits and
punctuation, SQL and markup fragments) and phrases from other domains (weather, taxes, sports results,
recipes) in many languages and scripts.

Deterministic for a seed. The other-domain phrases are deliberately far from shopping: a phrase such as
"wireless headphones" is a fine query for a shop that sells them, so it cannot serve as a negative.
"""

from __future__ import annotations

import numpy as np

# Letters to draw random "words" from, per script.
_ALPHABETS = {
    "latin": "abcdefghijklmnopqrstuvwxyz",
    "cyrillic": "абвгдежзийклмнопрстуфхцчшщыэюя",
    "greek": "αβγδεζηθικλμνξοπρστυφχψω",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "hangul": "가나다라마바사아자차카타파하거너더러머버서어저처커터퍼허",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのまみむめもらりるれろ",
    "han": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自",
    "devanagari": "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह",
}
_MASHES = ("asdfgh", "qwerty", "zxcvbn", "jkl;", "hjkl", "aaaa", "xyzzy", "qwertzuiop", "lkjhg", "mnbvc")
_SYMBOLS = ("...", "???", "!!!", "123456", "0000", "#", "@@@", "42", "3.14159", "--", "a", "x", "?")
_FRAGMENTS = (
    "SELECT * FROM users",
    "DROP TABLE items;--",
    "' OR 1=1 --",
    "<script>alert(1)</script>",
    "{{7*7}}",
    "../../etc/passwd",
    "null",
    "undefined",
    "NaN",
    "http://example.com",
    "user@example.com",
    "lorem ipsum dolor sit amet",
)
# Other-domain phrases: (language, text). Written for this list, far from any product catalogue.
OTHER_DOMAIN = (
    ("en", "weather forecast for tomorrow"),
    ("en", "how to file my tax return"),
    ("en", "football results last night"),
    ("en", "recipe for chicken soup"),
    ("en", "flight delay compensation rules"),
    ("en", "symptoms of the flu"),
    ("en", "meaning of life"),
    ("en", "train timetable to the airport"),
    ("de", "Wettervorhersage für morgen"),
    ("de", "Steuererklärung Frist verlängern"),
    ("de", "Bundesliga Ergebnisse gestern"),
    ("de", "wie spät ist es"),
    ("fr", "météo de demain à Paris"),
    ("fr", "résultats des élections municipales"),
    ("fr", "recette de la soupe à l'oignon"),
    ("fr", "horaires des trains pour Lyon"),
    ("es", "pronóstico del tiempo para mañana"),
    ("es", "resultados del partido de ayer"),
    ("es", "cómo pagar los impuestos"),
    ("cs", "předpověď počasí na zítřek"),
    ("cs", "výsledky voleb do senátu"),
    ("ru", "прогноз погоды на завтра"),
    ("ru", "результаты футбольного матча"),
    ("ru", "как заполнить налоговую декларацию"),
    ("tr", "yarın için hava durumu"),
    ("tr", "dün akşamki maçın sonucu"),
    ("id", "prakiraan cuaca besok"),
    ("id", "hasil pertandingan sepak bola"),
    ("ja", "明日の天気予報"),
    ("ja", "確定申告のやり方"),
    ("ja", "昨日のサッカーの結果"),
    ("zh", "明天的天气预报"),
    ("zh", "如何申报个人所得税"),
    ("zh", "昨晚的足球比分"),
    ("ko", "내일 날씨 예보"),
    ("ko", "세금 신고 방법"),
    ("ar", "توقعات الطقس ليوم غد"),
    ("ar", "نتائج مباراة كرة القدم"),
    ("hi", "कल का मौसम पूर्वानुमान"),
    ("hi", "आयकर रिटर्न कैसे भरें"),
    ("el", "πρόγνωση καιρού για αύριο"),
    ("he", "תחזית מזג האוויר למחר"),
    ("th", "พยากรณ์อากาศพรุ่งนี้"),
    ("it", "previsioni del tempo per domani"),
    ("pl", "prognoza pogody na jutro"),
    ("pt", "previsão do tempo para amanhã"),
    ("nl", "weerbericht voor morgen"),
    ("uk", "прогноз погоди на завтра"),
    ("vi", "dự báo thời tiết ngày mai"),
)


# The script a language's shoppers type in (default: Latin), to compare a query with noise in its own script:
# short Japanese queries score lower than short Latin ones, and random kana lower than random Latin letters.
LANGUAGE_SCRIPTS = {
    "ja": ("han", "kana"),
    "zh": ("han",),
    "ko": ("hangul",),
    "ru": ("cyrillic",),
    "uk": ("cyrillic",),
    "bg": ("cyrillic",),
    "ar": ("arabic",),
    "fa": ("arabic",),
    "hi": ("devanagari",),
    "el": ("greek",),
    "he": ("hebrew",),
    "th": ("thai",),
}


def kinds_for_language(lang: str) -> set[str]:
    """The kinds of no-match query (``ood_queries``' first element) written in ``lang``'s script."""
    scripts = LANGUAGE_SCRIPTS.get(lang, ("latin",))
    kinds = {f"random:{script}" for script in scripts} | {f"other-domain:{lang}"}
    if scripts == ("latin",):
        kinds |= {"mash", "fragment"} | {
            f"other-domain:{other}" for other, _ in OTHER_DOMAIN if other not in LANGUAGE_SCRIPTS
        }
    return kinds


def random_words(rng: np.random.Generator, alphabet: str, words: int) -> str:
    """``words`` random 2-8 letter "words" from ``alphabet`` (CJK scripts: no spaces)."""
    parts = ["".join(rng.choice(list(alphabet), size=int(rng.integers(2, 9)))) for _ in range(words)]
    return ("" if alphabet in (_ALPHABETS["han"], _ALPHABETS["kana"]) else " ").join(parts)


def ood_queries(n_random: int = 320, seed: int = 0) -> list[tuple[str, str]]:
    """(kind, text) pairs: every fixed mash, symbol run, fragment and other-domain phrase, plus ``n_random``
    random-letter queries spread over the scripts."""
    rng = np.random.default_rng(seed)
    out = [("mash", t) for t in _MASHES] + [("symbols", t) for t in _SYMBOLS]
    out += [("fragment", t) for t in _FRAGMENTS]
    out += [(f"other-domain:{lang}", t) for lang, t in OTHER_DOMAIN]
    scripts = sorted(_ALPHABETS)
    for i in range(n_random):
        script = scripts[i % len(scripts)]
        out.append((f"random:{script}", random_words(rng, _ALPHABETS[script], int(rng.integers(1, 4)))))
    return out
