"""Fixtures of the monitoring tests, shared with the service tests through ``tests.fixtures``: the catalogue
encoded by the real demo model, its index root, a real Redis prefix (for the Redis history only), and the
live service that the HTTP probe runs ask (monitoring probes a service over HTTP; the tests may start one,
the package itself never imports it)."""

from __future__ import annotations

from tests.fixtures import catalogue, encoder, index_root, redis_prefix, server

__all__ = ["catalogue", "encoder", "index_root", "redis_prefix", "server"]
