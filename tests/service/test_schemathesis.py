"""A bounded schemathesis run over the live OpenAPI schema: valid and invalid inputs, never a 5xx."""

from __future__ import annotations

import time

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.service.conftest import LiveServer

EXAMPLES = 40  # per operation and mode; the whole run stays around 10-20 s on 2 cores


def test_no_5xx_over_the_openapi_schema(server: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    calls = 0
    start = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                nonlocal calls
                response = case.call(base_url=server.url, timeout=30)
                calls += 1
                # Invalid inputs must be refused cleanly; valid ones must also match the documented schema.
                checks = [not_a_server_error]
                if case.meta is None or case.meta.generation.mode is GenerationMode.POSITIVE:
                    checks.append(response_schema_conformance)
                case.validate_response(response, checks=checks)

            try:
                check()
            except Unsatisfiable:
                # No invalid input exists for an operation without parameters (e.g. /healthz).
                assert mode is GenerationMode.NEGATIVE, operation.label
    assert calls >= len(operations) * 2
    print(
        f"schemathesis: {calls} calls over {len(operations)} operations in {time.monotonic() - start:.1f} s"
    )
