"""Both pages in headless Chromium (Debian's chromium and chromedriver, driven by selenium) against a real
service: the dashboard draws the seeded history, the search page shows images for a German and a Japanese
query, compare mode marks the shared items, a shared link (/?q=...&lang=...) runs its search on load and a
search puts its link in the address bar. Screenshots go to $TMPDIR/ccrk-test-screenshots/
(``tests.artifacts_guard.screenshots_dir``), never the checkout's artifacts/."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from monitoring.history import SqliteHistory
from monitoring.traffic import TrafficAggregator
from store.analytics import LoggedEvent, LoggedQuery, QueryLog
from tests.artifacts_guard import screenshots_dir
from tests.fixtures import INDEX_NAME, Catalogue, LiveServer, make_settings

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--window-size=1400,1700",
)
HOUR = 3600.0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "Debian chromium and chromium-driver are not installed "
            "(apt-get install -y chromium chromium-driver; .ci/run installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def run_record(
    t: float, version: str, mrv: float, mrv_std: float, recall: dict[str, float], **extra: Any
) -> dict:
    return {
        "time": t,
        "source": extra.pop("source", "schedule"),
        "index_version": version,
        "model": "ccrk-demo",
        "n_probes": 50,
        "depth": 100,
        "mrv": mrv,
        "mrv_std": mrv_std,
        "mean_overlap": 0.6,
        "recall_at_10_mean": sum(recall.values()) / len(recall),
        "latency_ms_p50": 1.5,
        "latency_ms_p95": 3.0,
        "per_language": {
            lang: {
                "recall_at_1": r / 3,
                "recall_at_5": r / 1.5,
                "recall_at_10": r,
                "mean_rank": 4.0,
                "overlap_at_10": 0.6,
                "latency_ms_p50": 1.5,
                "latency_ms_p95": 3.0,
            }
            for lang, r in recall.items()
        },
        **extra,
    }


# The seeded history: four served runs over two versions (ja drops 20 points on v2, MRV ends above the
# 25 alert ceiling), one version refused by the gate, traffic in three minutes.
NOW = time.time()
V1, V2, V3 = "20261101T000000Z-aaaaaa", "20261102T000000Z-bbbbbb", "20261103T000000Z-cccccc"
SEEDED_RUNS = [
    run_record(NOW - 6 * HOUR, V1, 8.0, 1.1, {"en": 0.90, "de": 0.88, "ja": 0.80}),
    run_record(NOW - 5 * HOUR, V1, 9.5, 1.2, {"en": 0.91, "de": 0.87, "ja": 0.82}),
    run_record(
        NOW - 4 * HOUR,
        V3,
        60.0,
        4.0,
        {"en": 0.3, "de": 0.3, "ja": 0.2},
        source="gate",
        gate={"passed": False, "reasons": ["en: recall@10 0.300 is below the minimum 0.500"]},
    ),
    run_record(NOW - 3 * HOUR, V2, 20.0, 2.0, {"en": 0.90, "de": 0.86, "ja": 0.62}),
    run_record(NOW - 2 * HOUR, V2, 31.0, 2.6, {"en": 0.89, "de": 0.85, "ja": 0.60}),
]
SERVED = [r for r in SEEDED_RUNS if r["source"] != "gate"]
TRAFFIC_MINUTES = [int((NOW - m * 60) // 60) * 60 for m in (30, 20, 10)]
DE_COUNTS = [4, 7, 2]


@pytest.fixture(scope="module")
def site(index_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    db = tmp_path_factory.mktemp("history") / "history.sqlite"
    store = SqliteHistory(db, retention_s=30 * 86400)
    for record in SEEDED_RUNS:
        store.add_run(record)
    agg = TrafficAggregator()
    for minute, n in zip(TRAFFIC_MINUTES, DE_COUNTS, strict=True):
        for i in range(n):
            agg.record("de", 10, 0.5, 2.0 + i, now=minute + 1)
        agg.record("ja", 10 if n > 2 else 0, 0.4, 5.0, now=minute + 1)
        agg.record_ann("de", 0.9, now=minute + 1)
    store.add_traffic(agg.drain())
    seed_query_log(db.parent)
    # No probe set: the charts hold the seeded runs only; live traffic is flushed only at shutdown.
    settings = make_settings(
        index_root, history_db=db, traffic_flush_s=3600, ann_sample_rate=0.0, dashboard_queries=True
    )
    with LiveServer(settings) as live:
        yield live


# The seeded query log (search analytics): per language, searches 2 h and 1 h ago, those labelled none,
# and the searches clicked at rank 1.
SEARCHES = {"en": ((6, 1), (4, 1)), "de": ((5, 0), (5, 3))}  # (searches, none) in each hour
CLICKED = {"en": 4, "de": 2}


def seed_query_log(folder: Path) -> None:
    rows, events = [], []
    for lang, hours in SEARCHES.items():
        n = 0
        for back, (searches, nones) in zip((2, 1), hours, strict=True):
            at = (int(NOW // HOUR) - back) * HOUR + 60.0
            for i in range(searches):
                qid = f"q-{lang}-{n}"
                text = "lila paraply" if lang == "de" and i < nones else f"{lang} query {i % 3}"
                label = "none" if i < nones else "strong"
                rows.append(LoggedQuery(qid, at + i, "text", text, None, lang, 0.9, "hybrid", 0, 3, label,
                                        ("a", "b", "c"), 4.0, "k1"))  # fmt: skip
                if n < CLICKED[lang]:
                    events.append(LoggedEvent(at + i + 1, qid, "a", "click", "k1"))
                n += 1
    with QueryLog(folder / f"{INDEX_NAME}.analytics.sqlite", retention_s=30 * 86400, max_rows=10_000) as log:
        log.add_queries(rows)
        log.add_events(events)


def wait_js(drv: Any, script: str, *args: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = drv.execute_script(script, *args)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {script}")
        time.sleep(0.1)


def shot(drv: Any, name: str) -> Path:
    folder = screenshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1400, min(max(int(height) + 40, 900), 4000))
    drv.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    return path


TRACES = """return Array.from(document.getElementById(arguments[0]).data).map(
    t => ({meta: t.meta || null, name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []),
           visible: t.visible}));"""


def test_dashboard_draws_the_seeded_history(browser: Any, site: LiveServer) -> None:
    browser.get(site.url + "/dashboard?hours=24")  # the analytics' points: half an hour each
    wait_js(browser, "return document.body.dataset.chartsReady === '1'")
    assert browser.execute_script("return typeof Plotly") == "object"
    # Every script and stylesheet comes from the service itself.
    sources = browser.execute_script(
        "return Array.from(document.querySelectorAll('script[src], link[href]')).map(e => e.src || e.href)"
    )
    assert sources and all(s.startswith(site.url) for s in sources), sources

    mrv = browser.execute_script(TRACES, "chart-mrv")
    by_metric = {t["meta"]["metric"]: t for t in mrv}
    assert by_metric["mrv"]["y"] == [r["mrv"] for r in SERVED]
    assert by_metric["mrv_std"]["y"] == [r["mrv_std"] for r in SERVED]
    assert len(by_metric["mrv"]["x"]) == 4
    assert by_metric["gate_refused"]["y"] == [60.0]
    # Drawn, not only handed over: one SVG point per seeded run on the MRV line.
    points = browser.execute_script(
        "return document.querySelectorAll('#chart-mrv .scatterlayer .trace')[0]"
        ".querySelectorAll('.point').length"
    )
    assert points == 4
    # Version markers: a dotted line per index version and one for the refused version.
    shapes = browser.execute_script("return document.getElementById('chart-mrv').layout.shapes.length")
    assert shapes == 1 + 3  # the alert ceiling + v1, refused v3, v2

    recall = browser.execute_script(TRACES, "chart-recall")
    at10 = {t["meta"]["lang"]: t for t in recall if t["meta"]["k"] == 10}
    assert sorted(at10) == ["de", "en", "ja"]
    for lang in ("en", "de", "ja"):
        assert at10[lang]["y"] == pytest.approx([r["per_language"][lang]["recall_at_10"] for r in SERVED])
        assert at10[lang]["visible"] is True
    assert all(t["visible"] is False for t in recall if t["meta"]["k"] != 10)
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-recall .scatterlayer .trace'))"
        ".filter(t => t.querySelectorAll('.point').length === 4).length"
    )
    assert drawn == 3  # three visible languages, four points each

    traffic = browser.execute_script(TRACES, "chart-traffic")
    de_count = next(t for t in traffic if t["meta"] == {"metric": "count", "lang": "de"})
    assert de_count["y"] == DE_COUNTS
    ja_zero = next(t for t in traffic if t["meta"] == {"metric": "zero_result_rate", "lang": "ja"})
    assert ja_zero["y"] == [0.0, 0.0, 1.0]
    ann = browser.execute_script(TRACES, "chart-ann")
    assert [t["meta"]["lang"] for t in ann] == ["de"] and ann[0]["y"] == [0.9, 0.9, 0.9]

    kinds = browser.execute_script(
        "return Array.from(document.querySelectorAll('#alerts li'))"
        ".map(li => [li.dataset.kind, li.dataset.lang])"
    )
    assert kinds == [["mrv", ""], ["recall_drop", "ja"], ["gate", ""]]
    alert_text = browser.find_element("id", "alerts").text
    assert "ja: recall@10 dropped 22.0 points" in alert_text and f"quality gate refused {V3}" in alert_text

    # Search analytics: the 'none' share per language and hour, CTR and MRR, the top 'none' queries.
    none_rate = {t["meta"]["lang"]: t["y"] for t in browser.execute_script(TRACES, "chart-none-rate")}
    want = {lang: [n / s for s, n in hours] for lang, hours in SEARCHES.items()}
    assert none_rate.keys() == want.keys()
    assert all(none_rate[lang] == pytest.approx(want[lang], abs=1e-6) for lang in want)
    clicks = {t["meta"]["metric"]: dict(zip(t["x"], t["y"], strict=True))
              for t in browser.execute_script(TRACES, "chart-clicks")}  # fmt: skip
    searches = {lang: sum(s for s, _ in hours) for lang, hours in SEARCHES.items()}
    assert clicks["ctr"] == pytest.approx({lang: CLICKED[lang] / searches[lang] for lang in SEARCHES})
    assert clicks["mrr"] == clicks["ctr"]  # every click at rank 1
    de_row = browser.find_element("css selector", "#analytics-table tr[data-lang='de'] .none-queries")
    assert de_row.find_element("css selector", ".query").text == "lila paraply"
    assert "(3)" in de_row.text
    # The link to action: the query searched as typed (text channel, no typo correction, no synonyms).
    link = de_row.find_element("css selector", "a.as-typed").get_attribute("href")
    assert link.endswith("/?q=lila%20paraply&lang=de&mode=text&typos=0&synonyms=false"), link
    synonyms_link = de_row.find_element("css selector", "a.with-synonyms").get_attribute("href")
    assert synonyms_link.endswith("/?q=lila%20paraply&lang=de&mode=text"), synonyms_link
    shot(browser, "dashboard.png")


def search_in_page(drv: Any, query: str, query_b: str | None = None) -> None:
    drv.execute_script("document.getElementById('results').removeAttribute('data-done')")
    box = drv.find_element("id", "query")
    box.clear()
    box.send_keys(query)
    compare = drv.find_element("id", "compare")
    if (query_b is not None) != compare.is_selected():
        compare.click()
    if query_b is not None:
        other = drv.find_element("id", "query-b")
        other.clear()
        other.send_keys(query_b)
    drv.find_element("css selector", "#search-form button[type=submit]").click()
    wait_js(drv, "return document.getElementById('results').dataset.done")


IMAGES_LOADED = """const imgs = Array.from(document.querySelectorAll(arguments[0] + ' .card img'));
return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0) ? imgs.length : 0;"""


def test_search_page_german_japanese_and_compare(
    browser: Any, site: LiveServer, catalogue: Catalogue
) -> None:
    browser.get(site.url + "/")
    record = catalogue.records[3]
    german, japanese = record.captions["de"][0], record.captions["ja"][0]

    search_in_page(browser, german)
    n = wait_js(browser, IMAGES_LOADED, ".panel")
    assert n == 24
    assert browser.find_element("css selector", ".panel .lang").get_attribute("data-code") == "de"
    assert "total" in browser.find_element("css selector", ".panel .timings").text
    shot(browser, "search-de.png")

    search_in_page(browser, japanese)
    n = wait_js(browser, IMAGES_LOADED, ".panel")
    assert n == 24
    assert browser.find_element("css selector", ".panel .lang").get_attribute("data-code") == "ja"
    shot(browser, "search-ja.png")

    # Compare mode: the shared items are exactly the intersection of the two API answers.
    search_in_page(browser, german, japanese)
    panels = browser.find_elements("css selector", ".panel")
    assert [p.get_attribute("data-side") for p in panels] == ["a", "b"]
    with httpx.Client(base_url=site.url, timeout=30) as client:
        answers = [
            client.post("/v1/search", json={"query": q, "top_k": 24, "rerank": False}).json()
            for q in (german, japanese)
        ]
    ids = [[h["id"] for h in a["results"]] for a in answers]
    shared = set(ids[0]) & set(ids[1])
    assert shared, "the same intent in two languages should share items"
    for side, side_ids in zip(("a", "b"), ids, strict=True):
        cards = browser.execute_script(
            "return Array.from(document.querySelectorAll(`.panel[data-side='${arguments[0]}'] .card`))"
            ".map(c => [c.dataset.id, c.classList.contains('shared')])",
            side,
        )
        assert [c[0] for c in cards] == side_ids
        assert {c[0] for c in cards if c[1]} == shared
    summary = browser.find_element("id", "shared-summary").text
    assert summary.startswith(f"{len(shared)} of 24 items shared")
    shot(browser, "search-compare.png")


def test_search_page_runs_a_shared_link(browser: Any, site: LiveServer, catalogue: Catalogue) -> None:
    record = catalogue.records[5]
    query = record.captions["de"][0]
    browser.get(site.url + "/?" + urlencode({"q": query, "lang": "de"}))
    # No typing and no click: the page fills the form in and searches on load.
    wait_js(browser, "return document.getElementById('results').dataset.done")
    wait_js(browser, IMAGES_LOADED, ".panel")
    assert browser.find_element("id", "query").get_attribute("value") == query
    assert not browser.find_element("id", "compare-row").is_displayed()  # compare mode off
    assert browser.execute_script("return document.getElementById('lang').value") == "de"
    lang = browser.find_element("css selector", ".panel .lang")
    assert lang.get_attribute("data-code") == "de" and "hint" in lang.text  # the hint was sent
    with httpx.Client(base_url=site.url, timeout=30) as client:
        answer = client.post("/v1/search", json={"query": query, "lang": "de", "top_k": 24, "rerank": False})
    expected = [h["id"] for h in answer.json()["results"]]
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('.panel .card')).map(c => c.dataset.id)"
    )
    assert cards == expected and record.id in cards
    shot(browser, "search-shared-link.png")

    # A search typed in the page puts its own link in the address bar (hint cleared: auto).
    browser.execute_script("document.getElementById('lang').value = ''")
    japanese = record.captions["ja"][0]
    search_in_page(browser, japanese)
    params = parse_qs(urlsplit(browser.current_url).query)
    assert params == {"q": [japanese]}

    # Without q the page waits for the shopper: nothing is searched on load (an on-load search would have
    # written "Searching…" synchronously, before the load event that get() waits for).
    browser.get(site.url + "/?lang=ja")
    assert browser.execute_script("return document.getElementById('results').childElementCount") == 0
    assert browser.execute_script("return location.search") == "?lang=ja"
    assert browser.execute_script("return document.getElementById('lang').value") == "ja"


def test_search_page_says_no_good_match(browser: Any, site: LiveServer, catalogue: Catalogue) -> None:
    """A query that matches nothing (its top label none) says so above its results, naming the query, and
    greys the results; an in-domain caption does not."""
    browser.get(site.url + "/")
    search_in_page(browser, "SELECT * FROM users")
    wait_js(browser, IMAGES_LOADED, ".panel")
    banner = browser.find_element("css selector", ".panel .no-match")
    assert banner.text.startswith("Nothing in the catalogue matches") and "SELECT * FROM users" in banner.text
    assert banner.find_element("css selector", "q").text == "SELECT * FROM users"  # as text, not markup
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('.panel .card')).map(c => c.dataset.match)"
    )
    assert labels and set(labels) <= {"none", "weak"}
    assert browser.execute_script("return document.querySelectorAll('.panel .card.none').length") > 0
    shot(browser, "search-no-good-match.png")

    search_in_page(browser, catalogue.records[5].captions["en"][0])
    wait_js(browser, IMAGES_LOADED, ".panel")
    assert not browser.find_elements("css selector", ".panel .no-match")
    first = browser.execute_script("return document.querySelector('.panel .card').dataset.match")
    assert first == "strong"


def test_api_docs_render_with_local_assets(browser: Any, site: LiveServer) -> None:
    """Swagger UI draws the API from the service's own copies of its assets (the browser reaches nothing
    else), under the docs page's Content-Security-Policy."""
    browser.get(site.url + "/docs")
    title = wait_js(
        browser,
        "const t = document.querySelector('.swagger-ui .info .title'); return t ? t.textContent : '';",
    )
    assert "ccrk-search" in title
    operations = wait_js(browser, "return document.querySelectorAll('.opblock').length;")
    assert operations >= 10
    shot(browser, "api-docs.png")


BRANDS = ["Oatly", "Arla", "Valio"]


@pytest.fixture(scope="module")
def shop_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A product index built by the real indexer (two photos a product, a title searched, brand, category
    and a price in euros, long care notes not searched), served with the page's price display set
    (CCRK_PAGE_CURRENCY)."""
    from ccrk_settings import DEFAULT_MODEL_DIR, Settings
    from indexer.build import build
    from synthetic.synth import SynthConfig, generate_catalogue

    tmp = tmp_path_factory.mktemp("shop-page")
    generate_catalogue(tmp / "cat", SynthConfig(seed=5, n_train=0, n_val=0, n_test=48, image_size=64))
    recs = [json.loads(line) for line in (tmp / "cat" / "test.jsonl").read_text().splitlines()]
    rows = [
        {
            "id": f"p{i}",
            "paths": [str(tmp / "cat" / recs[2 * i]["image"]), str(tmp / "cat" / recs[2 * i + 1]["image"])],
            "title": recs[2 * i]["captions"]["en"][0],
            "brand": BRANDS[i % 3],
            "category": recs[2 * i]["attributes"]["category"],
            "price": round(2.5 + 1.75 * i, 2),
            # Not searched, so offered as a facet by default, and too long to count: the page drops it.
            "notes": f"Care and origin of product {i}: " + "hand wash cold, dry flat, do not bleach. " * 8,
        }
        for i in range(24)
    ]
    (tmp / "products.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=tmp / "indexes",
        index_workers=1,
        rerank_policy_queries=0,
        text_fields=["title"],
    )
    build("shop", [tmp / "products.jsonl"], settings=settings)
    serve = make_settings(settings.index_root, index_name="shop", page_currency="EUR")
    with LiveServer(serve) as live:
        yield live


FACET_COUNTS = """return Object.fromEntries(Array.from(document.querySelectorAll('#facets .facet')).map(f =>
  [f.dataset.field, Array.from(f.querySelectorAll('label')).map(l =>
    [l.querySelector('.value').textContent, Number(l.querySelector('.count').textContent),
     l.querySelector('input').checked])]));"""


def test_search_page_facets_filter_and_update_their_counts(browser: Any, shop_site: LiveServer) -> None:
    query = "a red umbrella"
    browser.get(shop_site.url + "/")
    search_in_page(browser, query)
    wait_js(browser, IMAGES_LOADED, ".panel")
    assert browser.find_element("id", "facets").is_displayed()
    shown = browser.execute_script(FACET_COUNTS)
    assert list(shown) == ["brand", "category", "price"]
    with httpx.Client(base_url=shop_site.url, timeout=30) as client:
        api = client.post("/v1/search", json={"query": query, "top_k": 24, "facets": ["brand", "category"]})
        brand, category = api.json()["facets"]
        assert [(v, n) for v, n, _ in shown["brand"]] == [(v["value"], v["count"]) for v in brand["values"]]
        assert [(v, n) for v, n, _ in shown["category"]] == [
            (v["value"], v["count"]) for v in category["values"]
        ]
        # Prices: bands at round numbers over the relevant results' span, in euros; their counts add up.
        assert all("€" in label for label, _, _ in shown["price"]) and len(shown["price"]) >= 2
        assert sum(n for _, n, _ in shown["price"]) == brand["relevant"]
        cards = browser.execute_script(
            "return Array.from(document.querySelectorAll('.panel .card')).map(c => "
            "[c.dataset.id, c.querySelector('img').getAttribute('src'),"
            " c.querySelector('.price').textContent,"
            " (c.querySelector('.matched-photo') || {}).textContent || null])"
        )
        hits = {h["id"]: h for h in api.json()["results"]}
        for item_id, src, price, matched in cards:
            hit = hits[item_id]
            assert "photo=" not in src  # the product's first (catalogue) photo
            assert "€" in price  # an amount in the index's currency, not a bare number
            assert (matched is not None) == (hit["image_url"] != hit["images"][0])
        shot(browser, "search-facets.png")

        # Tick a brand: only its products, the other fields' counts narrowed, the brand's own kept whole.
        browser.execute_script("document.getElementById('results').removeAttribute('data-done')")
        browser.find_element(
            "css selector", "#facets .facet[data-field=brand] label[data-value=Arla] input"
        ).click()
        wait_js(browser, "return document.getElementById('results').dataset.done")
        wait_js(browser, IMAGES_LOADED, ".panel")
        narrowed = client.post(
            "/v1/search",
            json={
                "query": query,
                "top_k": 24,
                "facets": ["brand", "category"],
                "filters": {"brand": ["Arla"]},
            },
        ).json()
        ids = browser.execute_script(
            "return Array.from(document.querySelectorAll('.panel .card')).map(c => c.dataset.id)"
        )
        assert ids == [h["id"] for h in narrowed["results"]] and ids
        after = browser.execute_script(FACET_COUNTS)
        assert [(v, n) for v, n, _ in after["brand"]] == [(v, n) for v, n, _ in shown["brand"]]
        assert ("Arla", True) in [(v, ticked) for v, _, ticked in after["brand"]]
        assert [(v, n) for v, n, _ in after["category"]] == [
            (v["value"], v["count"]) for v in narrowed["facets"][1]["values"]
        ]
        assert sum(n for _, n, _ in after["price"]) == narrowed["facets"][1]["relevant"]
        shot(browser, "search-facets-ticked.png")


def test_a_link_to_action_searches_the_query_as_typed(browser: Any, shop_site: LiveServer) -> None:
    """The dashboard's link for a top 'none' query (``/?q=...&mode=text&typos=0&synonyms=false``) opens the
    search page with its controls set so, runs that search on load, and keeps them in the address bar."""
    query = "a red umbrela"
    browser.get(
        shop_site.url + "/?" + urlencode({"q": query, "mode": "text", "typos": 0, "synonyms": "false"})
    )
    wait_js(browser, "return document.getElementById('results').dataset.done")
    assert browser.execute_script("return document.getElementById('mode').value") == "text"
    assert browser.execute_script("return document.getElementById('typos').value") == "0"
    assert browser.execute_script("return document.getElementById('synonyms').checked") is False
    assert not browser.find_elements("css selector", ".corrected-query")  # not corrected: as typed
    params = parse_qs(urlsplit(browser.current_url).query)
    assert params == {"q": [query], "mode": ["text"], "typos": ["0"], "synonyms": ["false"]}
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('.panel .card')).map(c => c.dataset.id)"
    )
    with httpx.Client(base_url=shop_site.url, timeout=30) as client:
        body = {"query": query, "top_k": 24, "mode": "text", "typos": 0, "synonyms": False, "explain": True}
        api = client.post("/v1/search", json={**body, "rerank": False}).json()
        corrected = client.post("/v1/search", json={"query": query, "mode": "text", "top_k": 3}).json()
    assert cards == [h["id"] for h in api["results"]]
    assert corrected["corrected_query"] == "a red umbrella"  # what the 'typos' link shows instead
