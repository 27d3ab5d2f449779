"""Property-based fuzzing of the OpenAPI schema with schemathesis, in-process (ASGI).

For every operation of ``/openapi.json``, a bounded number of generated requests (valid and
invalid by the schema, deterministic: ``derandomize``): no response is a 5xx, every status is one
the schema documents, and every body matches the documented schema and content type.
"""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from bayesgate.service.app import create_app
from bayesgate.service.settings import Settings

EXAMPLES_PER_OPERATION = 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def fuzz_operation(operation: schemathesis.APIOperation, called: dict[str, int]) -> None:
    """``EXAMPLES_PER_OPERATION`` cases, valid and invalid by the schema, through all checks."""
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:
        called[operation.label] = called.get(operation.label, 0) + 1
        case.call_and_validate(checks=CHECKS)

    fuzz()


def test_no_server_error_and_responses_match_the_schema(tiny_model_dir: Path) -> None:
    app = create_app(
        Settings(
            model_dir=tiny_model_dir,
            device="cpu",
            max_instances=4,
            max_mc_samples=20,
            max_body_bytes=64 * 1024,
            max_queue_delay_ms=1.0,
            api_key="fuzzing-key-not-given-to-schemathesis",
            access_log=False,
            demo=True,  # fuzz the attack route too, with small limits
            demo_max_attack_steps=3,
            demo_max_attack_mc_samples=2,
        )
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16  # /v1, /v2, health, metrics and admin routes
    called: dict[str, int] = {}
    try:
        for operation in operations:
            fuzz_operation(operation, called)
    finally:
        asgi.shutdown_lifespans()  # stops the app's inference thread
    assert len(called) == len(operations), called
