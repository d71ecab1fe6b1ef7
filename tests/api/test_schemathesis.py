"""Property-based requests over the app's own OpenAPI schema: none may get a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from .conftest import start_server, stop_server


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    # a small context bounds every generated reply (a fuzzed request rarely sets max_tokens)
    srv = start_server(tmp_path_factory.mktemp("fuzz"), "--model", "smollm2:135m",
                       "--parallel", "2", "--ctx", "96")
    yield srv
    stop_server(srv)
    assert srv.process.returncode in (0, -15), srv.log.read_text()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case, fuzz_server):
    case.call_and_validate(checks=[not_a_server_error])
