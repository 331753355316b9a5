"""Decompounding (store.text.decompound): exact splits of compounds of German, Swedish and Dutch against small
given word sets and a small index's vocabulary, with their linking morphemes and restored endings; the
words that must not split (short, known whole, not letters, unknown parts or head); the preferences
between splits; a query's split reading."""

from __future__ import annotations

import pytest

from store.text.decompound import MAX_WORD, Decompounder, Split, compounding
from store.text.lexical import analyze
from store.text.spelling import Vocabulary

SWEDISH = {"äpple", "juice", "apelsin", "honung", "melon", "grapefrukt", "flicka", "skola", "gata", "kort"}


def split(lang: str, known: set[str], word: str, index: Vocabulary | None = None) -> tuple[str, ...] | None:
    found = Decompounder(lang, known.__contains__, index).split(word)
    return None if found is None else found.parts


def test_compounds_split_into_known_words_with_their_linking_morphemes_and_restored_endings() -> None:
    assert split("sv", SWEDISH, "äppeljuice") == ("äpple", "juice")  # "äppel": the modifier of "äpple"
    assert split("sv", SWEDISH, "apelsinjuice") == ("apelsin", "juice")
    assert split("sv", SWEDISH, "honungsmelon") == ("honung", "melon")  # linking s
    assert split("sv", SWEDISH, "flickskola") == ("flicka", "skola")  # a dropped final a
    assert split("sv", SWEDISH, "gatukort") == ("gata", "kort")  # linking u for a dropped a
    assert split("de", {"orange", "saft", "apfel"}, "orangensaft") == ("orange", "saft")  # linking n
    assert split("de", {"orange", "saft", "apfel"}, "apfelsaft") == ("apfel", "saft")
    assert split("de", {"schule", "buch"}, "schulbuch") == ("schule", "buch")  # a dropped final e
    assert split("de", {"tag", "licht"}, "tageslicht") == ("tag", "licht")  # linking es
    assert split("nl", {"sinaasappel", "sinaas", "appel", "sap"}, "sinaasappelsap") == ("sinaasappel", "sap")
    assert split("nl", {"boek", "kast"}, "boekenkast") == ("boek", "kast")  # linking en
    # A Norwegian word under either code; Danish with its linking s.
    assert split("nb", {"fisk", "suppe"}, "fiskesuppe") == ("fisk", "suppe")
    assert split("da", {"jul", "gave"}, "julegave") == ("jul", "gave")


def test_a_split_carries_its_parts_terms_as_the_lexical_analysis_stems_them() -> None:
    found = Decompounder("sv", SWEDISH.__contains__).split("äppeljuice")
    assert found == Split(("äpple", "juice"), (*analyze("äpple", "sv"), *analyze("juice", "sv")))
    assert found.terms == ("äppl", "juic")
    assert Decompounder("de", {"apfel", "saft"}.__contains__).split("apfelsäfte") is None  # head unknown


def test_words_that_must_not_split() -> None:
    known = {*SWEDISH, "äppeljuice"}
    d = Decompounder("sv", known.__contains__)
    assert d.split("äppeljuice") is None  # known whole
    assert d.split("juice") is None  # too short to hold two parts
    assert Decompounder("sv", {"te", "kakor"}.__contains__).split("tekakor") is None  # a part of two letters
    assert Decompounder("sv", {"get", "ost"}.__contains__).split("getost") is None  # six letters: chance
    assert d.split("bananjuice") is None  # "banan" is no known word
    assert d.split("apelsinjuic") is None  # "juic" is no known word: no head
    assert d.split("äppel2juice") is None  # not letters only
    assert d.split("") is None
    long = {"x" * (MAX_WORD - 5), "x" * (MAX_WORD - 4), "juice"}.__contains__
    assert Decompounder("sv", long).split("x" * (MAX_WORD - 5) + "juice") is not None
    assert Decompounder("sv", long).split("x" * (MAX_WORD - 4) + "juice") is None  # longer than MAX_WORD


def test_compounding_languages_and_their_codes() -> None:
    assert [compounding(c) for c in ("de", "de-AT", "sv_SE", "NL", "nb", "nn", "da", "fi")] == [
        "de",
        "de",
        "sv",
        "nl",
        "no",
        "no",
        "da",
        "fi",
    ]
    assert compounding("en") is None and compounding(None) is None and compounding("") is None
    with pytest.raises(ValueError, match="not a compounding language"):
        Decompounder("en", SWEDISH.__contains__)


def test_the_fewest_parts_then_the_longest_head_then_the_fewest_link_letters_win() -> None:
    # Three parts only where no two will do; each part of a split in three has four letters or more.
    assert split("sv", {"äpple", "juice", "paket"}, "äppeljuicepaket") == ("äpple", "juice", "paket")
    assert split("sv", {"äpple", "juice", "paket", "äppeljuice"}, "äppeljuicepaket") == (
        "äppeljuice",
        "paket",
    )
    assert split("sv", {"ris", "kaka", "paket"}, "riskakapaket") is None  # "ris": three letters
    # The longest head: "fruktjuice" before "juice".
    assert split("sv", {"grape", "grapefrukt", "fruktjuice", "juice"}, "grapefruktjuice") == (
        "grape",
        "fruktjuice",
    )
    # No linking morpheme before one: German "orangen" is a word (the plural) and needs no link.
    assert split("de", {"orange", "orangen", "saft"}, "orangensaft") == ("orangen", "saft")
    # The modifier as written before a restored ending (both known, no index to choose by).
    assert split("sv", {"äppel", "äpple", "juice"}, "äppeljuice") == ("äppel", "juice")


def test_with_an_index_the_head_must_be_written_in_it_and_a_word_written_whole_is_not_split() -> None:
    index = Vocabulary.of_texts([("Äpple Juice", "sv"), ("Apelsin Juice", "sv"), ("Galia melon", "en")])
    known = {"äpple", "äppel", "juice", "grapefrukt", "vatten", "melon", "apelsin"}.__contains__
    d = Decompounder("sv", known, index)
    assert d.split("grapefruktjuice").parts == ("grapefrukt", "juice")  # a part the shop never writes
    assert d.split("vattenmelon").parts == ("vatten", "melon")
    assert d.split("äppeljuice").parts == ("äpple", "juice")  # the modifier form the index writes
    assert d.split("galiamelon").parts == ("galia", "melon")  # "galia": known to the index only
    assert Decompounder("sv", known, Vocabulary.of_texts([("Galia", "en")])).split("vattenmelon") is None
    written = Vocabulary.of_texts([("Äppeljuice", "sv"), ("Juice", "sv")])
    assert Decompounder("sv", known, written).split("äppeljuice") is None  # the index writes it whole
    # Known whole by its stem: the index writes "apelsiner", its stem is the query word's; a stem of three
    # letters does not count (shared by unrelated words: "fil" of "filen", "filet").
    short = Vocabulary.of_texts([("Filen", "sv"), ("Lax", "sv")])
    assert Decompounder("sv", {"lax", "filet"}.__contains__, short).split("laxfilet") is None
    plural = Vocabulary.of_texts([("Apelsiner och äpple", "sv"), ("Juice", "sv")])
    assert Decompounder("sv", known, plural).split("apelsinjuice").parts == ("apelsin", "juice")
    assert Decompounder("sv", known, plural).split("apelsin") is None


def test_a_head_written_in_another_inflection_is_found_by_its_stem() -> None:
    index = Vocabulary.of_texts([("Juicer av äpple", "sv")])  # "juicer": the plural
    known = {"äpple", "juice"}.__contains__
    assert Decompounder("sv", known, index).split("äppeljuice").parts == ("äpple", "juice")
    # The head must also be a word of the language for its stem to count: "juicen" (the juice) stems to
    # the index's "juic", and counts only where it is known.
    assert Decompounder("sv", known, index).split("äppeljuicen") is None
    with_definite = {"äpple", "juice", "juicen"}.__contains__
    assert Decompounder("sv", with_definite, index).split("äppeljuicen").parts == ("äpple", "juicen")


def test_a_reading_replaces_each_split_words_term_by_its_parts_terms() -> None:
    d = Decompounder("sv", SWEDISH.__contains__)
    assert d.reading("Färsk Äppeljuice 1l") == [*analyze("färsk", "sv"), "äppl", "juic", *analyze("1l", "sv")]
    assert d.reading("Färsk Äppeljuice, 1l") == d.reading("färsk äppeljuice 1l")
    assert d.reading("färsk mjölk") is None  # nothing split
    assert d.reading("") is None


def test_splits_are_deterministic_and_cached() -> None:
    d = Decompounder("sv", SWEDISH.__contains__)
    first = d.split("honungsmelon")
    assert first is d.split("honungsmelon")  # the cached object
    assert Decompounder("sv", SWEDISH.__contains__).split("honungsmelon") == first
