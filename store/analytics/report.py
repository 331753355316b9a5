"""What the query log says over a time window: per language, per photo queries, over time.

Counted over the first pages (``offset`` 0) of searches: a shopper paging on is the same question asked
once. Per language (text queries, by their detected language):

    queries, none        searches, and those whose top label was ``none`` (nothing in the catalogue matches
                         well, by the version's calibration for that language)
    top_queries          the most asked normalised texts, and ``top_none_queries`` those among the ``none``
    ctr                  the share of searches with at least one click on their results
    mrr                  the mean over searches of 1 / the rank of their best-ranked clicked result (0 for
                         one without a click, or whose clicked product was not on the page logged)
    ctr_gap, mrr_gap     how far below the best language's (with at least ``MIN_QUERIES`` searches) it is

Photo queries get the same counts, and the products they found most often first. ``none_rate_over_time``
buckets the ``none`` share per language by ``bucket_s``. Events of every kind are counted by kind.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from store.analytics.querylog import QueryLog

MIN_QUERIES = 20  # a language with fewer searches is reported but does not set the best CTR / MRR


@dataclass
class QueryCount:
    query: str
    count: int


@dataclass
class LanguageReport:
    lang: str
    queries: int
    none: int
    none_rate: float
    clicked: int
    ctr: float
    mrr: float
    ctr_gap: float = 0.0
    mrr_gap: float = 0.0
    top_queries: list[QueryCount] = field(default_factory=list)
    top_none_queries: list[QueryCount] = field(default_factory=list)


@dataclass
class PhotoReport:
    queries: int
    none: int
    none_rate: float
    clicked: int
    ctr: float
    mrr: float
    top_products: list[QueryCount] = field(default_factory=list)  # product id, times found first


@dataclass
class NoneRatePoint:
    start: float  # the bucket's start, seconds since the epoch
    lang: str
    queries: int
    none: int
    none_rate: float


@dataclass
class AnalyticsReport:
    since: float
    until: float
    languages: list[LanguageReport]
    photos: PhotoReport
    none_rate_over_time: list[NoneRatePoint]
    events: dict[str, int]
    log: dict[str, int]  # rows held, bytes on disk


_FIRST_PAGES = "page_offset = 0 AND at >= ? AND at < ?"


def _clicks(log: QueryLog, kind: str, since: float, until: float) -> dict[str, tuple[int, float]]:
    """Per language (photos: ''): searches clicked, and the sum of 1 / best clicked rank (the rank read
    from the logged page by SQLite's JSON functions, in C: a million searches' clicks in a second)."""
    rows = log.read(
        "SELECT lang, COUNT(*), SUM(best) FROM (SELECT q.lang AS lang, MAX(COALESCE((SELECT "
        "1.0 / (j.key + 1) FROM json_each(q.top_ids) AS j WHERE j.value = e.product_id LIMIT 1), 0.0)) "
        "AS best "
        "FROM events e JOIN queries q ON q.query_id = e.query_id WHERE e.kind = 'click' AND q.kind = ? "
        "AND q.page_offset = 0 AND q.at >= ? AND q.at < ? GROUP BY e.query_id) GROUP BY lang",
        (kind, since, until),
    )
    return {lang: (int(n), float(total or 0.0)) for lang, n, total in rows}


def _top(log: QueryLog, since: float, until: float, top: int, only_none: bool) -> dict[str, list[QueryCount]]:
    where = " AND label = 'none'" if only_none else ""
    rows = log.read(
        "SELECT lang, query, n FROM (SELECT lang, query, COUNT(*) AS n, ROW_NUMBER() OVER "
        "(PARTITION BY lang ORDER BY COUNT(*) DESC, query) AS r FROM queries "
        f"WHERE kind = 'text' AND {_FIRST_PAGES}{where} GROUP BY lang, query) WHERE r <= ? ORDER BY lang, r",
        (since, until, top),
    )
    out: dict[str, list[QueryCount]] = defaultdict(list)
    for lang, query, n in rows:
        out[lang].append(QueryCount(query, int(n)))
    return out


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def analytics_report(
    log: QueryLog, *, since: float, until: float, top: int = 10, bucket_s: float = 3600.0
) -> AnalyticsReport:
    """The report of the searches made in [since, until)."""
    # One scan: per bucket, kind and language; the window's counts are its sums.
    buckets = log.read(
        "SELECT CAST(at / ? AS INTEGER) * ?, kind, lang, COUNT(*), SUM(label = 'none') FROM queries "
        f"WHERE {_FIRST_PAGES} GROUP BY 1, 2, 3 ORDER BY 1, 3",
        (bucket_s, bucket_s, since, until),
    )
    counts: dict[tuple[str, str], list[int]] = {}
    points = []
    for start, kind, lang, n, none in buckets:
        held = counts.setdefault((kind, lang), [0, 0])
        held[0] += int(n)
        held[1] += int(none or 0)
        if kind == "text":
            points.append(
                NoneRatePoint(float(start), lang, int(n), int(none or 0), _rate(int(none or 0), int(n)))
            )
    text_clicks = _clicks(log, "text", since, until)
    tops, nones = _top(log, since, until, top, False), _top(log, since, until, top, True)
    languages = []
    photos = PhotoReport(0, 0, 0.0, 0, 0.0, 0.0)
    for (kind, lang), (n, none) in counts.items():
        if kind == "photo":
            clicked, rr = _clicks(log, "photo", since, until).get(lang, (0, 0.0))
            photos = PhotoReport(n, none, _rate(none, n), clicked, _rate(clicked, n), round(rr / n, 6))
            continue
        clicked, rr = text_clicks.get(lang, (0, 0.0))
        languages.append(
            LanguageReport(
                lang,
                n,
                none,
                _rate(none, n),
                clicked,
                _rate(clicked, n),
                round(rr / n, 6),
                top_queries=tops.get(lang, []),
                top_none_queries=nones.get(lang, []),
            )
        )
    judged = [x for x in languages if x.queries >= MIN_QUERIES]
    best_ctr = max((x.ctr for x in judged), default=0.0)
    best_mrr = max((x.mrr for x in judged), default=0.0)
    for x in languages:
        x.ctr_gap, x.mrr_gap = round(max(0.0, best_ctr - x.ctr), 6), round(max(0.0, best_mrr - x.mrr), 6)
    languages.sort(key=lambda x: (-x.queries, x.lang))
    if photos.queries:
        photos.top_products = [
            QueryCount(str(product), int(n))
            for product, n in log.read(
                "SELECT json_extract(top_ids, '$[0]') AS first, COUNT(*) AS n FROM queries "
                f"WHERE kind = 'photo' AND results > 0 AND {_FIRST_PAGES} GROUP BY first "
                "ORDER BY n DESC, first LIMIT ?",
                (since, until, top),
            )
            if product is not None
        ]
    events = {
        kind: int(n)
        for kind, n in log.read(
            "SELECT kind, COUNT(*) FROM events WHERE at >= ? AND at < ? GROUP BY kind", (since, until)
        )
    }
    return AnalyticsReport(since, until, languages, photos, points, events, log.counts())
