"""The one settings object of ccrk-search: every process (indexer, service, probes) reads its configuration
here, from environment variables prefixed ``CCRK_`` (or a ``.env`` file), never from ``os.environ`` directly.

Command-line options override these per run; defaults are the embedded ones (default model, demo index,
in-process cache), so a fresh machine needs no configuration.

Over 400 lines because it is one flat list of every setting with its description, which the configuration
reference (``ccrk config reference``) is generated from; splitting it would split that one list.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _comma_list(value: object) -> object:
    """``title,description`` (an environment variable or a CLI option) as a list; a JSON list
    (``["title"]``) and lists pass through."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value  # not JSON after all: refused by the list type, naming the setting
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _field_names(names: list[str]) -> list[str]:
    """Manifest field names (base names: ``title``, not ``title@de``)."""
    for name in names:
        if not name or '"' in name or "@" in name or any(ord(c) < 32 for c in name):
            raise ValueError(f"{name!r} is not a field name (no quotes, '@' or control characters)")
    return names


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]
FieldNames = Annotated[CommaList, AfterValidator(_field_names)]
# A field name as the search API takes it in filters, facets and sort (service.schemas.FieldName).
REQUEST_FIELD = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"


def _request_fields(names: list[str]) -> list[str]:
    for name in names:
        if not re.fullmatch(REQUEST_FIELD, name):
            raise ValueError(f"{name!r} is not a field name a search can ask for (letters, digits, _ . -)")
    return names


RequestFieldNames = Annotated[CommaList, AfterValidator(_request_fields)]


def _on_off_auto(value: object) -> object:
    """``CCRK_INDEX_GPU``: ``auto``, ``on``, ``off``; the booleans it took before (``true``/``false``, 1/0,
    yes/no) are read as on and off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "1", "yes", "on", "t", "y"):
            return "on"
        if word in ("false", "0", "no", "off", "f", "n"):
            return "off"
        return word
    return value


IndexGpu = Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off_auto)]

# The embedded default model shipped inside the ``model`` package.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "model" / "pretrained" / "ccrk-demo"


class Settings(BaseSettings):
    """Settings shared by the indexer, the service and the probes (env prefix ``CCRK_``)."""

    # allow_inf_nan=False: every float setting is a duration, rate, share, CPU count or limit, and an inf
    # from the environment (CCRK_REDIS_TIMEOUT_S=inf) loaded and broke timeouts, rates and Retry-After at
    # run time, far from its cause; now refused at load, naming the variable (nan failed the bounds already;
    # this also covers floats added later). No setting needs inf for "no limit": the optional ones (key_rate,
    # gate_max_mrv) say it by being unset, the others (int8_max_recall_drop) take a large number.
    model_config = SettingsConfigDict(
        env_prefix="CCRK_", env_file=".env", extra="ignore", allow_inf_nan=False
    )

    # -- model ------------------------------------------------------------------------------------------
    model_dir: Path = Field(
        DEFAULT_MODEL_DIR, description="Model directory (config, weights, tokenizer, onnx/)."
    )
    backend: Literal["onnx", "torch"] = Field(
        "onnx", description="Encoder runtime; onnx never imports torch."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto uses CUDA when present.")
    threads: int = Field(2, ge=1, le=256, description="Intra-op threads of the encoder runtime.")
    rerank_threads: int = Field(
        2,
        ge=1,
        le=256,
        description="Intra-op threads of the fusion (re-ranking) graph, ONNX only: one re-rank scores 128"
        " pairs in one batch, which threads split; they sleep between re-ranks.",
    )
    int8: bool = Field(
        False, description="Use the int8 query and fusion graphs (ONNX only) if their cost is within limits."
    )
    int8_max_recall_drop: float = Field(
        0.5, ge=0.0, description="Most mean-recall points int8 may cost (`ccrk export int8-cost`)."
    )
    int8_max_mrv_increase: float = Field(0.05, ge=0.0, description="Most MRV increase int8 may cost.")

    # -- indexes ----------------------------------------------------------------------------------------
    index_root: Path = Field(Path("artifacts/indexes"), description="Root folder of all indexes.")
    index_name: str = Field("demo", description="Index the service serves (INDEX_ROOT/NAME/CURRENT).")
    extra_indexes: CommaList = Field(
        default_factory=list,
        description="Indexes `ccrk serve` serves beside index_name, at /v1/indexes/NAME/... with one model in"
        " memory (`--index-name a,b,c` sets index_name a and these b,c; `*`: every index under the root, as"
        " `--all`). The unprefixed routes stay index_name's.",
    )
    keep_versions: int = Field(
        3, ge=1, description="Approved versions kept per index (and at most as many gate-refused ones)."
    )
    max_bad_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="Build fails above this share of bad items."
    )
    target_recall: float = Field(
        0.95, gt=0.0, le=1.0, description="ANN recall@10 vs exact search to tune for."
    )
    exact_max_items: int = Field(50_000, ge=0, description="Collections up to this size get an exact index.")
    index_gpu: IndexGpu = Field(
        "auto",
        description="Where faiss trains and fills flat and IVF indexes (HNSW is built on the CPU either way;"
        " every index is served from its CPU form). auto: the GPU when faiss-gpu sees one and a one-vector"
        " self-test passes on it, else the CPU; on: the same, but a GPU that fails is warned about; off:"
        " always the CPU. A GPU build that fails midway (out of memory) is redone on the CPU, noted in the"
        " build report. true/false are read as on/off.",
    )
    memory_budget_mb: int = Field(4096, ge=1, description="Memory budget of the ANN index, drives its type.")
    rerank_dtype: Literal["fp16", "int8"] = Field("fp16", description="Storage of the re-rank patch tokens.")
    rerank_policy_queries: int = Field(
        300,
        ge=0,
        le=5000,
        description="Caption queries a build re-ranks in full to calibrate the adaptive re-rank policy (at"
        " most two per item; 300 cost the demo model ~13 CPU-seconds); 0: none, and the service re-ranks"
        " that version in full.",
    )
    index_batch_size: int = Field(64, ge=1, description="Images per encoder batch when indexing.")
    index_workers: int = Field(2, ge=0, description="Decode worker processes when indexing (0: in process).")
    shard_size: int = Field(2048, ge=1, description="Items per embedding shard (the unit of resume).")
    index_shards: int = Field(
        1,
        ge=1,
        le=256,  # every shard's arrays are open at once while a version is written: 2-3 files each
        description="Shards of a version written by a full build (item id hash modulo this; `add` and"
        " `delete` keep the parent's): for memory, not latency. 1: one unsharded version, as before.",
    )
    index_segment_max_dead: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="A rebuild whose change is small writes only a new segment with the new and changed"
        " items (the parent's files shared, its rows of changed or removed items marked deleted); once"
        " deleted rows would pass this share of all rows, or the change itself is larger, the build"
        " compacts (one unsharded version, ANN rebuilt from stored vectors, nothing encoded again)."
        " 0: always compact.",
    )
    index_max_segments: int = Field(
        8, ge=1, le=256, description="Segments a version may have before a rebuild compacts them into one."
    )
    max_image_pixels: int = Field(
        89_478_485, ge=1, description="Images with more pixels are skipped as decompression bombs."
    )
    text_fields: FieldNames = Field(
        default_factory=list,
        description="Manifest fields whose text is searched (products and hybrid search), comma-separated:"
        " `title` covers `title` and its language-tagged variants (`title@de`); every field still comes back"
        " in results' metadata. Empty: only images are searched, as before.",
    )
    follow_external_links: bool = Field(
        False,
        description="Index symbolic links in source folders that lead outside the folder (off: skipped and"
        " listed in the build report, so a folder cannot expose other files through the service).",
    )

    # -- distributed builds (Ray) ----------------------------------------------------------------------
    engine: Literal["local", "ray"] = Field(
        "local",
        description="Where `ccrk index build` and `add` encode their shards: local (this machine's decode"
        " workers and one encoder) or ray (Ray Data actors on every node of a Ray cluster, each loading the"
        " model once; needs the ray extra, and an index root every node reaches at the same path).",
    )
    ray_address: str | None = Field(
        None,
        description="With engine ray: the cluster's head (HOST:PORT, e.g. 10.0.0.5:6379); unset: RAY_ADDRESS,"
        " else the cluster `ray start` left on this machine, else a local Ray started for this run.",
    )
    ray_actors: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="With engine ray: encoder actors (each loads the model once); unset: as many as the"
        " cluster's CPUs hold at ray_cpus_per_actor each (one per GPU when the device is CUDA), at most one"
        " per shard still to encode.",
    )
    ray_cpus_per_actor: float | None = Field(
        None,
        gt=0.0,
        le=256.0,
        description="With engine ray: CPUs Ray reserves for each encoder actor (fractions allowed); unset:"
        " `threads`. With CUDA (device cuda, or auto on a cluster with GPUs) each actor also takes one GPU.",
    )

    # -- service ----------------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `ccrk serve` binds.")
    serve_engine: Literal["local", "ray"] = Field(
        "local",
        description="How `ccrk serve` serves: local (uvicorn on this machine) or ray (Ray Serve on the"
        " cluster of CCRK_RAY_ADDRESS: the app as ingress, one deployment per shard of a sharded version; see"
        " the README). Apart from CCRK_ENGINE: building on Ray never changes serving.",
    )
    port: int = Field(8000, ge=1, le=65535, description="Port `ccrk serve` binds.")
    page_facets: RequestFieldNames = Field(
        default_factory=list,
        description="Fields the search page offers as facets, comma-separated (at most 10). Empty: the"
        " served index's metadata fields that are not searched text fields (and not photo lists).",
    )
    page_price_field: str = Field(
        "price",
        pattern=REQUEST_FIELD,
        description="The metadata field the search page shows as each product's price (of the index the page"
        " searches: the process's index_name).",
    )
    page_currency: str | None = Field(
        None,
        pattern=r"^[A-Z]{3}$",
        description="ISO 4217 code of that index's prices (EUR, SEK, USD): the page shows them as amounts in"
        " this currency in the browser's locale. Unset: the price is shown with its field name, no currency.",
    )

    # -- serving on Ray (serve_engine ray) -------------------------------------------------------------
    ray_shard_replicas: int = Field(
        1,
        ge=1,
        le=256,
        description="With serve_engine ray: replicas of each shard's deployment. 2 or more: a replica (or"
        " node) that dies costs no failed request; more replicas: more queries/s per shard.",
    )
    ray_shard_cpus: float = Field(
        0.5, gt=0.0, le=256.0, description="With serve_engine ray: CPUs Ray reserves per shard replica."
    )
    ray_shard_memory_mb: int | None = Field(
        None,
        ge=1,
        description="With serve_engine ray: memory Ray reserves per shard replica: about twice the shard's"
        " index plus re-rank store (`ccrk index info`), as a replica holds the old and the new version"
        " during a swap; unset: none reserved.",
    )
    ray_max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="With serve_engine ray: at most this many replicas of one shard on one node (1: a"
        " node lost takes at most one replica of each shard); unset: Ray places them freely.",
    )
    ray_ingress_replicas: int = Field(
        1,
        ge=1,
        le=256,
        description="With serve_engine ray: replicas of the ingress (query encoding, re-ranking, merging).",
    )
    ray_ingress_cpus: float = Field(
        1.0, gt=0.0, le=256.0, description="With serve_engine ray: CPUs Ray reserves per ingress replica."
    )
    ray_shard_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="With serve_engine ray: times a shard call is sent again when the replica answering it"
        " died or is unreachable (another replica answers it).",
    )
    ray_shard_timeout_s: float = Field(
        30.0, gt=0.0, le=600.0, description="With serve_engine ray: limit of one shard call."
    )
    ray_serve_fast_path: bool = Field(
        True,
        description="With serve_engine ray, on a Ray that `ccrk serve` starts itself: HAProxy as the HTTP"
        " proxy and gRPC between deployments (RAY_SERVE_ENABLE_HA_PROXY, RAY_SERVE_USE_GRPC_BY_DEFAULT),"
        " measured faster per hop (bench/cluster_scaling.py). Ray then opens each replica's HTTP port on all"
        " interfaces (HAProxy on other nodes reaches them there) and HAProxy its stats ports 8404 and 9101:"
        " firewall them, or turn this off. A cluster started with `ray start` takes them from the environment"
        " of `ray start` on every node (see the README).",
    )
    redis_url: str | None = Field(
        None, description="Redis for caches and probe history; in-process if unset."
    )
    redis_timeout_s: float = Field(
        0.05, gt=0.0, description="Per-call Redis timeout; slower calls skip cache."
    )
    cache_size: int = Field(10_000, ge=0, description="Entries of each in-process LRU cache.")
    cache_ttl_s: int = Field(3600, ge=1, description="Lifetime of cached results in Redis.")
    rerank: bool = Field(True, description="Re-rank with the fusion encoder unless a request says otherwise.")
    rerank_k: int = Field(128, ge=1, le=512, description="Candidates re-ranked by default.")
    rerank_policy: Literal["adaptive", "full"] = Field(
        "adaptive",
        description="How many of a re-ranked query's rerank_k candidates the fusion encoder scores: "
        "'adaptive' decides per query from the dual encoder's score gaps, by thresholds calibrated on "
        "the index when it was built (none when the answer is clear; versions built without captions "
        "are re-ranked in full); 'full' always scores rerank_k.",
    )
    rerank_score: Literal["dual_plus_margin", "itm_logit"] = Field(
        "dual_plus_margin",
        description="How the shortlist is re-ordered: dual logit plus match log-odds (the product's), or the "
        "match logit alone (the paper's, to reproduce published numbers; needs a recent ONNX export).",
    )
    admin_api_key: str | None = Field(
        None,
        description="Key for /v1/admin/*; admin routes are off if unset. `ccrk serve` warns when it is"
        " shorter than 32 characters (e.g. `openssl rand -base64 32`).",
    )
    auth_failures_per_minute: int = Field(
        30,
        ge=1,
        le=100_000,
        description="Wrong API or admin keys one client address may send per minute (shared by every"
        " process through Redis, else counted per process); then every request of it sending a key gets 429"
        " with Retry-After until the minute is up. Behind a proxy every client has the proxy's address.",
    )
    search_requires_key: bool = Field(
        False,
        description="Search routes (search, image search, similar items, consistency) need an API key"
        " (`ccrk keys create`; `Authorization: Bearer KEY` or `X-API-Key: KEY`): 401 without one. Off:"
        " anonymous clients search too (limited per client address by anonymous_rate), and a key sent is"
        " still checked.",
    )
    keys_file: Path | None = Field(
        None,
        description="The API keys file (`ccrk keys`: ids, scopes, limits and SHA-256 digests, never the"
        " keys); unset: INDEX_ROOT/api-keys.json. Re-read within 0.5 s of a change (e.g. a mounted"
        " Kubernetes Secret).",
    )
    key_rate: float | None = Field(
        None,
        gt=0.0,
        description="Requests per second of an API key created without --rate (a token bucket per key, shared"
        " by every process through Redis); unset: no limit.",
    )
    key_burst: int | None = Field(
        None, ge=1, description="Bucket size of an API key created without --burst; unset: key_rate (1 s)."
    )
    anonymous_rate: float | None = Field(
        None,
        gt=0.0,
        description="Requests per second of each anonymous client address on the search routes; unset: no"
        " limit. Behind a proxy every client has the proxy's address.",
    )
    anonymous_burst: int | None = Field(
        None, ge=1, description="Bucket size of each anonymous client address; unset: anonymous_rate (1 s)."
    )
    max_concurrent_per_caller: int = Field(
        0,
        ge=0,
        le=1024,
        description="The most search slots (of search_workers) one caller (an API key, or an anonymous"
        " address) holds at once per process, even when the others are free. The slots are shared fairly"
        " without it: a search waiting for one (on the event loop, holding no thread; 429 after 10 s) gets"
        " the next one freed when its caller holds the fewest, so one client's burst queues behind itself"
        " instead of in front of everyone. 0: no cap (a lone caller may use every slot).",
    )
    max_expensive_per_caller: int = Field(
        0,
        ge=0,
        le=1024,
        description="Re-ranked or image searches one caller (an API key, or an anonymous address) may run at"
        " once per process; more get 429 with Retry-After at once. 0: no cap.",
    )
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins.")
    index_poll_s: float = Field(5.0, gt=0.0, description="How often the service looks for a new CURRENT.")
    live_dsn: str | None = Field(
        None,
        description="PostgreSQL address of the live catalogue's change log (`postgresql://user@host/db`), for"
        " API processes on several machines; unset: a SQLite file in each index's folder, shared by the"
        " processes of one machine.",
    )
    live_poll_s: float = Field(
        0.1,
        gt=0.0,
        le=5.0,
        description="How often each process reads the change log for products written by the others.",
    )
    live_wait_s: float = Field(
        5.0,
        gt=0.0,
        description="How long a write with wait=true waits for this process to show it, at most.",
    )
    max_upload_mb: int = Field(10, ge=1, description="Largest image accepted by /v1/search/image.")
    http_header_timeout_s: float = Field(
        10.0, gt=0.0, description="A connection must send its request head within this (else closed)."
    )
    http_body_timeout_s: float = Field(
        30.0, gt=0.0, description="Longest pause in a request body's bytes (else the connection is closed)."
    )
    http_body_total_s: float = Field(
        120.0,
        gt=0.0,
        description="Longest time a request body may take in all, pauses or not (else the connection is"
        " closed): 10 MB in 120 s is ~85 kB/s.",
    )
    http_max_head_bytes: int = Field(
        32 * 1024, ge=1024, description="Largest request line and headers together; larger ones get 431."
    )
    http_keep_alive_s: float = Field(5.0, gt=0.0, description="Idle keep-alive connections close after this.")
    max_connections: int = Field(
        1000, ge=1, description="Open connections and requests per process; beyond it new ones get 503."
    )
    max_connections_per_client: int = Field(
        100,
        ge=1,
        description="Open connections per process from one client address; beyond it new ones get 503."
        " Behind a proxy every client has the proxy's address: set it to max_connections there.",
    )
    max_connections_client_share: float = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description="Most of max_connections one client address may hold per process (slow bodies"
        " included), whatever max_connections_per_client says: with max_connections 20, 5. Behind a proxy"
        " every client has the proxy's address: set it to 1 there.",
    )
    max_query_pixels: int = Field(
        24_000_000,
        ge=10_000,
        description="Most pixels (width x height) of a query image; larger ones get a 413 before decoding.",
    )
    image_search_concurrency: int = Field(
        2,
        ge=1,
        description="Image searches decoding at once per process; more wait (up to image_wait_s, then 503).",
    )
    upload_memory_mb: int = Field(
        384,
        ge=16,
        description="Memory image searches may hold at once per process (uploads' bytes and their decodes,"
        " estimated from the header before decoding); more wait (up to image_wait_s, then 503 with"
        " Retry-After).",
    )
    image_wait_s: float = Field(
        10.0,
        gt=0.0,
        le=120.0,
        description="How long an image search waits for its share of upload_memory_mb, and then for a"
        " decoding slot, before a 503 with Retry-After.",
    )
    cache_prefix: str = Field("ccrk:", description="Prefix of every Redis key the service writes.")
    redis_retry_s: float = Field(
        1.0, gt=0.0, description="After a Redis error, serve without cache this long before trying again."
    )
    blas_threads: int = Field(
        1,
        ge=1,
        le=256,
        description=(
            "Threads of the BLAS pools (numpy's, faiss's) in the service. A query only does tiny matrix"
            " products there; more threads spin-wait between them and take CPU from other queries."
        ),
    )
    search_workers: int = Field(
        0,
        ge=0,
        le=256,
        description="Searches encoding and searching at once per process (worker threads of CPU-bound"
        " work; the fair share's slots). 0: the cores this process may use over the `--workers` processes,"
        " at most 4 (more searches at once than cores only slow each one: bench/fair_share.py, 2 cores, 16"
        " greedy connections: 4 slots 719 q/s and another caller's p99 x3.8, 2 slots 944 q/s and x2.1).",
    )

    def search_slots(self) -> int:
        """``search_workers``, or where 0 this process's share of the cores it may run on (its CPU affinity
        over the `ccrk serve --workers` processes), at most 4."""
        if self.search_workers:
            return self.search_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(4, cores // self.workers))

    inline_text_search: bool = Field(
        True,
        description=(
            "Answer a short text search (no re-ranking, no filters, an unsharded index without product"
            " channels, no Redis) on the event loop instead of handing it to a worker thread: its ~1 ms of"
            " work is shorter than what the hop costs under load (100k items, 32 clients: 1.95 -> 1.31 ms of"
            " server CPU per query, off -> on). Re-ranking, filters, products, image searches keep the worker"
            " threads."
        ),
    )
    huge_pages: bool = Field(
        True,
        description=(
            "Once started (and after each index swap), advise and collapse the process's large anonymous"
            " memory (model weights, ANN index, language tables) into transparent huge pages, where the"
            " kernel's THP mode is 'madvise': a search's random reads miss the TLB less (100k items, 32"
            " clients, 2 shared cores: ~1.7 -> ~1.4 ms of server CPU per query; RSS +9 MB). No effect"
            " where THP is off or not Linux."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Server processes of `ccrk serve` sharing the port (Python runs one thread at a time per process:"
            " one process tops out at ~1 core of request handling). Each loads the model and the index;"
            " metrics are summed over them; one of them runs the probes."
        ),
    )
    worker_dir: Path | None = Field(
        None,
        description=(
            "Set by `ccrk serve --workers N` for its processes (shared metrics files, the probe leader lock);"
            " not to be set by hand."
        ),
    )

    # -- monitoring: probes, history, live traffic, quality gate, alerts --------------------------------
    probe_set: Path | None = Field(
        None, description="Probe set jsonl the service runs ({id, target_ids, queries}); none: no probes."
    )
    probe_interval_min: float = Field(
        15.0, ge=0.0, description="Minutes between background probe runs (0: only after index swaps)."
    )
    probe_depth: int = Field(
        100, ge=10, le=200, description="Results fetched per probe query; a target below counts as this rank."
    )
    probe_pause_s: float = Field(
        0.01, ge=0.0, description="Pause between two background probe queries (keeps live latency)."
    )
    history_db: Path | None = Field(
        None,
        description="Probe and traffic history when no Redis is set; none: INDEX_ROOT/INDEX_NAME.monitoring"
        ".sqlite, one per served index (one file for the machine mixed the services' traffic).",
    )
    history_retention_days: float = Field(30.0, gt=0.0, description="Probe runs and traffic kept this long.")
    traffic_flush_s: float = Field(10.0, gt=0.0, description="How often live traffic aggregates are stored.")
    analytics: bool = Field(
        True,
        description="The query log of search analytics (INDEX.analytics.sqlite beside the monitoring history:"
        " history_db's folder, else INDEX_ROOT): each search's "
        "normalised text or photo digest, language, label and top products, a query_id in the response, and "
        "POST /v1/events; false: nothing is logged and no query_id is returned.",
    )
    analytics_retention_days: float = Field(
        30.0, gt=0.0, le=3650.0, description="Logged queries and events are kept this long."
    )
    analytics_max_rows: int = Field(
        2_000_000, ge=1_000, description="Most logged queries kept per index (the oldest go first)."
    )
    analytics_buffer: int = Field(
        10_000,
        ge=10,
        le=1_000_000,
        description="Queries a process holds before they are written (each analytics_flush_s); when full the "
        "oldest are dropped and counted (ccrk_analytics_dropped_total). A kill -9 loses at most these.",
    )
    analytics_flush_s: float = Field(
        1.0, gt=0.0, le=60.0, description="How often a process writes its buffered queries to the log."
    )
    dashboard_queries: bool = Field(
        False,
        description="Show shoppers' query texts on the public /dashboard (its search-analytics table: each "
        "language's top 'none' queries, with their links to the search page); false: only the rates, CTR and "
        "MRR there, the texts being at GET /v1/analytics (admin).",
    )
    analytics_event_window_s: float = Field(
        86_400.0,
        gt=0.0,
        description="How long after its search a query_id takes events (POST /v1/events); later: 422.",
    )
    ann_sample_rate: float = Field(
        0.02, ge=0.0, le=1.0, description="Share of live queries also searched exactly (live ANN recall)."
    )
    ann_sample_cpu_share: float = Field(
        0.02,
        gt=0.0,
        le=1.0,
        description="Most CPU (share of one core) live ANN samples may use; above it samples are skipped.",
    )
    gate_min_recall_at_10: float | None = Field(
        None, ge=0.0, le=1.0, description="Quality gate: every language's probe recall@10 at least this."
    )
    gate_max_mrv: float | None = Field(None, ge=0.0, description="Quality gate: probe MRV at most this.")
    gate_max_recall_drop: float | None = Field(
        None, ge=0.0, le=1.0, description="Quality gate: largest recall@10 drop of a language vs CURRENT."
    )
    gate_probe_size: int = Field(
        200, ge=1, description="Probes drawn from a captioned build when no probe_set is configured."
    )
    alert_mrv_max: float = Field(25.0, ge=0.0, description="Dashboard alert when probe MRV rises above this.")
    alert_recall_drop: float = Field(
        0.05, ge=0.0, le=1.0, description="Dashboard alert when a language's recall@10 drops more than this."
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()


@dataclass(frozen=True)
class SettingProblem:
    """One value the ``Settings`` model rejects: the field, pydantic's reason, and the value given."""

    field: str
    message: str
    value: object
    from_override: bool  # a command-line option (else the environment or .env)


class SettingsError(ValueError):
    """Settings that do not validate, from an override or from the environment, each problem by field."""

    def __init__(self, problems: list[SettingProblem], options: Mapping[str, str] | None = None) -> None:
        self.problems = tuple(problems)
        super().__init__(self.describe(options))

    @classmethod
    def from_validation(cls, exc: ValidationError, overrides: Mapping[str, object]) -> SettingsError:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            problems.append(SettingProblem(field, err["msg"], err.get("input"), field in overrides))
        return cls(problems)

    def describe(self, options: Mapping[str, str] | None = None) -> str:
        """One line per problem, named the way the user gave the value: the command-line option
        (``options`` maps a field to its flag, else ``--field-name``) or the ``CCRK_`` variable."""
        from ccrk_settings.reference import env_name, masked  # reference imports this module

        lines = []
        for p in self.problems:
            if p.from_override:
                where = (options or {}).get(p.field, "--" + p.field.replace("_", "-"))
            else:
                where = env_name(p.field)
            lines.append(f"{where}: {p.message} (got {masked(p.field, p.value)!r})")
        return "\n".join(lines)


def settings_with(overrides: Mapping[str, object], base: Settings | None = None) -> Settings:
    """The process's settings (or ``base``) with per-run overrides applied and validated like the
    environment is: the one way a command line changes settings.

    None values are left out (an option not given keeps the configured value). Raises ``SettingsError``
    naming every rejected field, whether its value came from ``overrides`` or from the environment;
    ``TypeError`` for a name that is no setting (a caller's typo would otherwise be ignored silently,
    as the model ignores extra keys)."""
    update = {key: value for key, value in overrides.items() if value is not None}
    unknown = sorted(set(update) - set(Settings.model_fields))
    if unknown:
        raise TypeError(f"not settings: {', '.join(unknown)}")
    if base is None:
        try:
            base = get_settings()
        except ValidationError as exc:  # the environment's own values: no option is to blame
            raise SettingsError.from_validation(exc, {}) from None
    try:
        # model_copy(update=...) would skip validation: a --threads 1000 would reach the runtime.
        return Settings.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        raise SettingsError.from_validation(exc, update) from None
