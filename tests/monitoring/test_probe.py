"""Probe sets and probe runs: a hand-checked scoring case, then in-process and HTTP runs on the real demo
model against a brute-force reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as ccrk_app
from model.metrics import mrv, mrv_std
from model.runtime import Encoder
from monitoring.probe import HttpSearcher, ProbeError, index_searcher, run_probes, score_run
from monitoring.probe_set import (
    Probe,
    ProbeSetError,
    load_probe_set,
    probes_from_captions,
    save_probe_set,
)
from store.version.reader import IndexVersion
from tests.fixtures import INDEX_NAME, Catalogue, LiveServer

LANGS = ["en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id"]


def catalogue_probes(catalogue: Catalogue, n: int = 12) -> list[Probe]:
    return probes_from_captions([(r.id, r.captions) for r in catalogue.records], n=n, seed=3)


def test_probes_from_captions_in_ten_languages(catalogue: Catalogue, tmp_path: Path) -> None:
    probes = catalogue_probes(catalogue)
    assert len(probes) == 12
    assert sorted(probes[0].queries) == sorted(LANGS)
    by_id = {r.id: r for r in catalogue.records}
    for p in probes:
        (target,) = p.target_ids
        assert p.queries == {lang: by_id[target].captions[lang][0] for lang in sorted(LANGS)}
    assert catalogue_probes(catalogue) == probes  # deterministic in the seed
    save_probe_set(probes, tmp_path / "p.jsonl")
    assert load_probe_set(tmp_path / "p.jsonl") == probes
    # Restricting languages keeps only those.
    two = probes_from_captions([(r.id, r.captions) for r in catalogue.records], n=3, languages=["de", "ja"])
    assert [sorted(p.queries) for p in two] == [["de", "ja"]] * 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"id": "a", "target_ids": [], "queries": {"en": "x", "de": "y"}}', "target_ids"),
        ('{"id": "a", "target_ids": ["t"], "queries": {"en": "x"}}', "at least two languages"),
        ('{"id": "a", "target_ids": ["t"], "queries": {"en": "x", "de": " "}}', "queries['de']"),
        ('{"target_ids": ["t"], "queries": {"en": "x", "de": "y"}}', "field 'id'"),
    ],
)
def test_bad_probe_set_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "target_ids": ["t"], "queries": {"en": "x", "de": "y"}}\n' + line + "\n")
    with pytest.raises(ProbeSetError) as info:
        load_probe_set(path)
    assert f"{path}:2:" in str(info.value) and message in str(info.value)


def test_score_run_hand_checked() -> None:
    # Two probes, two languages, depth 20. Probe 1: en rank 0, de rank 3; probe 2: en rank 12, de absent (20).
    probes = [Probe("p1", ("a",), {"en": "", "de": ""}), Probe("p2", ("b",), {"en": "", "de": ""})]
    filler = [f"x{i}" for i in range(30)]
    lists = {
        "en": [["a", *filler[:9]], [*filler[:12], "b"]],
        "de": [[*filler[:3], "a", *filler[3:9]], filler[:20]],
    }
    metrics = score_run(lists, probes, 20, {"en": [1.0, 3.0], "de": [2.0, 2.0]})
    en, de = metrics["per_language"]["en"], metrics["per_language"]["de"]
    assert (en["recall_at_1"], en["recall_at_5"], en["recall_at_10"]) == (0.5, 0.5, 0.5)
    assert (de["recall_at_1"], de["recall_at_5"], de["recall_at_10"]) == (0.0, 0.5, 0.5)
    assert en["mean_rank"] == 6.0 and de["mean_rank"] == 11.5
    # Table [[0, 3], [12, 20]]: deviations 1.5 and 4 -> MRV (2*1.5^2 + 2*4^2) / 4 = 9.125, mrv_std (1.5+4)/2.
    assert metrics["mrv"] == pytest.approx(9.125) == mrv(np.array([[0, 3], [12, 20]]))
    assert metrics["mrv_std"] == pytest.approx(2.75) == mrv_std(np.array([[0, 3], [12, 20]]))
    # Top 10 of probe 1: en {a, x0..x8}, de {x0..x2, a, x3..x8}: all 10 shared; probe 2: en x0..x9, de x0..x9.
    assert metrics["mean_overlap"] == 1.0 and en["overlap_at_10"] == 1.0
    assert en["latency_ms_p50"] == 2.0 and metrics["depth"] == 20


def test_needs_two_common_languages() -> None:
    probes = [Probe("p1", ("a",), {"en": "x", "de": "y"}), Probe("p2", ("b",), {"en": "x", "fr": "y"})]
    with pytest.raises(ProbeError, match="fewer than two languages"):
        run_probes(probes, lambda lang, text, depth: None, depth=10)  # type: ignore[arg-type,return-value]


def reference_ranks(
    catalogue: Catalogue, encoder: Encoder, probes: list[Probe], langs: list[str]
) -> np.ndarray:
    """0-based target ranks by brute force over the catalogue embeddings (ties broken by lower row)."""
    ids = catalogue.ids()
    table = np.zeros((len(probes), len(langs)), dtype=np.int64)
    for j, lang in enumerate(langs):
        q = encoder.encode_text([p.queries[lang] for p in probes]).embeds
        scores = q @ catalogue.encoded.embeds.T
        for i, p in enumerate(probes):
            order = np.lexsort((np.arange(len(ids)), -scores[i]))
            table[i, j] = int(np.flatnonzero(order == ids.index(p.target_ids[0]))[0])
    return table


def test_in_process_run_matches_brute_force(catalogue: Catalogue, encoder: Encoder, index_root: Path) -> None:
    probes = catalogue_probes(catalogue)
    with IndexVersion.open(index_root, INDEX_NAME) as index:
        metrics = run_probes(probes, index_searcher(index, encoder, "ccrk-demo"), depth=len(index))
        version = index.manifest.version
    langs = metrics["languages"]
    assert sorted(langs) == sorted(LANGS)
    table = reference_ranks(catalogue, encoder, probes, langs)
    for j, lang in enumerate(langs):
        for k in (1, 5, 10):
            assert metrics["per_language"][lang][f"recall_at_{k}"] == pytest.approx(
                float((table[:, j] < k).mean()), abs=5e-5
            )
    assert metrics["mrv"] == pytest.approx(mrv(table), abs=1e-4)
    assert metrics["mrv_std"] == pytest.approx(mrv_std(table), abs=1e-4)
    assert metrics["index_version"] == version and metrics["model"] == "ccrk-demo"


def test_http_run_matches_in_process(
    server: LiveServer, catalogue: Catalogue, encoder: Encoder, index_root: Path, tmp_path: Path
) -> None:
    probes = catalogue_probes(catalogue, n=5)
    with IndexVersion.open(index_root, INDEX_NAME) as index:
        local = run_probes(probes, index_searcher(index, encoder), depth=30)
    searcher = HttpSearcher(server.url, rerank=False)
    try:
        remote = run_probes(probes, searcher, depth=30)
    finally:
        searcher.close()
    for key in ("mrv", "mrv_std", "mean_overlap", "recall_at_10_mean"):
        assert remote[key] == pytest.approx(local[key], abs=1e-9), key
    for lang in local["languages"]:
        for k in ("recall_at_1", "recall_at_5", "recall_at_10", "mean_rank", "overlap_at_10"):
            assert remote["per_language"][lang][k] == local["per_language"][lang][k]
    assert remote["index_version"] == local["index_version"] and remote["model"] == "ccrk-demo"

    # The CLI over HTTP, stored into a SQLite history of its own.
    save_probe_set(probes, tmp_path / "probes.jsonl")
    out = tmp_path / "run.json"
    result = CliRunner().invoke(
        ccrk_app,
        [
            "probe",
            "run",
            "--probe-set",
            str(tmp_path / "probes.jsonl"),
            "--url",
            server.url,
            "--no-rerank",
            "--json-out",
            str(out),
            "--no-store",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["source"] == "cli" and record["mrv"] == pytest.approx(remote["mrv"])
    assert "MRV" in result.output and "ja" in result.output


def test_cli_make_set_and_bad_catalogue(catalogue: Catalogue, tmp_path: Path) -> None:
    source = catalogue.records[0].image.parent.parent.parent / "test.jsonl"
    result = CliRunner().invoke(
        ccrk_app,
        ["probe", "make-set", "--catalogue", str(source), "--out", str(tmp_path / "p.jsonl"), "--n", "7"],
    )
    assert result.exit_code == 0, result.output
    assert len(load_probe_set(tmp_path / "p.jsonl")) == 7
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    result = CliRunner().invoke(
        ccrk_app, ["probe", "make-set", "--catalogue", str(bad), "--out", str(tmp_path / "q.jsonl")]
    )
    assert result.exit_code == 2 and "bad.jsonl" in result.output
