"""Lexical engines: the product's SQLite FTS5 channel against tantivy, on the same analysed terms (issue 23).

    python bench/lexical_engines.py --sizes 10000,100000,1000000 --grocery ../shared/data/grocery \\
        --out bench/results/lexical-engines-DATE.json

Both engines index the same terms (``store.text.lexical.analyze`` output, space-joined) and rank with BM25
(k1 = 1.2, b = 0.75):

- FTS5 exactly as the product: the build runs the ``lexical`` lines of ``store.products.channels``' schema
(the
  ``unicode61 remove_diacritics 2`` table and its vocabulary), the product's INSERT and ``optimize``; queries
  are ``store.text.lexical.match_expression`` with the product's ``SELECT rowid, bm25(lexical) ... ORDER BY
  rank
  LIMIT ?``. Up to ``--product-check-max`` values the product's own writer (``write_product_channels``) and
  reader (``ProductChannels.lexical``, n = 64; it asks for n x the values per product rows, at least 2n, and
  widens while they hold fewer than n products; the runs recorded before 27 Nov 2026 asked for
  max(8n, 200) = 512) are run too, timed, and checked to give the same top-64 scores as the mirror.
- tantivy: one text field (tokenizer ``whitespace``: no further analysis; frequencies, no positions) and a
  fast ``rowid`` field read back per hit (what the product needs); terms are folded as FTS5 folds them
  (``store.text.lexical.fold_diacritics``); an OR (``Should``) of term queries, top-N without counting; one
  writer thread.

Corpora: synthetic text values (6-12 terms each from a Zipf(s) vocabulary of 50k terms, seeded; queries of
1, 2 and 3 distinct terms drawn from the same distribution) at each ``--sizes``, and the shared grocery
catalogue (``--grocery``: title and description_en read as English, retailer_title and description_sv as
Swedish; queries derived from the data: product-type names and the first 1, 2, 3 words of each title and
retailer title, analysed in the field's language), skipped with a reason when absent.

Measured per engine and corpus: build seconds (wall and process CPU), bytes on disk, peak RSS growth during
the build (VmHWM, Linux); per query arity and LIMIT (64, 512): p50/p99/mean wall and thread CPU ms, one
thread, after a warm-up pass; top-64 agreement: overlap, overlap up to ties (a document of one engine's
top-64 counts when its score under the other engine's formula reaches that engine's 64th score), and
Spearman / Kendall tau-b of the two engines' scores over the shared documents. Each engine's scores are
also checked against BM25 computed here from the corpus (FTS5's IDF ln((N-n+0.5)/(n+0.5)), floored at
1e-6; tantivy's ln(1 + (N-n+0.5)/(n+0.5))): the ranking differences are explained by the formula. Prints a
JSON document, then a markdown table; not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from store.products import channels as product_store  # noqa: E402
from store.products.vectors import best_per_owner  # noqa: E402
from store.text.lexical import analyze, fold_diacritics, match_expression  # noqa: E402

try:
    import tantivy
except ImportError:  # pragma: no cover - a clear message, not a traceback
    tantivy = None

VOCAB = 50_000
K1, B = 1.2, 0.75
TOP = 64
LIMITS = (64, 512)
ARITIES = (1, 2, 3)
FTS5_SQL = "SELECT rowid, bm25(lexical) FROM lexical WHERE lexical MATCH ? ORDER BY rank LIMIT ?"
TANTIVY_HEAP = 128_000_000
Hits = tuple[np.ndarray, np.ndarray]  # (rows int64, scores float32, higher is better)


# -- memory ------------------------------------------------------------------------------------------------


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> int | None:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); the RSS now, kB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kb("VmRSS:")


def _peak_growth_mb(before_kb: int | None) -> float | None:
    peak = _status_kb("VmHWM:")
    return None if before_kb is None or peak is None else round((peak - before_kb) / 1024, 1)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- corpora -----------------------------------------------------------------------------------------------


def _term_name(rank: int) -> str:
    digits, n = "", rank
    while True:
        n, d = divmod(n, 26)
        digits = chr(ord("a") + d) + digits
        if n == 0:
            return "w" + digits


def synthetic(size: int, zipf_s: float, seed: int, queries: int) -> tuple[list[list[str]], dict]:
    """``size`` values of 6-12 Zipf-drawn terms; ``queries`` distinct-term queries per arity."""
    rng = np.random.default_rng(seed)
    names = [_term_name(i) for i in range(VOCAB)]
    p = 1.0 / np.arange(1, VOCAB + 1) ** zipf_s
    p /= p.sum()
    cdf = np.cumsum(p)
    lengths = rng.integers(6, 13, size)
    ids = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), VOCAB - 1)
    docs, at = [], 0
    for n in lengths.tolist():
        docs.append([names[i] for i in ids[at : at + n].tolist()])
        at += n
    qs: dict[int, list[list[str]]] = {}
    for k in ARITIES:
        qs[k] = []
        while len(qs[k]) < queries:
            drawn = np.minimum(np.searchsorted(cdf, rng.random(k)), VOCAB - 1).tolist()
            if len(set(drawn)) == k:
                qs[k].append([names[i] for i in drawn])
    return docs, qs


def grocery(folder: Path) -> tuple[list[list[str]], dict, dict]:
    """The catalogue's text values analysed in their field's language; derived queries by word count."""
    fields = {"title": "en", "description_en": "en", "retailer_title": "sv", "description_sv": "sv"}
    rows = [json.loads(line) for line in (folder / "products.jsonl").read_text("utf-8").splitlines() if line]
    docs = [analyze(r[f], lang) for r in rows for f, lang in fields.items() if (r.get(f) or "").strip()]
    docs = [d for d in docs if d]
    raw: list[tuple[str, str]] = [(r["product_type"].replace("_", " "), "en") for r in rows]
    for r in rows:
        for f, lang in (("title", "en"), ("retailer_title", "sv")):
            words = (r.get(f) or "").split()
            raw += [(" ".join(words[:n]), lang) for n in ARITIES if len(words) >= n]
    qs: dict[int, list[list[str]]] = {k: [] for k in ARITIES}
    seen: set[tuple[str, ...]] = set()
    for text, lang in raw:
        terms = list(dict.fromkeys(analyze(text, lang)))
        if 1 <= len(terms) <= 3 and tuple(terms) not in seen:
            seen.add(tuple(terms))
            qs[len(terms)].append(terms)
    info = {"products": len(rows), "fields": fields, "derived_queries": {k: len(v) for k, v in qs.items()}}
    return docs, qs, info


# -- engines -----------------------------------------------------------------------------------------------


class Fts5:
    name = "fts5"

    def __init__(self, folder: Path) -> None:
        self.db = folder / "lexical.sqlite"
        self.con: sqlite3.Connection | None = None

    def build(self, docs: Sequence[Sequence[str]]) -> None:
        # The product's own DDL for the lexical channel (the lines of its schema that name it).
        ddl = "\n".join(line for line in product_store._SCHEMA.splitlines() if "lexical" in line)
        con = sqlite3.connect(self.db)
        try:
            con.executescript(ddl)
            con.executemany(
                "INSERT INTO lexical(rowid, terms) VALUES (?, ?)",
                ((i, " ".join(terms)) for i, terms in enumerate(docs)),
            )
            con.execute("INSERT INTO lexical(lexical) VALUES ('optimize')")
            con.commit()
        finally:
            con.close()

    def open(self) -> None:
        self.con = sqlite3.connect(f"file:{self.db}?mode=ro&immutable=1", uri=True, check_same_thread=False)

    def bytes(self) -> int:
        return self.db.stat().st_size

    def search(self, terms: Sequence[str], limit: int) -> Hits:
        assert self.con is not None
        found = self.con.execute(FTS5_SQL, (match_expression(terms), limit)).fetchall()
        return np.asarray([r for r, _ in found], np.int64), np.asarray([-s for _, s in found], np.float32)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()


class Tantivy:
    name = "tantivy"

    def __init__(self, folder: Path) -> None:
        self.dir = folder / "tantivy"
        self.dir.mkdir()
        builder = tantivy.SchemaBuilder()
        builder.add_text_field("terms", stored=False, tokenizer_name="whitespace", index_option="freq")
        builder.add_integer_field("rowid", stored=False, indexed=False, fast=True)
        self.schema = builder.build()
        self.index = tantivy.Index(self.schema, path=str(self.dir))
        self.searcher: Any = None
        self.segments = 0

    def build(self, docs: Sequence[Sequence[str]]) -> None:
        writer = self.index.writer(heap_size=TANTIVY_HEAP, num_threads=1)
        for i, terms in enumerate(docs):
            writer.add_document(tantivy.Document(terms=" ".join(map(fold_diacritics, terms)), rowid=i))
        writer.commit()
        writer.wait_merging_threads()

    def open(self) -> None:
        self.index.reload()
        self.searcher = self.index.searcher()
        self.segments = int(self.searcher.num_segments)

    def bytes(self) -> int:
        return _dir_bytes(self.dir)

    def query(self, terms: Sequence[str]) -> Any:
        queries = [tantivy.Query.term_query(self.schema, "terms", fold_diacritics(t), "freq") for t in terms]
        if len(queries) == 1:
            return queries[0]
        return tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in queries])

    def search(self, terms: Sequence[str], limit: int) -> Hits:
        hits = self.searcher.search(self.query(terms), limit, count=False).hits
        rows = self.searcher.fast_field_values("rowid", [a for _, a in hits]) if hits else []
        return np.asarray(rows, np.int64), np.asarray([s for s, _ in hits], np.float32)

    def close(self) -> None:
        self.searcher = None


# -- BM25 computed here (the explanation) --------------------------------------------------------------------


class Reference:
    """BM25 from the corpus itself, with each engine's IDF."""

    def __init__(self, docs: Sequence[Sequence[str]]) -> None:
        self.docs = [[fold_diacritics(t) for t in d] for d in docs]
        self.df = Counter(t for d in self.docs for t in set(d))
        self.n = len(self.docs)
        self.avgdl = sum(len(d) for d in self.docs) / max(self.n, 1)

    def idf(self, term: str, engine: str) -> float:
        n = self.df.get(term, 0)
        ratio = (self.n - n + 0.5) / (n + 0.5)
        return max(math.log(ratio), 1e-6) if engine == "fts5" else math.log(1.0 + ratio)

    def score(self, row: int, terms: Sequence[str], engine: str) -> float:
        doc = self.docs[row]
        norm = K1 * (1 - B + B * len(doc) / self.avgdl)
        total = 0.0
        for t in map(fold_diacritics, terms):
            tf = doc.count(t)
            if tf:
                total += self.idf(t, engine) * tf * (K1 + 1) / (tf + norm)
        return total


# -- measurements --------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 4) if values else float("nan")


def latency(search: Callable[[Sequence[str], int], Any], queries: list[list[str]], limit: int) -> dict:
    for q in queries:  # warm-up: pages cached, code paths hot
        search(q, limit)
    wall, cpu = [], []
    for q in queries:
        w0, c0 = time.perf_counter(), time.thread_time()
        search(q, limit)
        c1, w1 = time.thread_time(), time.perf_counter()
        wall.append((w1 - w0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
    return {
        "queries": len(queries),
        "wall_p50_ms": _pct(wall, 50), "wall_p99_ms": _pct(wall, 99),
        "wall_mean_ms": round(float(np.mean(wall)), 4) if wall else None,
        "thread_cpu_p50_ms": _pct(cpu, 50), "thread_cpu_p99_ms": _pct(cpu, 99),
    }  # fmt: skip


def agreement(fts: Fts5, tan: Tantivy, ref: Reference, queries: list[list[str]]) -> dict:
    """Top-64 agreement between the engines, and each engine's scores against BM25 computed here."""
    overlap, tie_overlap, spear, kend, err = [], [], [], [], {"fts5": 0.0, "tantivy": 0.0}
    boundary_ties = 0
    for q in queries:
        (fr, fs), (tr, ts) = fts.search(q, TOP), tan.search(q, TOP)
        for engine, rows, scores in (("fts5", fr, fs), ("tantivy", tr, ts)):
            for r, s in zip(rows[:8].tolist(), scores[:8].tolist(), strict=True):
                expect = ref.score(r, q, engine)
                err[engine] = max(err[engine], abs(s - expect) / max(abs(expect), 1e-9))
        k = min(TOP, fr.size, tr.size)
        if k == 0:
            continue
        shared = np.intersect1d(fr[:k], tr[:k])
        overlap.append(shared.size / k)
        # Up to ties: FTS5's top-k documents tantivy's formula scores at least as high as tantivy's k-th.
        kth, in_tantivy = float(ts[k - 1]), set(tr[:k].tolist())
        reach = sum(
            r in in_tantivy or ref.score(r, q, "tantivy") >= kth * (1 - 1e-5) for r in fr[:k].tolist()
        )
        tie_overlap.append(reach / k)
        boundary_ties += int(fs.size > k and math.isclose(fs[k - 1], fs[k], rel_tol=1e-6))
        if shared.size >= 3:
            f_at = {r: s for r, s in zip(fr.tolist(), fs.tolist(), strict=True)}
            t_at = {r: s for r, s in zip(tr.tolist(), ts.tolist(), strict=True)}
            a, b = [f_at[r] for r in shared.tolist()], [t_at[r] for r in shared.tolist()]
            if len(set(a)) > 1 and len(set(b)) > 1:
                spear.append(float(stats.spearmanr(a, b).statistic))
                kend.append(float(stats.kendalltau(a, b).statistic))
    mean = lambda xs: round(float(np.mean(xs)), 4) if xs else None  # noqa: E731
    return {
        "queries": len(queries),
        "overlap_at_64": mean(overlap),
        "overlap_at_64_up_to_ties": mean(tie_overlap),
        "fts5_queries_tied_at_64th": boundary_ties,
        "spearman_shared": mean(spear),
        "kendall_tau_b_shared": mean(kend),
        "rank_correlation_queries": len(spear),
        "max_rel_error_vs_bm25_here": {e: float(f"{v:.3g}") for e, v in err.items()},
    }


def product_check(docs: Sequence[Sequence[str]], fts: Fts5, queries: list[list[str]], tmp: Path) -> dict:
    """The product's writer and reader over the same values (one product per value): build time and the
    channel's latency at n = 64 (SQL LIMIT 512, best per product), its top-64 scores against the mirror."""
    stage = tmp / "version"
    stage.mkdir()
    f = len(docs)
    info = product_store.ProductInfo(fields=["title"], text_languages=["und"], language_counts={"und": f},
                                     photos=0, texts=f)  # fmt: skip
    photos = product_store.PhotoRows(np.zeros(0, np.int64), [], np.zeros((0, 1), np.float32))
    texts = product_store.TextRows(np.arange(f, dtype=np.int64), ["title"] * f, ["und"] * f, [""] * f,
                                   [list(d) for d in docs], np.zeros((f, 1), np.float32))  # fmt: skip
    t0 = time.perf_counter()
    product_store.write_product_channels(stage, info, photos, texts, exact_max=f + 1)
    write_s = time.perf_counter() - t0
    channels = product_store.ProductChannels(stage, f)
    try:
        same = 0
        for q in queries:
            hits = channels.lexical(q, TOP, None)
            rows, scores = fts.search(q, max(8 * TOP, 200))
            mirror = best_per_owner(rows, scores, rows)
            same += int(
                np.allclose(hits.scores, mirror.scores[:TOP]) and set(hits.owners) == set(mirror.owners[:TOP])
            )
        lat = latency(lambda q, n: channels.lexical(q, n, None), queries, TOP)
    finally:
        channels.close()
        shutil.rmtree(stage, ignore_errors=True)
    return {"write_product_channels_s": round(write_s, 2), "same_top64_as_mirror": f"{same}/{len(queries)}",
            "lexical_n64_latency": lat}  # fmt: skip


def run_corpus(
    label: str, docs: list[list[str]], queries: dict[int, list[list[str]]], tmp: Path, product_max: int
) -> dict:
    out: dict[str, Any] = {"corpus": label, "values": len(docs),
                           "terms_per_value": round(sum(map(len, docs)) / max(len(docs), 1), 2)}  # fmt: skip
    folder = tmp / label
    folder.mkdir()
    engines = [Fts5(folder), Tantivy(folder)]
    try:
        for engine in engines:
            before = _reset_peak()
            w0, c0 = time.perf_counter(), time.process_time()
            engine.build(docs)
            build = {
                "build_s": round(time.perf_counter() - w0, 3),
                "build_process_cpu_s": round(time.process_time() - c0, 3),
                "build_peak_rss_growth_mb": _peak_growth_mb(before),
                "bytes": engine.bytes(),
            }
            engine.open()
            if isinstance(engine, Tantivy):
                build["segments"] = engine.segments
            out[engine.name] = {"build": build, "latency": {}}
            print(f"[{label}] {engine.name} built: {build}", file=sys.stderr, flush=True)
        ref = Reference(docs)
        # Queries' document frequencies: how much each engine has to score.
        df = {k: [sum(ref.df.get(fold_diacritics(t), 0) for t in q) for q in qs] for k, qs in queries.items()}
        out["query_postings_p50"] = {k: int(np.median(v)) if v else 0 for k, v in df.items()}
        for k, qs in queries.items():
            for limit in LIMITS:
                for engine in engines:
                    out[engine.name]["latency"][f"{k}-term LIMIT {limit}"] = latency(engine.search, qs, limit)
            print(f"[{label}] {k}-term timed", file=sys.stderr, flush=True)
        every = [q for qs in queries.values() for q in qs]
        out["agreement"] = {
            f"{k}-term": agreement(engines[0], engines[1], ref, qs) for k, qs in queries.items()
        }
        if len(docs) <= product_max:
            out["product_path"] = product_check(docs, engines[0], every, tmp)
    finally:
        for engine in engines:
            engine.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def conclusion(corpora: list[dict], budget_ms: float) -> dict:
    """The choice, by a rule stated beforehand: tantivy only when, at the largest synthetic size, the
    product's query (3 terms, LIMIT 512) costs FTS5 over ``budget_ms`` at p50 and tantivy at least 3x less;
    otherwise FTS5 (it ships with Python: no dependency)."""
    synth = [c for c in corpora if c["corpus"].startswith("synthetic")]
    if not synth:
        return {"choice": None, "why": "no synthetic corpus measured"}
    big = max(synth, key=lambda c: c["values"])
    key = "3-term LIMIT 512"
    f, t = big["fts5"], big["tantivy"]
    f50, t50 = f["latency"][key]["wall_p50_ms"], t["latency"][key]["wall_p50_ms"]
    f99, t99 = f["latency"][key]["wall_p99_ms"], t["latency"][key]["wall_p99_ms"]
    speedup = f50 / t50 if t50 else float("inf")
    choice = "tantivy" if f50 > budget_ms and speedup >= 3 else "fts5"
    facts = (
        f"at {big['values']:,} values, {key}: FTS5 p50 {f50:.2f} ms / p99 {f99:.2f} ms, tantivy p50 "
        f"{t50:.2f} ms / p99 {t99:.2f} ms ({speedup:.1f}x); build FTS5 {f['build']['build_s']} s "
        f"{f['build']['bytes'] / 1e6:.1f} MB, tantivy {t['build']['build_s']} s "
        f"{t['build']['bytes'] / 1e6:.1f} MB; "
        f"top-64 overlap (3-term) {big['agreement']['3-term']['overlap_at_64']}"
    )
    why = (
        "FTS5 scores every posting of every query term before ORDER BY rank (cost grows with the terms' "
        "document frequency: Zipfian queries hit long lists); tantivy's top-k skips blocks (block-max WAND) "
        f"and reads the row ids from a fast field. Rule: tantivy when FTS5's p50 exceeds {budget_ms} ms and "
        "tantivy is >= 3x faster, else FTS5, which ships with Python (tantivy: a ~5 MB Rust wheel, 17 MB "
        "installed, MIT, one more pinned dependency and on-disk format to carry)."
    )
    return {"choice": choice, "facts": facts, "why": why}


def _table(result: dict) -> str:
    lines = [
        "| corpus | engine | build s | MB on disk | build RSS +MB | 1-term p50/p99 ms | 2-term p50/p99 ms "
        "| 3-term p50/p99 ms | 3-term LIMIT 512 p50/p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["corpora"]:
        for name in ("fts5", "tantivy"):
            e = c[name]
            lat = e["latency"]
            cell = {key: f"{v['wall_p50_ms']:.3f} / {v['wall_p99_ms']:.3f}" for key, v in lat.items()}
            lines.append(
                f"| {c['corpus']} ({c['values']:,}) | {name} | {e['build']['build_s']} "
                f"| {e['build']['bytes'] / 1e6:.1f} | {e['build']['build_peak_rss_growth_mb']} "
                f"| {cell['1-term LIMIT 64']} | {cell['2-term LIMIT 64']} | {cell['3-term LIMIT 64']} "
                f"| {cell['3-term LIMIT 512']} |"
            )
    lines += [
        "",
        "| corpus | arity | overlap@64 | up to ties | Spearman | Kendall tau-b |",
        "|---|---|---|---|---|---|",
    ]
    for c in result["corpora"]:
        for arity, a in c["agreement"].items():
            lines.append(
                f"| {c['corpus']} ({c['values']:,}) | {arity} | {a['overlap_at_64']} "
                f"| {a['overlap_at_64_up_to_ties']} | {a['spearman_shared']} | {a['kendall_tau_b_shared']} |"
            )
    c = result.get("conclusion", {})
    lines += ["", f"Conclusion: {c.get('choice')}: {c.get('facts', '')}. {c.get('why', '')}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="Synthetic corpus sizes, comma-separated.")
    parser.add_argument("--queries", type=int, default=200, help="Queries per arity (synthetic).")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the vocabulary.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grocery", type=Path, default=ROOT.parent / "shared" / "data" / "grocery")
    parser.add_argument("--product-check-max", type=int, default=100_000)
    parser.add_argument("--tmp", type=Path, default=None, help="Where the indexes are built (then removed).")
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=1.0,
        help="The lexical channel's share of a hybrid query (p50), for the conclusion.",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if tantivy is None:
        print("bench/lexical_engines.py needs tantivy (a dependency of the product): make install",
              file=sys.stderr)  # fmt: skip
        return 2

    started = time.time()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="ccrk-lexical-", dir=args.tmp))
    corpora, skipped = [], {}
    try:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            t0 = time.perf_counter()
            docs, qs = synthetic(size, args.zipf, args.seed, args.queries)
            print(
                f"[synthetic {size}] drawn in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True
            )
            corpora.append(run_corpus(f"synthetic-{size}", docs, qs, tmp, args.product_check_max))
            del docs
        if (args.grocery / "products.jsonl").is_file():
            docs, qs, info = grocery(args.grocery)
            corpora.append(run_corpus("grocery", docs, qs, tmp, args.product_check_max) | {"grocery": info})
        else:
            skipped["grocery"] = f"{args.grocery}/products.jsonl absent"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result: dict[str, Any] = {
        "benchmark": "lexical_engines",
        "command": "python bench/lexical_engines.py " + " ".join(sys.argv[1:]),
        "setup": {
            "sqlite": sqlite3.sqlite_version,
            "tantivy": getattr(tantivy, "__version__", "0.27.0"),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "synthetic": {
                "vocabulary": VOCAB,
                "zipf_s": args.zipf,
                "terms_per_value": "6-12 uniform",
                "queries_per_arity": args.queries,
                "seed": args.seed,
            },
            "bm25": {"k1": K1, "b": B},
            "top": TOP,
            "limits": list(LIMITS),
            "tantivy_writer": {"heap_bytes": TANTIVY_HEAP, "threads": 1, "index_option": "freq"},
            "fts5": "product schema: fts5(terms, tokenize='unicode61 remove_diacritics 2'), detail=full",
            "seconds": None,
        },
        "skipped": skipped,
        "corpora": corpora,
    }
    result["conclusion"] = conclusion(corpora, args.budget_ms)
    result["setup"]["seconds"] = round(time.time() - started, 1)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    table = _table(result)
    print("\n" + table)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
