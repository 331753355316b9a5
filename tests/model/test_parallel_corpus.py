"""Translation pairs drawn from a catalogue for MURAL's text-text term."""

from pathlib import Path

import pytest

from model.parallel_corpus import ParallelCorpus, ParallelCorpusError, pairs_from_catalogue, write_pairs_tsv
from synthetic.catalogue import CatalogueRecord

RECORDS = [
    CatalogueRecord(
        id=f"r{i}",
        image=Path(f"/x/{i}.png"),
        captions={
            "en": [f"red mug {i}", f"a mug {i} in red"],
            "de": [f"rote Tasse {i}", f"eine Tasse {i} in Rot"],
            "ja": [f"赤いマグ {i}", f"赤のマグ {i}"],
        },
    )
    for i in range(5)
]
SLOT = {
    text: (lang, j) for r in RECORDS for lang, texts in r.captions.items() for j, text in enumerate(texts)
}


def test_pairs_join_two_languages_of_one_record_in_the_same_slot() -> None:
    pairs = pairs_from_catalogue(RECORDS, pairs_per_record=6, seed=0)
    assert len(pairs) == 30
    for (source, target), record in zip(pairs, [r for r in RECORDS for _ in range(6)], strict=True):
        (la, ja), (lb, jb) = SLOT[source], SLOT[target]
        assert la != lb and ja == jb
        assert source in record.captions[la] and target in record.captions[lb]
    assert pairs == pairs_from_catalogue(RECORDS, pairs_per_record=6, seed=0)  # seeded
    assert {SLOT[s][0] for s, _ in pairs} == {"en", "de", "ja"}


def test_single_language_records_give_no_pairs() -> None:
    mono = [CatalogueRecord(id="m", image=Path("/m.png"), captions={"en": ["a", "b"]})]
    assert pairs_from_catalogue(mono, 3, 0) == []


def test_tsv_round_trip_flattens_tabs(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pairs.tsv"
    write_pairs_tsv([("red\tmug", "rote  Tasse"), ("blue hat", "blauer Hut")], path)
    assert ParallelCorpus.load(path).pairs == [("red mug", "rote Tasse"), ("blue hat", "blauer Hut")]
    path.write_text("only one field\n", encoding="utf-8")
    with pytest.raises(ParallelCorpusError, match=r"pairs\.tsv:1"):
        ParallelCorpus.load(path)
