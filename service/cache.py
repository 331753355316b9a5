"""Caches of query embeddings and of result pages: Redis when ``CCRK_REDIS_URL`` is set, else in-process LRU.

Redis is an optimisation, never a dependency: every call has a short timeout (``redis_timeout_s``), an
error is counted, and after an error Redis is left alone for ``redis_retry_s`` before the next try
(redis-py reconnects by itself on that try), so a dead Redis costs one timeout per retry window, not one
per request. Meanwhile the in-process LRU serves: measured with a demo-catalogue load at 80 searches/s
(2 processes, re-ranking on), killing Redis without it pushed p50 latency from 5 ms to 5 s and growing
(uncached, the load exceeded what 2 cores re-rank).
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import redis
from cachetools import LRUCache
from redis.backoff import NoBackoff
from redis.retry import Retry

from model.runtime import EncodedTexts

log = logging.getLogger(__name__)

EMBEDDING = "embedding"
RESULT = "result"


def pack_texts(texts: EncodedTexts) -> bytes:
    """One encoded query -> bytes (np.save of each array; loading never unpickles)."""
    buffer = io.BytesIO()
    for array in (texts.embeds, texts.states, texts.mask):
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def unpack_texts(data: bytes) -> EncodedTexts:
    buffer = io.BytesIO(data)
    embeds, states, mask = (np.load(buffer, allow_pickle=False) for _ in range(3))
    return EncodedTexts(embeds, states, mask)


def fail_fast_redis(url: str, timeout_s: float) -> redis.Redis:
    """A Redis client that gives up within ``timeout_s`` and never retries: its callers keep their own
    back-off window (and an in-process fallback) instead of stalling a search on a dead server."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), retries=0),
        health_check_interval=0,
    )


class Cache:
    """Byte-valued get/set in two namespaces (``embedding``, ``result``), thread-safe."""

    def __init__(
        self,
        *,
        redis_url: str | None,
        prefix: str,
        size: int,
        ttl_s: int,
        timeout_s: float,
        retry_s: float,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._on_event = on_event or (lambda kind, namespace: None)
        self._lock = threading.Lock()
        self._lru: dict[str, LRUCache[str, bytes]] = {
            EMBEDDING: LRUCache(maxsize=max(size, 1)),
            RESULT: LRUCache(maxsize=max(size, 1)),
        }
        self._enabled = size > 0 or redis_url is not None
        self._redis: redis.Redis | None = None
        self._down_until = 0.0
        if redis_url:
            self._redis = fail_fast_redis(redis_url, timeout_s)

    @property
    def enabled(self) -> bool:
        """False when both caches are off (no Redis, LRU size 0): callers skip building keys and values."""
        return self._enabled

    @property
    def backend(self) -> str:
        return "redis" if self._redis is not None else "memory"

    def redis_available(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._down_until

    def get(self, namespace: str, key: str) -> bytes | None:
        if not self._enabled:
            return None
        value = None
        if self.redis_available():
            value = self._redis_call(lambda r: r.get(self.prefix + namespace + ":" + key))
        if value is None and not self.redis_available():  # no Redis, or it just failed: the local LRU
            value = self._lru_get(namespace, key)
        self._on_event("hit" if value is not None else "miss", namespace)
        return value

    def set(self, namespace: str, key: str, value: bytes) -> None:
        if not self._enabled:
            return
        if self.redis_available():
            self._redis_call(lambda r: r.set(self.prefix + namespace + ":" + key, value, ex=self.ttl_s))
        if not self.redis_available():
            with self._lock:
                self._lru[namespace][key] = value

    def _lru_get(self, namespace: str, key: str) -> bytes | None:
        with self._lock:
            return self._lru[namespace].get(key)

    def _redis_call(self, call: Callable[[redis.Redis], object]) -> bytes | None:
        client = self._redis
        if client is None or time.monotonic() < self._down_until:
            return None  # in the back-off window after an error: no cache, no waiting
        try:
            result = call(client)
        except (redis.RedisError, OSError) as exc:
            self._down_until = time.monotonic() + self.retry_s
            self._on_event("error", type(exc).__name__)
            log.warning("redis error (%s: %s); caching off for %.1f s", type(exc).__name__, exc, self.retry_s)
            return None
        return result if isinstance(result, bytes) else None

    def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(redis.RedisError):
                self._redis.close()
