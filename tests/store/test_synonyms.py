"""The synonyms format (``store.synonyms``): two-way groups and one-way entries, their limits, one-way
cycles refused naming the entry, the index-level set over a version's, and the files written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from store.synonyms import (
    MAX_ENTRIES,
    MAX_TERM_CHARS,
    MAX_TERM_WORDS,
    MAX_TERMS,
    SYNONYMS_FILE,
    SynonymsError,
    SynonymSet,
    delete_index_synonyms,
    index_synonyms_path,
    merged,
    parse,
    read_document,
    save_index_synonyms,
)


def _doc(*entries: object) -> dict[str, object]:
    return {"synonyms": list(entries)}


def test_two_way_and_one_way_entries_round_trip() -> None:
    synonyms = parse(
        _doc(
            {"terms": ["sneakers", "  trainers "], "lang": "en"},
            {"from": "tee", "to": ["t-shirt", "tee shirt"]},
            {"terms": ["Turnschuhe", "Sneaker"], "lang": "de_AT"},
        )
    )
    two_way, one_way, german = synonyms.rules
    assert two_way.two_way and two_way.pairs() == [("sneakers", "trainers"), ("trainers", "sneakers")]
    assert one_way.pairs() == [("tee", "t-shirt"), ("tee", "tee shirt")] and one_way.lang is None
    assert german.lang == "de-at"  # read as a language tag
    again = parse(json.loads(synonyms.to_bytes()))
    assert again == synonyms and again.digest == synonyms.digest


@pytest.mark.parametrize(
    ("entries", "loc", "words"),
    [
        ([{"from": "a", "to": ["b"]}, {"from": "b", "to": ["a"]}], ("synonyms", 1), "cycle"),
        (
            [{"from": "x", "to": ["y"]}, {"from": "y", "to": ["z"]}, {"from": "Z", "to": ["w", "X"]}],
            ("synonyms", 2),
            "'x' -> 'y' -> 'z' -> 'x'",
        ),
        ([{"from": "tee", "to": ["TEE"]}], ("synonyms", 0, "to"), "itself"),
        # A language's cycle through an entry of every language.
        ([{"from": "a", "to": ["b"], "lang": "en"}, {"from": "b", "to": ["a"]}], ("synonyms", 1), "en"),
        ([{"terms": ["a"]}], ("synonyms", 0, "terms"), "2 to"),
        ([{"terms": ["a", "A"]}], ("synonyms", 0, "terms"), "same term"),
        ([{"terms": ["a", "!!"]}], ("synonyms", 0, "terms", 1), "no word"),
        ([{"terms": ["a", "b" * (MAX_TERM_CHARS + 1)]}], ("synonyms", 0, "terms", 1), "characters"),
        ([{"terms": ["a", " ".join(["w"] * (MAX_TERM_WORDS + 1))]}], ("synonyms", 0, "terms", 1), "words"),
        ([{"terms": [str(i) for i in range(MAX_TERMS + 1)]}], ("synonyms", 0, "terms"), "terms"),
        ([{"from": "a", "to": []}], ("synonyms", 0, "to"), "1 to"),
        ([{"from": "a"}], ("synonyms", 0), "both"),
        ([{"terms": ["a", "b"], "to": ["c"]}], ("synonyms", 0), "only"),
        ([{"terms": ["a", "b"], "lang": "english!"}], ("synonyms", 0, "lang"), "language code"),
        ([{"terms": ["a", 3]}], ("synonyms", 0, "terms", 1), "string"),
        (["a"], ("synonyms", 0), "object"),
        ([{"terms": ["a", "b\x00c"]}], ("synonyms", 0, "terms", 1), "control"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry(entries: list[object], loc: tuple, words: str) -> None:
    with pytest.raises(SynonymsError, match=words) as raised:
        parse(_doc(*entries))
    assert raised.value.loc == loc


def test_one_way_entries_of_other_languages_are_no_cycle() -> None:
    parse(_doc({"from": "a", "to": ["b"], "lang": "en"}, {"from": "b", "to": ["a"], "lang": "de"}))
    parse(_doc({"terms": ["a", "b"]}, {"from": "a", "to": ["c"]}))  # a two-way group is no cycle


def test_document_limits() -> None:
    with pytest.raises(SynonymsError, match=f"at most {MAX_ENTRIES}"):
        parse(_doc(*[{"terms": [f"a{i}", f"b{i}"]} for i in range(MAX_ENTRIES + 1)]))
    assert len(parse(_doc(*[{"terms": [f"a{i}", f"b{i}"]} for i in range(MAX_ENTRIES)]))) == MAX_ENTRIES
    for bad in ([], {"synonyms": {}}, {"synonyms": [], "more": 1}, {"synonyms": [], "format": 9}):
        with pytest.raises(SynonymsError):
            parse(bad)


def test_a_long_chain_without_a_cycle_is_accepted() -> None:
    # The depth-first search is iterative: a chain of a thousand entries does not reach a recursion limit.
    parse(_doc(*[{"from": f"t{i}", "to": [f"t{i + 1}"]} for i in range(MAX_ENTRIES)]))
    with pytest.raises(SynonymsError, match="cycle"):
        parse(_doc(*[{"from": f"t{i}", "to": [f"t{(i + 1) % 999}"]} for i in range(999)]))


def test_read_document_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "syn.json"
    path.write_text(json.dumps(_doc({"from": "a", "to": ["b"]}, {"from": "b", "to": ["a"]})))
    with pytest.raises(SynonymsError, match=rf"{path}: synonyms\[1\]: .*cycle"):
        read_document(path)
    path.write_bytes(b"\xff{")
    with pytest.raises(SynonymsError, match=f"{path}: not UTF-8 JSON"):
        read_document(path)
    with pytest.raises(SynonymsError, match="cannot read"):
        read_document(tmp_path / "missing.json")


def test_index_level_set_decides_the_terms_it_defines() -> None:
    version = parse(
        _doc({"terms": ["sneakers", "trainers"], "lang": "en"}, {"from": "tee", "to": ["t-shirt"]})
    )
    index = parse(_doc({"from": "Sneakers", "to": ["kicks"], "lang": "en"}))
    served = merged(index, version)
    assert [r.to_dict() for r in served.rules] == [
        {"from": "Sneakers", "to": ["kicks"], "lang": "en"},
        {"from": "tee", "to": ["t-shirt"]},
    ]
    assert merged(None, version) == version and merged(index, None) == index
    assert merged(None, None) == SynonymSet()


def test_index_level_file_is_saved_atomically_and_removed(tmp_path: Path) -> None:
    synonyms = parse(_doc({"terms": ["a", "b"]}))
    save_index_synonyms(tmp_path, "shop", synonyms)
    path = index_synonyms_path(tmp_path, "shop")
    assert path == tmp_path / "shop" / SYNONYMS_FILE and read_document(path) == synonyms
    assert [p.name for p in path.parent.iterdir()] == [SYNONYMS_FILE]  # no temp file left
    assert delete_index_synonyms(tmp_path, "shop") and not path.exists()
    assert not delete_index_synonyms(tmp_path, "shop")
