"""A bounded schemathesis run over the live OpenAPI schema: valid and invalid inputs, never a 5xx."""

from __future__ import annotations

import time
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.fixtures import LiveServer

EXAMPLES = 40  # per operation and mode; the whole run stays around 10-20 s on 2 cores


def test_no_5xx_over_the_openapi_schema(server: LiveServer) -> None:
    # The product batch route's body is NDJSON text (``service.api.routes.products``): sent as text.
    schemathesis.serializer.alias("application/x-ndjson", "text/plain")
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


# Values the schema-driven generator does not make (its strings are valid UTF-8 text): lone surrogates and
# NUL inside JSON strings, raw invalid UTF-8, non-finite and out-of-range numbers, deep nesting, huge keys.
HOSTILE_STRINGS = st.sampled_from(
    ["\\ud800", "\\udfff x", "a\\u0000b", "\\u0000", "x\\ud83d", "\\ufeff", "\\u202e mug"]
).map(lambda escaped: f'"{escaped}"')
HOSTILE_VALUES = st.one_of(
    HOSTILE_STRINGS,
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", str(2**63), str(-(2**64)), "1" * 400]),
    st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
    st.sampled_from(['{"' + "k" * 50_000 + '": 1}', '{"\\ud800": 1}', '"\xff\xfe"', "{"]),
)
JSON_BODIES = {
    "/v1/search": {"query": '"a red mug"', "top_k": "5", "lang": '"de"', "rerank": "false", "filters": "{}"},
    "/v1/consistency": {"queries": '{"en": "a mug", "de": "eine Tasse"}', "top_k": "5", "filters": "{}"},
}


@given(
    path=st.sampled_from(sorted(JSON_BODIES)),
    data=st.data(),
    hostile=HOSTILE_VALUES,
)
@settings(
    max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
def test_hostile_json_values_never_5xx(
    server: LiveServer, path: str, data: st.DataObject, hostile: str
) -> None:
    """Each JSON field of the POST routes replaced by a hostile value (written as raw JSON text, so that
    escapes reach the server as they are): always a 4xx, or a 200 where the value is acceptable."""
    fields = dict(JSON_BODIES[path])
    field = data.draw(st.sampled_from(sorted(fields)))
    if field in ("filters", "queries") and data.draw(st.booleans()):
        fields[field] = (
            '{"colour": ' + hostile + "}" if field == "filters" else '{"en": ' + hostile + ', "de": "x"}'
        )
    else:
        fields[field] = hostile
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    raw = body.encode("utf-8", "surrogateescape") if "\xff" not in body else body.encode("latin-1", "replace")
    response = httpx.post(
        server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code < 500, (body[:300], response.status_code, response.text[:300])
    response.json()  # every answer is well-formed JSON


SYNONYMS = "/v1/admin/indexes/shop/synonyms"
ADMIN_KEY = {"X-API-Key": "test-admin-key"}  # tests.fixtures.make_settings's


def _check_as_admin(server: LiveServer, operation: Any, mode: GenerationMode) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        if case.path_parameters is not None and mode is GenerationMode.POSITIVE:
            case.path_parameters["name"] = "shop"  # the served index: the body is read
        response = case.call(base_url=server.url, timeout=30, headers=ADMIN_KEY)
        checks = [not_a_server_error]
        if mode is GenerationMode.POSITIVE:
            checks.append(response_schema_conformance)
        case.validate_response(response, checks=checks)

    try:
        check()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_no_5xx_on_the_synonyms_routes_with_the_admin_key(server: LiveServer) -> None:
    """The synonyms admin routes as an admin calls them (the run above, without the key, reads 401s): the
    body's every field generated valid and invalid. The index-level set it leaves is removed."""
    # The product batch route's body is NDJSON text (``service.api.routes.products``): sent as text.
    schemathesis.serializer.alias("application/x-ndjson", "text/plain")
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().path.endswith("/synonyms")]
    assert {op.method.upper() for op in operations} == {"GET", "PUT", "DELETE"}
    try:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _check_as_admin(server, operation, mode)
    finally:
        assert httpx.delete(server.url + SYNONYMS, headers=ADMIN_KEY, timeout=30).status_code == 200


@given(field=st.sampled_from(["terms", "from", "to", "lang", "entry", "synonyms"]), hostile=HOSTILE_VALUES)
@settings(
    max_examples=80, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
def test_hostile_synonyms_bodies_never_5xx(server: LiveServer, field: str, hostile: str) -> None:
    """Each field of a synonyms entry replaced by a hostile value (raw JSON text): a 4xx, or a 200 where the
    value is acceptable (then removed again)."""
    entry = (
        {"terms": '["a", "b"]', "lang": '"en"'}
        if field in ("terms", "lang")
        else {"from": '"a"', "to": '["b"]'}
    )
    if field in entry:
        entry[field] = hostile
    inner = hostile if field == "entry" else "{" + ", ".join(f'"{k}": {v}' for k, v in entry.items()) + "}"
    body = '{"synonyms": ' + (hostile if field == "synonyms" else f"[{inner}]") + "}"
    raw = body.encode("utf-8", "surrogateescape") if "\xff" not in body else body.encode("latin-1", "replace")
    response = httpx.put(
        server.url + SYNONYMS,
        content=raw,
        headers={**ADMIN_KEY, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code < 500, (body[:300], response.status_code, response.text[:300])
    response.json()
    if response.status_code == 200:
        httpx.delete(server.url + SYNONYMS, headers=ADMIN_KEY, timeout=30)
