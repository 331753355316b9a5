"""Fixtures of the monitoring tests: the service tests' catalogue encoded by the real demo model, its index
root, a real Redis prefix, and the live service that the HTTP probe runs ask (monitoring probes a service
over HTTP; the tests may start one, the package itself never imports it)."""

from __future__ import annotations

from tests.service.conftest import catalogue, encoder, index_root, redis_prefix, server

__all__ = ["catalogue", "encoder", "index_root", "redis_prefix", "server"]
