"""Malformed API input: schemathesis over the appliance's own OpenAPI document (reliability-table row 19).

The document is fetched from the running daemon (``/openapi/openapi.json``,
with an admin key). For every operation schemathesis generates valid and
invalid requests (bounded: ``MAX_EXAMPLES`` each, fixed seed) and checks the
answers: never a 5xx, every response documented and matching its schema,
invalid data rejected, valid data accepted.

Requests that name a model are pointed at the tiny model about half of the
time (the other half name models that do not exist), and generation budgets are
capped, so valid chat requests really run and stay fast. Operations that would
legitimately take long or change the box under the test are left out:
``/admin/ops/*`` (backup and restore), job event streams (SSE), model pulls
and quantization, the restart request (``/admin/settings/restart``: the daemon
drains and exits), and the Ollama API's pull and delete (``/api/pull``,
``/api/delete``: the same store operations, for admin keys).
"""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import allow_header_conformance, positive_data_acceptance

from appliance.app import create_app
from appliance.settings import Settings
from tests.reliability.kit import TINY, db_rows, start_tiny_daemon

pytestmark = pytest.mark.slow
MAX_EXAMPLES = 12
#: The operations that run the model get more: few generated bodies are valid (roles, content parts,
#: tools, a served model's name), and some valid ones must reach the model for the last test to mean anything.
MODEL_EXAMPLES = 48
MODEL_PATHS = r"^/v1/(chat/completions|responses|completions|embeddings|messages)$|^/api/(chat|generate|embed|embeddings)$"
MAX_TOKENS = 16
EXCLUDED = r"^/admin/(ops/|jobs/\{job_id\}/events|models/pull|models/\{name\}/quantize|settings/restart)|^/api/(pull|delete)$"
# Left out, with the reason:
# * positive_data_acceptance: the server validates more than OpenAPI can say (key names 1-128
#   characters, ``key:<prefix>|team:<name>`` subjects, models and jobs that do not exist); those
#   schema-valid requests get a 400/404 in the documented error envelope, which is right.
# * allow_header_conformance: the ``Allow`` header of OPTIONS is Litestar's own (no CORS is served).
NOT_CHECKED = [positive_data_acceptance, allow_header_conformance]
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _served_document() -> dict:
    """The OpenAPI document, built from the app exactly as the daemon serves it (checked below)."""
    app = create_app(Settings(data_dir="/nonexistent-appliance-openapi", seed_default_model=False))
    return app.openapi_schema.to_schema()


DOCUMENT = _served_document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict({"seed": 19})).exclude(path_regex=EXCLUDED)


@schema.hook
def map_body(context, body):
    """Valid model names go to the tiny model half of the time; valid budgets are capped."""
    if not isinstance(body, dict):
        return body
    model = body.get("model")
    if isinstance(model, str) and 1 <= len(model) <= 200 and hashlib.sha256(repr(body).encode()).digest()[0] % 2:
        body["model"] = TINY
    for field in TOKEN_FIELDS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and MAX_TOKENS < value <= 1_000_000:
            body[field] = MAX_TOKENS
    if context.operation.path in ("/api/chat", "/api/generate"):  # Ollama's budget is options.num_predict, unbounded by default
        options = body.setdefault("options", {})
        if isinstance(options, dict):
            value = options.get("num_predict")
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and (value > MAX_TOKENS or value <= 0)):
                options["num_predict"] = MAX_TOKENS
    return body


@schema.hook
def filter_query(context, query):
    """Unknown query parameters are ignored, as OpenAI's API ignores them: that is not a case to reject."""
    known = {parameter.name for parameter in context.operation.query}
    return not query or set(query) <= known


@schema.hook
def filter_headers(context, headers):
    """Headers that frame the HTTP message itself are refused by the HTTP parser before the app (plain 400)."""
    framing = {"content-length", "transfer-encoding", "host", "connection", "expect"}
    return not headers or not {name.lower() for name in headers} & framing


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_gguf):
    daemon = start_tiny_daemon(
        tmp_path_factory.mktemp("schemathesis"), tiny_gguf, APPLIANCE_ENGINE_PARALLEL="2", APPLIANCE_QUEUE_TIMEOUT_SECONDS="20"
    )
    daemon.auth = {"Authorization": f"Bearer {daemon.create_key('schemathesis', role='admin')}"}  # type: ignore[attr-defined]
    yield daemon
    daemon.stop()


def test_the_fuzzed_document_is_the_one_the_daemon_serves(api):
    served = httpx.get(f"{api.url}/openapi/openapi.json", headers=api.auth, timeout=30)
    assert served.status_code == 200
    assert served.json() == json.loads(json.dumps(DOCUMENT))
    assert len(list(schema.get_all_operations())) >= 40


@schema.exclude(path_regex=MODEL_PATHS).parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_answers_every_generated_request_as_documented(case, api):
    case.call_and_validate(base_url=api.url, headers=api.auth, timeout=60, excluded_checks=NOT_CHECKED)


@schema.include(path_regex=MODEL_PATHS).parametrize()
@settings(max_examples=MODEL_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_model_operations_answer_every_generated_request_as_documented(case, api):
    case.call_and_validate(base_url=api.url, headers=api.auth, timeout=60, excluded_checks=NOT_CHECKED)


def test_valid_requests_reached_the_model(api):
    """The run above was not all 4xx: schema-valid chat, completion and embedding requests were served."""
    rows = db_rows(api.data_dir, "SELECT endpoint, count(*) FROM usage WHERE model = ? AND status = 200 GROUP BY endpoint", TINY)
    assert {endpoint for endpoint, count in rows if count} >= {"chat", "completions", "embeddings"}, rows
