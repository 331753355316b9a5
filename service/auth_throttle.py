"""Failed authentication throttled per client address: at most ``limit`` wrong keys (an unknown, revoked or
malformed API key, a wrong admin key) per address per ``window_s``, then every request of that address that
presents a key gets 429 with ``Retry-After`` until the window ends, a right key included (otherwise the one
200 among the 429s would still tell a guesser when a guess was right).

The count lives in Redis when ``CCRK_REDIS_URL`` is set (``INCR`` of ``<prefix>af:<address>``, expiring
``window_s`` after the first failure), so every process of ``--workers N`` counts the same failures; without
Redis, or for ``redis_retry_s`` after a Redis error (as ``service.ratelimit`` does), each process counts in
process. Only failures touch Redis: a process remembers an address it saw over the limit until its window
ends, and a request with a right key costs one dict lookup, no round trip. An address another process saw
over the limit is refused here at its next failure, so N processes check at most ``limit + N - 1`` wrong keys
of one address per window.

A failure is a key that was sent and did not authenticate; a request without any key is not counted (it
guesses nothing, and the routes that need a key answer it 401 as before).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

import redis
from cachetools import LRUCache

from service.cache import fail_fast_redis

log = logging.getLogger(__name__)

# KEYS[1] the address's failure counter; ARGV[1] the window in s. Answers {failures so far, seconds left}.
FAILURE_LUA = """
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('TTL', KEYS[1])
if n == 1 or ttl < 0 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
"""


class AuthThrottle:
    """``blocked(address)`` before a presented key is checked, ``failed(address)`` when it did not
    authenticate; both answer the seconds to wait (429) or None."""

    def __init__(
        self,
        *,
        limit: int,
        window_s: int = 60,
        redis_url: str | None,
        prefix: str,
        timeout_s: float,
        retry_s: float,
        addresses: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.prefix = prefix
        self.retry_s = retry_s
        self.clock = clock
        self._lock = threading.Lock()
        # Addresses over the limit, until when (the clock's time); LRU-bounded against address sprays.
        self._blocked: LRUCache[str, float] = LRUCache(maxsize=addresses)
        # The in-process count: address -> [failures, window end].
        self._local: LRUCache[str, list[float]] = LRUCache(maxsize=addresses)
        self._down_until = 0.0
        self._redis: redis.Redis | None = None
        self._script = None
        if redis_url:
            self._redis = fail_fast_redis(redis_url, timeout_s)
            self._script = self._redis.register_script(FAILURE_LUA)

    @property
    def backend(self) -> str:
        return "redis" if self._script is not None and self.clock() >= self._down_until else "memory"

    def blocked(self, address: str) -> int | None:
        """Seconds until ``address`` may try a key again; None when it may now."""
        with self._lock:
            until = self._blocked.get(address)
        if until is None:
            return None
        left = until - self.clock()
        if left <= 0:
            with self._lock:
                self._blocked.pop(address, None)
            return None
        return max(1, math.ceil(left))

    def failed(self, address: str) -> int | None:
        """Count one failure of ``address``: None while it is within the limit (answer 401), else the seconds
        to wait (answer 429). The failure that reaches the limit is still a 401; the next attempts are 429."""
        count, left = self._count(address)
        if count >= self.limit:
            with self._lock:
                self._blocked[address] = self.clock() + left
        if count > self.limit:
            return max(1, math.ceil(left))
        return None

    def _count(self, address: str) -> tuple[int, float]:
        if self._script is not None and self.clock() >= self._down_until:
            try:
                count, left = self._script(keys=[f"{self.prefix}af:{address}"], args=[str(self.window_s)])
                return int(count), float(left)
            except (redis.RedisError, OSError, ValueError) as exc:
                self._down_until = self.clock() + self.retry_s
                log.warning(
                    "redis error (%s: %s); failed authentications counted in process for %.1f s",
                    type(exc).__name__,
                    exc,
                    self.retry_s,
                )
        now = self.clock()
        with self._lock:
            entry = self._local.get(address)
            if entry is None or entry[1] <= now:
                entry = [0, now + self.window_s]
            entry[0] += 1
            self._local[address] = entry
            return int(entry[0]), entry[1] - now

    def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(redis.RedisError):
                self._redis.close()
