"""Fair share: a token bucket per caller (an API key, or the client address of anonymous traffic) and its
daily quota (the caps on a caller's concurrent work are ``service.caller_slots``).

Buckets live in Redis when ``CCRK_REDIS_URL`` is set, so every process of ``--workers N`` (and every Ray
ingress replica) draws from the same bucket: one Lua script (``EVALSHA``, one round trip) refills, takes a
token, counts the daily quota and answers what the ``RateLimit-*`` headers need. Redis is never a
dependency: after an error the buckets are kept in process for ``redis_retry_s`` (as ``service.cache``
does), so a dead Redis costs one timeout per retry window, and each process then allows the limit on its
own (N processes: up to N times the rate). Daily quotas are also kept in the index root's state
(``service.quota_ledger``): the script never counts a quota below what that state knows, so a spent quota
stays spent when Redis restarts without persistence, or while it is down.

The script runs on the event loop, over a connection of its own (``BucketConnection``): ~40 us p50 on
loopback (bench/fair_share.py), less than a hop to a worker thread would cost; a Redis that hangs costs
one ``redis_timeout_s`` per retry window.

The bucket: ``burst`` tokens at most, refilled at ``rate`` per second; a request takes one. Time is in
integer milliseconds (Redis ``TIME`` unless the caller gives it, as the tests do); the arithmetic is
the same in Lua and in ``take`` below (IEEE doubles, the same operations in the same order), and the
tests check the script against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote, urlsplit

import redis
from cachetools import LRUCache

from service.cache import fail_fast_redis
from service.quota_ledger import QuotaLedger

log = logging.getLogger(__name__)

# KEYS[1] the bucket (hash: t tokens, s stamp ms), KEYS[2] the day's quota counter.
# ARGV: rate per s, burst, now ms ('' : Redis TIME), quota (0: none), quota counter lifetime s, the least
# the quota's counter may read (``service.quota_ledger``: a counter lost in a Redis restart resumes there).
# Answers {allowed 0/1, remaining tokens (floor), retry after ms (-1: quota spent), full again in ms, used}.
BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[3])
end
local state = redis.call('HMGET', KEYS[1], 't', 's')
local tokens = tonumber(state[1])
local stamp = tonumber(state[2])
if tokens == nil or stamp == nil then
  tokens = burst
  stamp = now
end
if now > stamp then
  tokens = math.min(burst, tokens + (now - stamp) * rate / 1000)
  stamp = now
end
local quota = tonumber(ARGV[4])
local used = 0
if quota > 0 then
  used = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(ARGV[6]))
  if used >= quota then
    return {0, math.floor(tokens), -1, 0, used}
  end
end
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
  if quota > 0 then
    used = used + 1
    redis.call('SET', KEYS[2], used, 'EX', tonumber(ARGV[5]))
  end
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 's', string.format('%.17g', stamp))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, math.floor(tokens), wait, math.ceil((burst - tokens) * 1000 / rate), used}
"""


class ScriptError(Exception):
    """Redis answered the script with an error."""


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class BucketConnection:
    """One connection to Redis running the bucket script, its command packed and its answer (four integers)
    parsed here: measured on the 2-core dev machine, redis-py's generic client spent ~90 us of Python per
    call around a ~30 us round trip, and this runs once per search. Plain ``redis://`` URLs only (host,
    port, user, password, db); anything else (TLS, unix sockets) goes through redis-py."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.db = int(parts.path.strip("/") or 0)
        self.timeout_s = timeout_s
        self.sha = hashlib.sha1(BUCKET_LUA.encode()).hexdigest().encode()
        self._sock: socket.socket | None = None
        self._reader: object = None

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "redis"

    def _connect(self) -> None:
        sock = socket.create_connection(self.address, timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._reader = sock, sock.makefile("rb")
        if self.password is not None:
            auth = [b"AUTH", *([self.username.encode()] if self.username else []), self.password.encode()]
            self._roundtrip(_command(*auth))
        if self.db:
            self._roundtrip(_command(b"SELECT", str(self.db).encode()))

    def _roundtrip(self, data: bytes) -> list[int] | bytes:
        assert self._sock is not None
        self._sock.sendall(data)
        return self._read()

    def _read(self) -> list[int] | bytes:
        line = self._reader.readline()  # type: ignore[attr-defined]
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed by Redis")
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            raise ScriptError(rest.decode(errors="replace"))
        if kind == b"*":
            return [int(self._reader.readline()[1:-2]) for _ in range(int(rest))]  # type: ignore[attr-defined]
        return rest  # +OK, :n

    def run(self, keys: list[str], args: list[str]) -> list[int]:
        if self._sock is None:
            self._connect()
        tail = [b"2", *(k.encode() for k in keys), *(a.encode() for a in args)]
        try:
            answer = self._roundtrip(_command(b"EVALSHA", self.sha, *tail))
        except ScriptError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            answer = self._roundtrip(_command(b"EVAL", BUCKET_LUA.encode(), *tail))
        if not isinstance(answer, list):  # a proxy or another server answering: Redis counts as down
            raise ScriptError(f"unexpected reply to the bucket script: {answer[:80]!r}")
        return answer

    def close(self) -> None:
        sock, self._sock = self._sock, None
        reader, self._reader = self._reader, None
        if reader is not None:  # the makefile reader holds the descriptor open too
            with contextlib.suppress(OSError):
                reader.close()  # type: ignore[attr-defined]
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


@dataclass(frozen=True)
class Limit:
    """A caller's allowance: ``rate`` requests per second with bursts of ``burst``; ``quota_per_day``
    requests per UTC day (None: no quota)."""

    rate: float
    burst: int
    quota_per_day: int | None = None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int  # the bucket's size
    remaining: int  # whole tokens left
    retry_after_s: int  # 0 when allowed
    reset_s: int  # seconds until the bucket is full again
    quota_spent: bool = False

    def headers(self) -> dict[str, str]:
        """``RateLimit-*`` (IETF draft, separate fields) and, when refused, ``Retry-After``."""
        out = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_s),
        }
        if not self.allowed:
            out["Retry-After"] = str(self.retry_after_s)
        return out


@dataclass
class BucketState:
    tokens: float
    stamp: int  # ms


def take(
    state: BucketState | None, now_ms: int, rate: float, burst: int
) -> tuple[BucketState, int, int, int]:
    """The bucket's arithmetic, the reference of ``BUCKET_LUA``: (new state, allowed 0/1, retry after ms,
    full again in ms). ``state`` None: a full bucket."""
    tokens, stamp = (float(burst), now_ms) if state is None else (state.tokens, state.stamp)
    if now_ms > stamp:
        tokens = min(burst, tokens + (now_ms - stamp) * rate / 1000)
        stamp = now_ms
    allowed, wait = 0, 0
    if tokens >= 1:
        tokens = tokens - 1
        allowed = 1
    else:
        wait = math.ceil((1 - tokens) * 1000 / rate)
    return BucketState(tokens, stamp), allowed, wait, math.ceil((burst - tokens) * 1000 / rate)


def seconds_to_utc_midnight(now: datetime | None = None) -> int:
    now = now or datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, math.ceil((midnight - now).total_seconds()))


class RateLimiter:
    """``check(identity, limit)``: one token of the caller's bucket, from Redis or, without it, in process."""

    def __init__(
        self,
        *,
        redis_url: str | None,
        prefix: str,
        timeout_s: float,
        retry_s: float,
        local_buckets: int = 100_000,
        on_event: Callable[[str, str], None] | None = None,
        ledger: QuotaLedger | None = None,
    ) -> None:
        self.prefix = prefix
        self.ledger = ledger  # daily quotas kept beyond Redis
        self.retry_s = retry_s
        self._on_event = on_event or (lambda kind, detail: None)
        self._lock = threading.Lock()
        self._local: LRUCache[str, BucketState] = LRUCache(maxsize=local_buckets)
        self._quota: LRUCache[str, int] = LRUCache(maxsize=local_buckets)
        self._down_until = 0.0
        self._redis: redis.Redis | None = None
        self._script = None
        self._conn: BucketConnection | None = None
        if redis_url and BucketConnection.supports(redis_url):
            self._conn = BucketConnection(redis_url, timeout_s)
        elif redis_url:
            self._redis = fail_fast_redis(redis_url, timeout_s)
            self._script = self._redis.register_script(BUCKET_LUA)

    @property
    def backend(self) -> str:
        shared = self._conn is not None or self._redis is not None
        return "redis" if shared and time.monotonic() >= self._down_until else "memory"

    def _run_script(self, keys: list[str], args: list[str]) -> list[int]:
        if self._conn is not None:
            with self._lock:
                try:
                    return self._conn.run(keys, args)
                except BaseException:
                    self._conn.close()  # a half-read answer: a new connection next time
                    raise
        assert self._script is not None
        return self._script(keys=keys, args=args)

    def check(self, identity: str, limit: Limit, now_ms: int | None = None) -> Decision:
        day = datetime.now(UTC).strftime("%Y%m%d")
        ledger = self.ledger if limit.quota_per_day else None
        floor = ledger.floor(identity, day) if ledger is not None else 0
        if (self._conn is not None or self._script is not None) and time.monotonic() >= self._down_until:
            try:
                allowed, remaining, wait, reset, used = self._run_script(
                    [f"{self.prefix}rl:{identity}", f"{self.prefix}rq:{identity}:{day}"],
                    [
                        repr(float(limit.rate)),
                        str(limit.burst),
                        "" if now_ms is None else str(now_ms),
                        str(limit.quota_per_day or 0),
                        str(2 * 86400),
                        str(floor),
                    ],
                )
            except (redis.RedisError, OSError, ScriptError, ValueError) as exc:
                self._down_until = time.monotonic() + self.retry_s
                self._on_event("error", type(exc).__name__)
                log.warning(
                    "redis error (%s: %s); rate limits in process for %.1f s",
                    type(exc).__name__,
                    exc,
                    self.retry_s,
                )
            else:
                if ledger is not None:
                    ledger.note(identity, day, int(used))
                return self._decision(limit, int(allowed), int(remaining), int(wait), int(reset))
        return self._check_local(identity, limit, day, now_ms, floor)

    def _check_local(
        self, identity: str, limit: Limit, day: str, now_ms: int | None, floor: int = 0
    ) -> Decision:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        quota_key = f"{identity}:{day}"
        with self._lock:
            state = self._local.get(identity)
            used = max(self._quota.get(quota_key, 0), floor)
            if limit.quota_per_day and used >= limit.quota_per_day:
                tokens = state.tokens if state is not None else float(limit.burst)
                return self._decision(limit, 0, math.floor(tokens), -1, 0)
            state, allowed, wait, reset = take(state, now, limit.rate, limit.burst)
            self._local[identity] = state
            if allowed and limit.quota_per_day:
                used = self._quota[quota_key] = used + 1
        if allowed and limit.quota_per_day and self.ledger is not None:
            self.ledger.note(identity, day, used)
        return self._decision(limit, allowed, math.floor(state.tokens), wait, reset)

    @staticmethod
    def _decision(limit: Limit, allowed: int, remaining: int, wait_ms: int, reset_ms: int) -> Decision:
        if wait_ms < 0:  # the day's quota is spent
            return Decision(False, limit.burst, remaining, seconds_to_utc_midnight(), 0, quota_spent=True)
        retry = 0 if allowed else max(1, math.ceil(wait_ms / 1000))
        return Decision(bool(allowed), limit.burst, remaining, retry, math.ceil(reset_ms / 1000))

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.flush()
        if self._conn is not None:
            self._conn.close()
        if self._redis is not None:
            with contextlib.suppress(redis.RedisError):
                self._redis.close()
