"""The query log (``store.analytics``) on real SQLite files: retention by age and by rows, the report's
numbers against references computed here from the rows written (top and top-``none`` queries per
language, CTR and MRR from the clicks' ranks and the gap to the best language, photo queries, the
``none`` rate over time), and query ids: made and checked, forged, altered, another index's, expired; the
machine's secret made once by racing processes."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
from pathlib import Path

import pytest

from store.analytics import (
    AnalyticsError,
    ExpiredQueryIdError,
    LoggedEvent,
    LoggedQuery,
    QueryIds,
    QueryLog,
    UnknownQueryIdError,
    analytics_report,
    load_secret,
    normalise_query,
)

T0 = 1_800_000_000.0


def query(
    n: int,
    *,
    text: str | None = "red shoes",
    lang: str = "en",
    label: str | None = "strong",
    at: float = T0,
    offset: int = 0,
    top: tuple[str, ...] = ("p1", "p2", "p3"),
    photo: str | None = None,
) -> LoggedQuery:
    return LoggedQuery(
        query_id=f"q{n}",
        at=at,
        kind="photo" if photo else "text",
        query=None if photo else text,
        photo=photo,
        lang="" if photo else lang,
        lang_confidence=None if photo else 0.9,
        mode="image" if photo else "hybrid",
        offset=offset,
        results=len(top),
        label=label,
        top_ids=top,
        latency_ms=3.0,
        key_id="k1",
    )


def test_normalised_queries_group_what_shoppers_type() -> None:
    assert normalise_query("  Röda   SKOR\t") == "röda skor"
    assert len(normalise_query("x" * 1000)) == 200


def test_retention_by_age_and_rows(tmp_path: Path) -> None:
    with QueryLog(tmp_path / "a.sqlite", retention_s=100.0, max_rows=1_000) as log:
        log.add_queries([query(i, at=T0 + i) for i in range(1_500)])
        log.add_events([LoggedEvent(T0 + i, f"q{i}", "p1", "click", "k1") for i in range(1_500)])
        assert log.counts()["queries"] == 1_500
        # Rows: the oldest 500 go; age: then everything before now - 100 s.
        assert log.prune(now=T0 + 1_000.0) == 500 + 400
        rows = log.read("SELECT MIN(at), MAX(at), COUNT(*) FROM queries")
        assert rows == [(T0 + 900, T0 + 1_499, 600)]
        (events,) = log.read("SELECT MIN(at) FROM events")[0]
        assert events == T0 + 900  # the events of queries gone went with them
        assert log.counts()["bytes"] > 0


def test_events_of_a_pruned_query_go_an_hour_on(tmp_path: Path) -> None:
    with QueryLog(tmp_path / "a.sqlite", retention_s=100.0, max_rows=1_000) as log:
        log.add_queries([query(1, at=T0)])
        # An event of a query never logged (its row lost, or still buffered by another worker) ...
        log.add_events([LoggedEvent(T0 + 50, "q-elsewhere", "p1", "click", "k1")])
        log.prune(now=T0 + 60)
        assert log.counts()["events"] == 1  # ... is kept while its query may still come
        log.prune(now=T0 + 50 + 3_601)
        assert log.counts()["events"] == 0


def test_a_query_id_is_kept_as_first_written(tmp_path: Path) -> None:
    with QueryLog(tmp_path / "a.sqlite", retention_s=1e9, max_rows=10_000) as log:
        log.add_queries([query(1, text="first")])
        log.add_queries([query(1, text="second")])
        assert log.read("SELECT query FROM queries") == [("first",)]


def test_a_log_that_cannot_be_opened_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(AnalyticsError, match="cannot open the query log"):
        QueryLog(bad, retention_s=1.0, max_rows=1_000)


def test_the_report_against_references(tmp_path: Path) -> None:
    rng = random.Random(5)
    rows: list[LoggedQuery] = []
    events: list[LoggedEvent] = []
    expected: dict[str, dict[str, float]] = {}
    texts = {"en": ["red shoes", "blue hat", "green bag", "kale"], "sv": ["röda skor", "grönkål", "blå hatt"]}
    fails = {"en": {"kale"}, "sv": {"grönkål"}}
    n = 0
    for lang, share in (("en", 0.6), ("sv", 0.3)):
        clicked = rr = 0.0
        total = 0
        for i in range(200):
            text = rng.choice(texts[lang])
            label = "none" if text in fails[lang] else rng.choice(["strong", "weak"])
            top = tuple(f"{lang}-p{j}" for j in range(10))
            at = T0 + i * 60.0
            rows.append(query(n, text=text, lang=lang, label=label, at=at, top=top))
            total += 1
            if rng.random() < share:
                rank = rng.randrange(1, 11)
                events.append(LoggedEvent(at + 5, f"q{n}", top[rank - 1], "click", "k1"))
                # A second click lower on the page: MRR takes the best-ranked one.
                events.append(LoggedEvent(at + 9, f"q{n}", top[-1], "click", "k1"))
                clicked += 1
                rr += 1.0 / rank
            n += 1
        expected[lang] = {"ctr": clicked / total, "mrr": rr / total}
    # A second page of a query (not counted again), a click on a product not on its page (a click, RR 0),
    # a search outside the window, an add to cart.
    rows.append(query(n, lang="en", offset=10, at=T0))
    rows.append(query(n + 1, lang="en", at=T0 - 10_000))
    rows.append(query(n + 2, text="blue hat", lang="en", label="weak", at=T0 + 5, top=("x",)))
    events += [
        LoggedEvent(T0 + 6, f"q{n + 2}", "not-shown", "click", "k1"),
        LoggedEvent(T0 + 7, f"q{n + 2}", "x", "add_to_cart", "k1"),
    ]
    expected["en"]["ctr"] = (expected["en"]["ctr"] * 200 + 1) / 201
    expected["en"]["mrr"] = expected["en"]["mrr"] * 200 / 201
    # Photo queries: two found p9 first, one found nothing.
    rows += [
        query(n + 3, photo="d1", top=("p9", "p1"), label=None),
        query(n + 4, photo="d2", top=("p9",), label=None),
        query(n + 5, photo="d3", top=(), label="none"),
    ]
    events.append(LoggedEvent(T0 + 1, f"q{n + 4}", "p9", "click", "k1"))
    with QueryLog(tmp_path / "a.sqlite", retention_s=1e9, max_rows=100_000) as log:
        log.add_queries(rows)
        log.add_events(events)
        report = analytics_report(log, since=T0, until=T0 + 200 * 60.0, top=3, bucket_s=3600.0)
    by_lang = {x.lang: x for x in report.languages}
    assert [x.lang for x in report.languages] == ["en", "sv"]
    assert (by_lang["en"].queries, by_lang["sv"].queries) == (201, 200)
    for lang in ("en", "sv"):
        got = by_lang[lang]
        assert got.ctr == pytest.approx(expected[lang]["ctr"], abs=1e-6)
        assert got.mrr == pytest.approx(expected[lang]["mrr"], abs=1e-6)
        in_window = [r for r in rows if r.lang == lang and r.offset == 0 and T0 <= r.at < T0 + 12_000]
        counts: dict[str, int] = {}
        for r in in_window:
            counts[r.query or ""] = counts.get(r.query or "", 0) + 1
        want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        assert [(q.query, q.count) for q in got.top_queries] == want
        nones = [(q.query, q.count) for q in got.top_none_queries]
        assert nones == [(text, counts[text]) for text in sorted(fails[lang])]
        assert got.none == sum(1 for r in in_window if r.label == "none")
    best_ctr = max(expected[x]["ctr"] for x in expected)
    assert by_lang["sv"].ctr_gap == pytest.approx(best_ctr - expected["sv"]["ctr"], abs=1e-6)
    assert by_lang["en"].ctr_gap == 0.0
    photos = report.photos
    assert (photos.queries, photos.none, photos.clicked) == (3, 1, 1)
    assert photos.mrr == pytest.approx(1 / 3, abs=1e-6)
    assert [(p.query, p.count) for p in photos.top_products] == [("p9", 2)]
    clicks = sum(1 for e in events if e.kind == "click" and T0 <= e.at < T0 + 12_000)
    assert report.events == {"click": clicks, "add_to_cart": 1}
    hours = {(p.start, p.lang): (p.queries, p.none) for p in report.none_rate_over_time}
    ref: dict[tuple[float, str], list[int]] = {}
    for r in rows:
        if r.kind == "text" and r.offset == 0 and T0 <= r.at < T0 + 12_000:
            key = (float(int(r.at / 3600.0) * 3600), r.lang)
            ref.setdefault(key, [0, 0])
            ref[key][0] += 1
            ref[key][1] += r.label == "none"
    assert hours == {k: tuple(v) for k, v in ref.items()}


def test_query_ids_are_checked_by_their_signature(tmp_path: Path) -> None:
    secret = load_secret(tmp_path)
    ids, other = QueryIds(secret, "shop"), QueryIds(secret, "other-shop")
    made = ids.new(T0)
    assert ids.check(made, now=T0 + 10, window_s=60) == pytest.approx(T0, abs=0.001)
    with pytest.raises(ExpiredQueryIdError):
        ids.check(made, now=T0 + 61, window_s=60)
    with pytest.raises(UnknownQueryIdError):
        other.check(made, now=T0, window_s=60)  # another index's
    with pytest.raises(UnknownQueryIdError):
        QueryIds(b"x" * 32, "shop").check(made, now=T0, window_s=60)  # another machine's secret
    altered = made[:-2] + ("A" if made[-2] != "A" else "B") + made[-1]
    for bad in (altered, "q" + "A" * 32, "nonsense", "", "q" + "!" * 32):
        with pytest.raises(UnknownQueryIdError):
            ids.check(bad, now=T0, window_s=60)


def _secret(folder: str, out: multiprocessing.Queue) -> None:
    out.put(load_secret(Path(folder)))


def test_racing_processes_make_one_secret(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_secret, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = {out.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(got) == 1 and load_secret(tmp_path) in got
    assert (tmp_path / ".analytics-secret").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [".analytics-secret"]  # no temporary file left


def test_the_stored_rows_hold_no_address_and_no_key(tmp_path: Path) -> None:
    with QueryLog(tmp_path / "a.sqlite", retention_s=1e9, max_rows=10_000) as log:
        log.add_queries([query(1)])
    db = sqlite3.connect(tmp_path / "a.sqlite")
    columns = [r[1] for r in db.execute("PRAGMA table_info(queries)")]
    assert not {"address", "ip", "client", "key", "api_key"} & set(columns)
    assert "key_id" in columns
