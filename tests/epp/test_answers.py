"""epp.answers: every error answer is OpenAI-style JSON with its reason, and `retry-after` where a
retry soon may be served; the owned headers."""

from __future__ import annotations

import json

import pytest

from extproc import errors
from extproc.epp import answers as epp
from extproc.router import errors as router_errors

ERRORS = [
    (errors.BodyTooLarge(10, 5), 413, "body-too-large", None),
    (errors.PromptTooLong(10, 5), 413, "prompt-too-long", None),
    (errors.RequestInvalid("bad"), 400, "invalid-request", None),
    (errors.UnknownModel("m", ["x"]), 404, "unknown-model", None),
    (errors.NoEligibleWorker("none"), 503, "rejected-no-endpoints", None),
    (errors.TooManyStreams(2, 2), 429, "rejected-too-many-streams", "1"),
    (errors.ShuttingDown("stopping"), 503, "rejected-shutting-down", "1"),
    (router_errors.AllWorkersBusy("m"), 503, "rejected-saturated", "1"),
    (router_errors.QueueTimeout(30.0, sheddable=False), 503, "rejected-queue-timeout", "5"),
    (router_errors.QueueTimeout(30.0, sheddable=True), 429, "shed-queue-timeout", "5"),
    (RuntimeError("boom"), 500, "internal-error", None),
]


def headers_of(answer) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in answer.immediate_response.headers.set_headers}


@pytest.mark.parametrize(("exc", "status", "reason", "retry_after"), ERRORS)
def test_every_error_answer_is_openai_json_with_its_reason(exc, status, reason, retry_after):
    answer = epp.error_answer(exc)
    immediate = answer.immediate_response
    assert (immediate.status.code, immediate.details) == (status, reason)
    body = json.loads(immediate.body)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["param"] is None
    assert body["error"]["type"] == epp.error_type(status)
    assert body["error"]["message"]
    headers = headers_of(answer)
    assert headers["content-type"] == "application/json"
    assert headers[epp.DROPPED_REASON_HEADER] == reason
    assert headers.get(epp.RETRY_AFTER_HEADER) == retry_after


def test_error_types_follow_vllm_names():
    assert [epp.error_type(s) for s in (400, 404, 413, 429, 500, 503, 504, 418)] == [
        "BadRequestError",
        "NotFoundError",
        "BadRequestError",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "GatewayTimeoutError",
        "BadRequestError",
    ]
    assert (
        "boom"
        not in json.loads(epp.error_answer(RuntimeError("boom")).immediate_response.body)["error"]["message"]
    )


def test_owned_headers_hold_the_protocol_headers_and_the_prefill_header():
    assert epp.owned_headers() == {
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-served",
        "x-data-parallel-rank",
        "x-extproc-worker",
        "x-prefill-endpoint",
    }
    assert epp.owned_headers(" X-Prefiller-Host-Port ") == epp.OWNED_HEADERS | {"x-prefiller-host-port"}


def test_a_routing_answer_sets_its_headers_and_removes_the_other_owned_ones():
    answer = epp.route_in_headers("10.0.0.1:8000", {"X-Data-Parallel-Rank": "1"})
    mutation = answer.request_headers.response.header_mutation
    assert {h.header.key for h in mutation.set_headers} == {epp.DESTINATION_HEADER, "X-Data-Parallel-Rank"}
    assert list(mutation.remove_headers) == sorted(
        (epp.owned_headers() | epp.INPUT_HEADERS) - {epp.DESTINATION_HEADER, epp.DP_RANK_HEADER}
    )
    body_answer = epp.route_in_body("10.0.0.1:8000", {}, owned={"x-a", epp.DESTINATION_HEADER})
    removed = body_answer.request_body.response.header_mutation.remove_headers
    assert list(removed) == [
        "x-a",
        "x-gateway-inference-fairness-id",
        "x-gateway-inference-objective",
        "x-gateway-model-name-rewrite",
    ]  # input headers stop at the picker


class _WithMessage(Exception):
    """An unexpected error that carries a `message` (as aiohttp's ClientResponseError does)."""

    def __init__(self) -> None:
        super().__init__("GET http://10.0.0.5:8000/tokenize: 500")
        self.message = "Internal Server Error at http://10.0.0.5:8000/tokenize"


@pytest.mark.parametrize("exc", [RuntimeError("boom at /srv/secret"), _WithMessage()])
def test_an_unexpected_errors_text_stays_in_the_log_not_in_the_answer(exc):
    body = json.loads(epp.error_answer(exc).immediate_response.body)
    assert body["error"]["message"] == "internal error in the picker"


def test_the_routers_errors_with_an_answer_show_their_text_and_the_others_do_not():
    busy = json.loads(epp.error_answer(router_errors.AllWorkersBusy(3)).immediate_response.body)
    assert busy["error"]["message"] == "all 3 candidate workers are over a busy threshold"
    unknown = json.loads(epp.error_answer(router_errors.UnknownRequest("r1")).immediate_response.body)
    assert unknown["error"]["message"] == "internal error in the picker"


def test_a_rewritten_body_rides_on_the_buffered_answer_with_its_own_length():
    body = '{"model":"food-review-v2","prompt":"ça"}'.encode()
    answer = epp.route_in_body("10.0.0.1:8000", {"x-data-parallel-rank": "0"}, owned=set(), body=body)
    common = answer.request_body.response
    assert common.body_mutation.body == body
    set_headers = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
    # Envoy leaves the length to the processor in BUFFERED mode and refuses a mutation that disagrees
    assert set_headers["content-length"] == str(len(body)).encode() == b"41"
    assert set_headers["x-data-parallel-rank"] == b"0"
    unchanged = epp.route_in_body("10.0.0.1:8000", {}, owned=set())
    assert not unchanged.request_body.response.HasField("body_mutation")
    assert "content-length" not in {
        h.header.key for h in unchanged.request_body.response.header_mutation.set_headers
    }
