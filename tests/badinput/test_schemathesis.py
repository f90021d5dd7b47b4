"""Schemathesis against the live gateway's own OpenAPI description (GET /openapi.json).

Positive and negative examples for every operation, a bounded number of each:
no 5xx, every status and content type documented, responses match their schema.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 40  # per operation and mode: bounded, the test stops by itself


@pytest.fixture(scope="module")
def fleet():
    # fast engines: a generated request may ask for thousands of tokens
    sim = [SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=2000.0, port=0)]
    with LiveFleet(sims=sim, gateway={"max_body_bytes": 1_000_000}) as lf:
        yield lf


@pytest.fixture(scope="module")
def schema(fleet):
    return schemathesis.openapi.from_url(fleet.url + "/openapi.json")


def _operations(schema):
    return [r.ok() for r in schema.get_all_operations()]


def test_the_document_is_valid_openapi_and_lists_the_fleets_models(schema):
    ops = {(op.method.upper(), op.path) for op in _operations(schema)}
    assert ("POST", "/v1/chat/completions") in ops and ("POST", "/v1/completions") in ops
    assert {("POST", "/v1/responses"), ("POST", "/v1/embeddings"), ("GET", "/v1/responses/{response_id}"),
            ("DELETE", "/v1/responses/{response_id}")} <= ops
    chat = schema.raw_schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["properties"]["model"]["enum"] == ["llama-3.1-8b"]


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_server_errors_and_responses_conform(fleet, schema, mode):
    seen: dict[int, int] = {}
    for op in _operations(schema):
        if mode is schemathesis.GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # a GET without parameters has nothing to get wrong

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            r = case.call(base_url=fleet.url, timeout=20)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            case.validate_response(r, checks=CHECKS)

        run()
    assert not any(s >= 500 for s in seen), seen
    if mode is schemathesis.GenerationMode.POSITIVE:
        assert seen.get(200, 0) > 10, seen  # valid requests are served, not just refused
    else:
        assert sum(n for s, n in seen.items() if 400 <= s < 500) > 10, seen
