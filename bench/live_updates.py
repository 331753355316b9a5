"""Live catalogue benchmark (issue 46): product writes through the API of a real ``ccrk serve --workers 2``
on loopback, and what pending changes cost the searches.

The version: N synthetic products written through ``store.version.writer.VersionWriter`` without encoding
images,
each with one photo vector and one or two text values (``title``, and ``subtitle`` for half of them) made of
a small vocabulary (the synthetic catalogue's patterns, colours and categories), analysed as
``store.text.lexical.analyze`` does and written through ``store.products.channels.write_product_channels``
(photo and
text vectors, terms, tantivy), so hybrid search works. The vectors sit around the demo model's text
embeddings of the distinct text values (cosine ~0.9: photo and text vectors of a product near its title),
so real text queries land among the products that name what they ask for. Metadata: ``category`` (40
values), ``price`` (float), ``in_stock`` (bool). The main index: HNSW32 (efConstruction 200, as ``ccrk
index build``), efSearch 64 fixed (not tuned: the searches' relative cost is what is measured here). The
fusion is a fixed logistic one (products.py's cost model), not calibrated. The re-rank store is a sparse
all-zero file of the demo model's shape (re-ranking is off).

Served as ``ccrk serve --workers 2`` (CCRK_THREADS=1, CCRK_SEARCH_WORKERS=1, CCRK_RERANK=false, no result
cache). Measured per size:

1. partial updates: PATCH of random products' ``price`` (10 %: also ``in_stock``), wait=true (both
   workers show it when it answers), from one client and from 4 concurrent clients (threads, a keep-alive
   connection each), writes/s and latency; at an empty log and again after 10,000 pending changes;
2. visibility in the other worker: a PATCH ``{"rev": k}`` through a connection to worker A, then searches
   with ``filters: {"rev": k}`` through a connection to worker B until the product shows (write answer ->
   visible in B), and the delta of ``ccrk_live_apply_lag_seconds`` over that phase (``/metrics`` sums both
   processes: the writer's own application and the other's poll);
3. server CPU per hybrid query (the processes' CPU over a fixed batch sent closed-loop by 2 clients, over
   the batch's size), plain and with ``filters: {"in_stock": true}``, with 0, 1,000 and 10,000 pending
   changes (90 % price / in_stock patches, 10 % deletes of random products), once both workers applied
   them (``ccrk_live_applied_sequence``, the laggard's); and the idle server's CPU per second (the live
   pollers' cost apart from the queries).

4. upserts: PUT of new products with one photo each (a 96 x 96 JPEG) and a title, wait=true, from 1 and 4
   clients (upserts/s and latency: the writer embeds each product before it answers), and the time until
   the other worker shows one (it embeds it at its poll).

The fold of pending changes into a new version is ``bench/live_fold.py``.

    python bench/live_updates.py --products 10000,100000 --out bench/results/live-updates-DATE.json

Prints JSON and a table; not a test. Over 400 lines because it is one self-contained script (the version,
the server, the clients and the report in one file to read).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ccrk_settings import DEFAULT_MODEL_DIR  # noqa: E402
from indexer.ann import HNSW_EF_CONSTRUCTION, HNSW_M  # noqa: E402
from store.layout import FORMAT_VERSION  # noqa: E402
from store.live import changelog_path  # noqa: E402
from store.products.channels import PhotoRows, ProductInfo, TextRows, write_product_channels  # noqa: E402
from store.products.hybrid import FusionModel  # noqa: E402
from store.text.lexical import analyze  # noqa: E402
from store.version.manifest import IndexManifest, model_fingerprint, model_name_of  # noqa: E402
from store.version.versions import current_version  # noqa: E402
from store.version.writer import VersionWriter  # noqa: E402
from synthetic.attributes import CATEGORIES, COLOURS, PATTERNS  # noqa: E402

ADMIN = "bench-admin-key"
DIM, TOKENS, WIDTH = 128, 65, 128  # the demo model's embedding and re-rank store shapes
SPREAD = 0.5  # noise norm relative to the unit centre: cosine ~0.9 to the text value's embedding
EF_SEARCH = 64
ADJECTIVES = ("classic", "large", "small", "new")
FUSION = {  # products.py's cost model: logistic, equal weights (nothing calibrated)
    "method": "logistic",
    "languages": ["en"],
    "hybrid": {"other": {"weights": [1] * 4}},
    "text": {"other": {"weights": [1] * 3}},
}
CPU_TARGET_RATIO = 1.10  # issue 46: at most +10 % CPU per hybrid query with 10k pending changes


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def vocabulary() -> tuple[list[str], list[str]]:
    """The distinct titles ("striped red mug") and subtitles ("red mug classic")."""
    cats = [c.replace("_", " ") for c in CATEGORIES]
    titles = [f"{p} {c} {k}" for p in PATTERNS for c in COLOURS for k in cats]
    subtitles = [f"{c} {k} {a}" for c in COLOURS for k in cats for a in ADJECTIVES]
    return titles, subtitles


def build_version(root: Path, n: int, seed: int = 0) -> tuple[str, dict[str, Any]]:
    """Version ``live{n}`` under ``root`` (reused when published already); its name and build timings."""
    name = f"live{n}"
    if current_version(root, name):
        return name, {"reused": True}
    from model.runtime import load_encoder

    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    titles, subtitles = vocabulary()
    encoder = load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=os.cpu_count() or 1)
    values = titles + subtitles
    centres = unit(
        np.concatenate([encoder.encode_text(values[i : i + 64]).embeds for i in range(0, len(values), 64)])
    )
    assert centres.shape[1] == DIM, centres.shape

    def near(idx: np.ndarray) -> np.ndarray:
        return unit(centres[idx] + rng.normal(0, SPREAD / np.sqrt(DIM), (idx.size, DIM)).astype(np.float32))

    title_of = rng.integers(0, len(titles), n)
    has_sub = rng.random(n) < 0.5
    sub_of = len(titles) + rng.integers(0, len(subtitles), n)
    photos = near(title_of)
    # Text values grouped by product row: title, then subtitle where there is one.
    t_owner = np.repeat(np.arange(n), 1 + has_sub.astype(np.int64))
    first = np.ones(t_owner.size, bool)
    first[1:] = t_owner[1:] != t_owner[:-1]
    t_value = np.where(first, title_of[t_owner], sub_of[t_owner])
    texts = [values[v] for v in t_value]
    fields = ["title" if f else "subtitle" for f in first]
    terms_of = {v: analyze(values[v], "en") for v in np.unique(t_value).tolist()}
    t_vectors = near(t_value)
    timings: dict[str, Any] = {"vectors_s": round(time.perf_counter() - t_start, 1)}
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    with VersionWriter(root, name) as writer:
        with writer.arrays(n, DIM, tokens=TOKENS, width=WIDTH, zero_rerank=True) as arrays:
            arrays.append(photos)
        t0 = time.perf_counter()
        index = faiss.IndexHNSWFlat(DIM, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(photos)
        index.hnsw.efSearch = EF_SEARCH
        writer.write_index(index)
        timings["main_hnsw_s"] = round(time.perf_counter() - t0, 1)
        price = np.round(rng.uniform(1, 200, n), 2)
        stock = rng.random(n) < 0.7
        writer.write_metadata(
            (
                i,
                f"p{i:07d}",
                None,
                {"category": f"cat{i % 40:02d}", "price": float(price[i]), "in_stock": bool(stock[i])},
                False,
            )
            for i in range(n)
        )
        t0 = time.perf_counter()
        FusionModel.from_dict(FUSION)  # checked as the service will read it
        info = ProductInfo(
            fields=["title", "subtitle"],
            text_languages=["en"],
            language_counts={"en": len(texts)},
            photos=0,
            texts=0,
            fusion=FUSION,
        )
        write_product_channels(
            writer.stage,
            info,
            PhotoRows(np.arange(n, dtype=np.int64), [f"p{i:07d}.jpg" for i in range(n)], photos),
            TextRows(
                t_owner.astype(np.int64),
                fields,
                ["en"] * len(texts),
                texts,
                [terms_of[v] for v in t_value.tolist()],
                t_vectors,
            ),
        )
        timings["channels_s"] = round(time.perf_counter() - t0, 1)
        manifest = IndexManifest(
            format_version=FORMAT_VERSION,
            name=name,
            version=writer.version,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            model_name=model_name_of(DEFAULT_MODEL_DIR),
            model_fingerprint=model_fingerprint(DEFAULT_MODEL_DIR),
            embed_dim=DIM,
            preprocessing={},
            count=n,
            index_factory=f"HNSW{HNSW_M}",
            search_params={"efSearch": EF_SEARCH},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=timings["main_hnsw_s"],
            skipped=[],
            checksums={},
            rerank={"dtype": "fp16", "tokens": TOKENS, "width": WIDTH, "bytes_per_image": TOKENS * WIDTH * 2},
            parent_version=None,
            total_rows=n,
        )
        writer.finish(manifest, checksums=False)
    timings["total_s"] = round(time.perf_counter() - t_start, 1)
    return name, timings


def queries(n: int = 400) -> list[str]:
    """Real captions of the synthetic catalogue in its ten languages (first phrasing, shortened a bit)."""
    from synthetic.synth import SynthConfig, iter_items

    out: list[str] = []
    for item in iter_items("test", SynthConfig(seed=3, n_train=0, n_val=0, n_test=n // 10 + 1)):
        for texts in item.captions.values():
            out.append(" ".join(texts[0].split()[:8]))
    return out[:n]


# -- the server and its connections --------------------------------------------------------------------------


class Conn:
    """A keep-alive connection to the server (whichever process the kernel gave it)."""

    def __init__(self, port: int) -> None:
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.pid = 0

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"X-API-Key": ADMIN, "Content-Type": "application/json"}
        self.http.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = self.http.getresponse()
        data = answer.read()
        if answer.headers.get_content_type() == "application/json":
            return answer.status, json.loads(data) if data else None
        return answer.status, data.decode()

    def close(self) -> None:
        self.http.close()


def per_process(port: int, want: int = 2) -> list[Conn]:
    """One keep-alive connection to each server process (new connections until each pid is reached)."""
    found: dict[int, Conn] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(found) < want:
        conn = Conn(port)
        try:
            ready = conn.call("GET", "/readyz")[0] == 200
            conn.pid = int(conn.call("GET", "/healthz")[1]["pid"])
        except OSError:
            time.sleep(0.2)
            continue
        if not ready or conn.pid in found:
            conn.close()
            time.sleep(0.05)
        else:
            found[conn.pid] = conn
    if len(found) < want:
        raise SystemExit(f"reached {len(found)} of {want} server processes")
    return list(found.values())


def serve(
    root: Path,
    name: str,
    port: int,
    tmp: Path,
    own_session: bool = False,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``ccrk serve --workers 2`` of version ``name``; ``own_session``: in a session of its own (one
    ``killpg`` reaches the supervisor and its workers), its stderr dropped (a killed worker's broken
    pipes); ``extra_env``: more settings (``bench/search_analytics.py``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        {
            "CCRK_THREADS": "1",
            "CCRK_SEARCH_WORKERS": "1",
            "CCRK_RERANK": "false",
            "CCRK_ADMIN_API_KEY": ADMIN,
            "CCRK_ANN_SAMPLE_RATE": "0",
            "CCRK_HISTORY_DB": str(tmp / f"history-{port}.sqlite"),
            "CCRK_AUTH_FAILURES_PER_MINUTE": "100000",
            "CCRK_CACHE_SIZE": "0",  # the same queries are sent at every pending level
            "CCRK_INDEX_POLL_S": "3600",
            **(extra_env or {}),
        }
    )
    script = Path(sys.executable).parent / "ccrk"
    ccrk = [str(script)] if script.is_file() else [sys.executable, "-m", "ccrk_cli"]
    command = [*ccrk, "serve", "--port", str(port), "--workers", "2", "--index-root", str(root)]
    return subprocess.Popen(
        [*command, "--index-name", name, "--log-level", "warning"],
        env=env,
        cwd=REPO,
        start_new_session=own_session,
        stderr=subprocess.DEVNULL if own_session else None,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def fresh_log(root: Path, name: str) -> None:
    """No change log: the version as built (every run starts from an empty log)."""
    path = changelog_path(root, name)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live children (the workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(c) for c in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def metric_samples(port: int, prefix: str) -> dict[str, float]:
    """``/metrics`` samples whose name starts with ``prefix`` (the sum over both processes, whichever
    answers)."""
    conn = Conn(port)
    try:
        status, text = conn.call("GET", "/metrics")
    finally:
        conn.close()
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def applied_sequence(port: int) -> int:
    got = metric_samples(port, "ccrk_live_applied_sequence")
    return int(min(got.values())) if got else 0


def wait_applied(port: int, seq: int, timeout: float = 120) -> float:
    """Seconds until both processes show ``seq`` (the gauge is the laggard's)."""
    start = time.monotonic()
    while applied_sequence(port) < seq:
        if time.monotonic() - start > timeout:
            raise SystemExit(f"the workers did not apply sequence {seq} within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


# -- writes --------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values) * 1000, q)), 2) if values else float("nan")


def write_load(port: int, clients: int, seconds: float, ids: np.ndarray, seed: int) -> dict[str, Any]:
    """PATCH of random products' price (10 %: also in_stock), wait=true, ``clients`` threads for
    ``seconds``; writes/s and latency."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[int] = []
    last_seq = [0] * clients
    start = threading.Barrier(clients + 1)
    until = [0.0]

    def client(c: int) -> None:
        rng = np.random.default_rng(seed * 100 + c)
        conn = Conn(port)
        conn.call("GET", "/healthz")
        start.wait()
        while time.perf_counter() < until[0]:
            pid = ids[rng.integers(0, ids.size)]
            fields: dict[str, Any] = {"price": round(float(rng.uniform(1, 200)), 2)}
            if rng.random() < 0.1:
                fields["in_stock"] = bool(rng.random() < 0.5)
            t0 = time.perf_counter()
            status, body = conn.call("PATCH", f"/v1/products/p{pid:07d}?wait=true", {"fields": fields})
            lat[c].append(time.perf_counter() - t0)
            if status != 200:
                errors.append(status)
            else:
                last_seq[c] = max(last_seq[c], body["seq"])
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    until[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    all_lat = [x for per in lat for x in per]
    return {
        "clients": clients,
        "writes": len(all_lat),
        "errors": len(errors),
        "writes_per_s": round(len(all_lat) / elapsed, 1),
        "p50_ms": pct(all_lat, 50),
        "p99_ms": pct(all_lat, 99),
        "last_seq": max(last_seq),
    }


def bulk_changes(
    port: int, count: int, patch_ids: np.ndarray, delete_ids: list[int], touched: set[int], seed: int
) -> dict[str, Any]:
    """``count`` changes from 4 clients, wait=false: 90 % patches (price, 30 % of them in_stock too) of
    random products, 10 % deletes (taken from ``delete_ids``, products never patched)."""
    rng = np.random.default_rng(seed)
    plan: list[tuple[str, str, Any]] = []
    for _ in range(count):
        if rng.random() < 0.1 and delete_ids:
            gone = delete_ids.pop()
            touched.add(gone)
            plan.append(("DELETE", f"/v1/products/p{gone:07d}?wait=false", None))
        else:
            fields: dict[str, Any] = {"price": round(float(rng.uniform(1, 200)), 2)}
            if rng.random() < 0.3:
                fields["in_stock"] = bool(rng.random() < 0.5)
            pid = int(patch_ids[rng.integers(0, patch_ids.size)])
            touched.add(pid)
            plan.append(("PATCH", f"/v1/products/p{pid:07d}?wait=false", {"fields": fields}))
    errors: list[int] = []
    seqs: list[int] = []
    lock = threading.Lock()

    def client(part: list[tuple[str, str, Any]]) -> None:
        conn = Conn(port)
        for method, path, body in part:
            status, answer = conn.call(method, path, body)
            with lock:
                if status == 200:
                    seqs.append(answer["seq"])
                else:
                    errors.append(status)
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(plan[c::4],)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {
        "changes": count,
        "deletes": sum(1 for m, _, _ in plan if m == "DELETE"),
        "errors": len(errors),
        "seconds": round(elapsed, 1),
        "writes_per_s": round(count / elapsed, 1),
        "last_seq": max(seqs, default=0),
    }


def visibility(
    port: int, a: Conn, b: Conn, writes: int, ids: np.ndarray, titles: dict[int, str]
) -> dict[str, Any]:
    """PATCH {"rev": k} through A (wait=true), then search B with filters {"rev": k} until it shows (write
    answer -> the first answer of B showing it: includes one search's latency)."""
    before = metric_samples(port, "ccrk_live_apply_lag_seconds_bucket")
    lags: list[float] = []
    polls: list[int] = []
    missing = 0
    rng = np.random.default_rng(7)
    for k in range(1, writes + 1):
        # A random pause first: written right after the last one showed, each write would fall just after
        # B's poll (every CCRK_LIVE_POLL_S) and wait the whole period; paused, it falls anywhere in it.
        time.sleep(float(rng.uniform(0.0, 0.2)))
        pid = int(ids[k % ids.size])
        status, receipt = a.call("PATCH", f"/v1/products/p{pid:07d}", {"fields": {"rev": k}})
        assert status == 200 and receipt["visible"], receipt
        answered = time.perf_counter()
        body = {"query": titles[pid], "top_k": 5, "mode": "hybrid", "min_score": -1.0, "filters": {"rev": k}}
        n = 0
        while True:
            n += 1
            status, found = b.call("POST", "/v1/search", body)
            if status == 200 and any(h["id"] == f"p{pid:07d}" for h in found["results"]):
                lags.append(time.perf_counter() - answered)
                polls.append(n)
                break
            if time.perf_counter() - answered > 5:
                missing += 1
                break
    after = metric_samples(port, "ccrk_live_apply_lag_seconds_bucket")
    buckets = {
        key.split('le="')[1].split('"')[0]: int(after[key] - before.get(key, 0.0))
        for key in after
        if 'le="' in key
    }
    return {
        "writes": writes,
        "not_visible_within_5_s": missing,
        "p50_ms": pct(lags, 50),
        "p99_ms": pct(lags, 99),
        "max_ms": pct(lags, 100),
        "mean_searches_until_visible": round(statistics.fmean(polls), 2) if polls else None,
        "apply_lag_histogram_delta_both_processes": buckets,
    }


def photo_jpeg(rng: np.random.Generator, size: int = 96) -> bytes:
    """A small JPEG of random coloured blocks: one new product's photo."""
    from PIL import Image

    blocks = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(np.kron(blocks, np.ones((size // 8, size // 8, 1), np.uint8)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85)
    return out.getvalue()


def upserts(port: int, a: Conn, b: Conn, clients: int, count: int, titles: list[str]) -> dict[str, Any]:
    """PUT of new products with one photo each (wait=true): ``count`` per client over ``clients`` threads
    (writes/s and latency, which includes this process's embedding of the product), then, one at a time,
    a PUT through A and searches of B with a filter on its sku until it shows (B embeds it at its poll)."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[Any] = []

    def body(rng: np.random.Generator, sku: str) -> dict[str, Any]:
        title = titles[int(rng.integers(0, len(titles)))]
        photo = base64.b64encode(photo_jpeg(rng)).decode()
        return {"fields": {"title": title, "sku": sku, "price": 9.5}, "photos": [{"data": photo}]}

    def client(c: int) -> None:
        rng = np.random.default_rng(500 + c)
        conn = Conn(port)
        for k in range(count):
            sku = f"new-{clients}-{c}-{k}"
            t0 = time.perf_counter()
            status, answer = conn.call("PUT", f"/v1/products/{sku}", body(rng, sku))
            lat[c].append(time.perf_counter() - t0)
            if status != 200:
                errors.append((status, answer))
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    every = [x for per in lat for x in per]
    a.close()
    b.close()
    a, b = per_process(port)  # afresh: the server closed them while idle through the clients' phase
    rng = np.random.default_rng(9)
    lags: list[float] = []
    missing = 0
    for k in range(20):
        time.sleep(float(rng.uniform(0.0, 0.2)))
        sku = f"lag-{clients}-{k}"
        status, receipt = a.call("PUT", f"/v1/products/{sku}", body(rng, sku))
        assert status == 200 and receipt["visible"], receipt
        answered = time.perf_counter()
        query = {"query": "new", "top_k": 1, "mode": "hybrid", "min_score": -1.0, "filters": {"sku": sku}}
        while True:
            status, found = b.call("POST", "/v1/search", query)
            if status == 200 and found["results"]:
                lags.append(time.perf_counter() - answered)
                break
            if time.perf_counter() - answered > 5:
                missing += 1
                break
    return {
        "clients": clients,
        "upserts": len(every),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "upserts_per_s": round(len(every) / elapsed, 1),
        "p50_ms": pct(every, 50),
        "p99_ms": pct(every, 99),
        "visible_in_other_worker_p50_ms": pct(lags, 50),
        "visible_in_other_worker_max_ms": pct(lags, 100),
        "not_visible_within_5_s": missing,
    }


# -- query CPU -----------------------------------------------------------------------------------------------


def query_batch(port: int, bodies: list[dict[str, Any]], every: bool = False) -> tuple[int, int, float]:
    """Every body once (``every``: once through each connection), closed loop over two connections, one to
    each server process: (answered, errors, seconds)."""
    conns = per_process(port)
    ok = [0] * len(conns)
    bad = [0] * len(conns)

    def client(c: int) -> None:
        for body in bodies if every else bodies[c :: len(conns)]:
            status, _ = conns[c].call("POST", "/v1/search", body)
            if status == 200:
                ok[c] += 1
            else:
                bad[c] += 1
        conns[c].close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(ok), sum(bad), time.perf_counter() - t0


def query_cpu(
    proc: subprocess.Popen[bytes], port: int, texts: list[str], repeats: int, warm: bool
) -> dict[str, Any]:
    """Server CPU ms per query, plain hybrid and filtered {"in_stock": true}; each batch ``repeats`` times
    (the median reported), after a warm-up; and the idle server's CPU per second."""
    out: dict[str, Any] = {}
    t0, c0 = time.perf_counter(), tree_cpu_s(proc.pid)
    time.sleep(3.0)
    out["idle_cpu_ms_per_s"] = round((tree_cpu_s(proc.pid) - c0) * 1000 / (time.perf_counter() - t0), 2)
    kinds = {
        "hybrid": [{"query": q, "top_k": 20, "mode": "hybrid"} for q in texts],
        "hybrid_in_stock": [
            {"query": q, "top_k": 20, "mode": "hybrid", "filters": {"in_stock": True}} for q in texts
        ],
    }
    for kind, bodies in kinds.items():
        # Warm-up: the first query of each language loads its analysers (~1 s of CPU each, in each
        # process), so at the first level every query goes through both processes once.
        query_batch(port, bodies, every=True) if warm else query_batch(port, bodies[:40])
        runs = []
        for _ in range(repeats):
            c0 = tree_cpu_s(proc.pid)
            ok, bad, seconds = query_batch(port, bodies)
            cpu = tree_cpu_s(proc.pid) - c0
            runs.append(
                {
                    "queries": ok,
                    "errors": bad,
                    "qps": round(ok / seconds, 1),
                    "cpu_ms_per_query": round(cpu * 1000 / max(ok + bad, 1), 3),
                }
            )
        out[kind] = {
            "cpu_ms_per_query": round(statistics.median(r["cpu_ms_per_query"] for r in runs), 3),
            "runs": runs,
        }
    return out


# -- one size ------------------------------------------------------------------------------------------------


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def measure(args: argparse.Namespace, n: int, texts: list[str], tmp: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"products": n, "loadavg_before": loadavg()}
    t_size = time.perf_counter()
    name, build = build_version(args.root, n)
    result["build"] = build
    print(f"[{n}] version {name}: {build}", file=sys.stderr, flush=True)
    titles_list, _ = vocabulary()
    rng = np.random.default_rng(1)
    order = rng.permutation(n)
    delete_ids = order[: n // 5].tolist()  # deletes come from here; patches, writes and lag from the rest
    patch_ids = order[n // 5 :]
    lag_ids = patch_ids[:400]
    # The titles the version gave them (build_version's draw, repeated): the lag searches name the product.
    title_of = np.random.default_rng(0).integers(0, len(titles_list), n)
    titles = {int(i): titles_list[title_of[i]] for i in lag_ids}
    fresh_log(args.root, name)
    proc = serve(args.root, name, args.port, tmp)
    a = b = None
    try:
        a, b = per_process(args.port)
        result["pids"] = [proc.pid, a.pid, b.pid]
        result["writes_empty_log"] = [
            write_load(args.port, c, args.write_seconds, patch_ids, seed=c) for c in (1, 4)
        ]
        print(f"[{n}] writes: {result['writes_empty_log']}", file=sys.stderr, flush=True)
        a.close()
        b.close()
        a, b = per_process(args.port)  # afresh: the server closes idle keep-alive connections
        result["visibility"] = visibility(args.port, a, b, args.lag_writes, lag_ids, titles)
        print(f"[{n}] visibility: {result['visibility']}", file=sys.stderr, flush=True)
        if args.upserts:
            result["upserts_one_photo"] = [
                upserts(args.port, a, b, c, args.upserts // c, titles_list) for c in (1, 4)
            ]
            print(f"[{n}] upserts: {result['upserts_one_photo']}", file=sys.stderr, flush=True)
    finally:
        for conn in (a, b):
            if conn is not None:
                conn.close()
        stop(proc)
    # The query CPU at each pending level in one server, on a fresh log (the writes above would count).
    fresh_log(args.root, name)
    proc = serve(args.root, name, args.port, tmp)
    try:
        for conn in per_process(args.port):  # both processes ready
            conn.close()
        result["cpu"] = {"0": query_cpu(proc, args.port, texts, args.repeats, True) | {"pending": 0}}
        print(f"[{n}] cpu at 0 pending: {result['cpu']['0']}", file=sys.stderr, flush=True)
        result["bulk"] = []
        pending = 0
        touched: set[int] = set()
        for level in (1000, 10000):
            bulk = bulk_changes(args.port, level - pending, patch_ids, delete_ids, touched, seed=level)
            bulk["applied_wait_s"] = round(wait_applied(args.port, bulk["last_seq"]), 2)
            bulk["distinct_products_changed"] = len(touched)
            pending = level
            result["bulk"].append(bulk)
            print(f"[{n}] bulk to {level}: {bulk}", file=sys.stderr, flush=True)
            result["cpu"][str(level)] = query_cpu(proc, args.port, texts, args.repeats, False) | {
                "pending": level,
                "pending_gauge": metric_samples(args.port, "ccrk_live_pending_changes"),
            }
            print(f"[{n}] cpu at {level}: {result['cpu'][str(level)]}", file=sys.stderr, flush=True)
        result["writes_10k_pending"] = [
            write_load(args.port, c, args.write_seconds, patch_ids, seed=10 + c) for c in (1, 4)
        ]
        print(f"[{n}] writes at 10k: {result['writes_10k_pending']}", file=sys.stderr, flush=True)
    finally:
        stop(proc)
    base = result["cpu"]["0"]
    for level in result["cpu"].values():
        for kind in ("hybrid", "hybrid_in_stock"):
            level[kind]["ratio_to_0_pending"] = round(
                level[kind]["cpu_ms_per_query"] / base[kind]["cpu_ms_per_query"], 3
            )
    result["hybrid_10k_within_target"] = (
        result["cpu"]["10000"]["hybrid"]["ratio_to_0_pending"] <= CPU_TARGET_RATIO
    )
    result["loadavg_after"] = loadavg()
    result["seconds"] = round(time.perf_counter() - t_size, 1)
    return result


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def print_table(report: dict[str, Any]) -> None:
    print("\n| products | writes: clients | log | writes/s | p50 ms | p99 ms | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in report["sizes"]:
        for log, rows in (("empty", r["writes_empty_log"]), ("10k pending", r["writes_10k_pending"])):
            for w in rows:
                print(
                    f"| {r['products']:,} | {w['clients']} | {log} | {w['writes_per_s']} | {w['p50_ms']} | "
                    f"{w['p99_ms']} | {w['errors']} |"
                )
    print(
        "\n| products | visibility in the other worker: writes | p50 ms | p99 ms | max ms | not seen in 5 s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in report["sizes"]:
        v = r["visibility"]
        print(
            f"| {r['products']:,} | {v['writes']} | {v['p50_ms']} | {v['p99_ms']} | {v['max_ms']} | "
            f"{v['not_visible_within_5_s']} |"
        )
    print("\n| products | upserts (one photo): clients | upserts/s | p50 ms | p99 ms | other worker ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in report["sizes"]:
        for u in r.get("upserts_one_photo", []):
            print(
                f"| {r['products']:,} | {u['clients']} | {u['upserts_per_s']} | {u['p50_ms']} | "
                f"{u['p99_ms']} | p50 {u['visible_in_other_worker_p50_ms']}, "
                f"max {u['visible_in_other_worker_max_ms']} |"
            )
    print(
        "\n| products | pending | hybrid CPU ms/query (x 0 pending)"
        " | in_stock filter CPU ms/query (x 0 pending) | idle server CPU ms/s |"
    )
    print("| --- | --- | --- | --- | --- |")
    for r in report["sizes"]:
        for level, c in r["cpu"].items():
            h, f = c["hybrid"], c["hybrid_in_stock"]
            print(
                f"| {r['products']:,} | {int(level):,} | {h['cpu_ms_per_query']} "
                f"({h['ratio_to_0_pending']}) | {f['cpu_ms_per_query']} ({f['ratio_to_0_pending']}) | "
                f"{c['idle_cpu_ms_per_s']} |"
            )
    for r in report["sizes"]:
        print(
            f"{r['products']:,}: load average before {r['loadavg_before']}, after {r['loadavg_after']};"
            f" {r['seconds']} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--products", default="10000,100000", help="catalogue sizes, comma-separated")
    parser.add_argument("--root", type=Path, default=REPO / "artifacts" / "bench-indexes")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--queries", type=int, default=400, help="queries per CPU batch")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each CPU batch (median reported)")
    parser.add_argument("--write-seconds", type=float, default=5.0)
    parser.add_argument("--lag-writes", type=int, default=200)
    parser.add_argument("--upserts", type=int, default=200, help="new products with a photo, per phase")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = queries(args.queries)
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/live_updates.py " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "server": "ccrk serve --workers 2; CCRK_THREADS=1 CCRK_SEARCH_WORKERS=1 CCRK_RERANK=false "
        "CCRK_CACHE_SIZE=0 CCRK_ANN_SAMPLE_RATE=0; CCRK_LIVE_POLL_S default (0.1 s); SQLite change log",
        "version": "synthetic: 1 photo vector and 1-2 text values per product (title; subtitle for half), "
        "vectors around the demo model's text embeddings of those values; main index HNSW32 "
        f"efConstruction 200, efSearch {EF_SEARCH} (not tuned); channels as store.products.channels "
        "writes them (HNSW-SQ fp16 over 4,096 rows); fixed logistic fusion (not calibrated)",
        "not_measured": ["the fold of pending changes into a new version (bench/live_fold.py measures it)"],
        "target": f"hybrid query CPU with 10k pending <= {CPU_TARGET_RATIO} x with 0 pending (issue 46)",
        "sizes": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.products.split(",")):
            report["sizes"].append(measure(args, n, texts, Path(tmp)))
            if args.out:  # partial results of a long run
                args.out.write_text(json.dumps(report, indent=2) + "\n")
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print_table(report)


if __name__ == "__main__":
    main()
