"""The Envoy answers' behaviour that their mutants showed unasserted (benchmarks/mutation.py).

Each answer as Envoy reads it: the chunks of a duplex body and where end-of-stream falls, the
destination in headers and metadata, subset hints, endpoints with IPv6 hosts, the header map.
"""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from extproc import errors
from extproc.epp import answers as epp
from extproc.router import errors as router_errors

CHUNK = epp.MAX_STREAMED_CHUNK
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def streamed(answers) -> list[tuple[bytes, bool]]:
    out = []
    for answer in answers:
        assert answer.WhichOneof("response") == "request_body"
        part = answer.request_body.response.body_mutation.streamed_response
        out.append((part.body, part.end_of_stream))
    return out


# --- duplex bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_a_body_of_exactly_k_chunks_ends_the_stream_on_its_last_chunk(blocks):
    body = bytes(range(256)) * (CHUNK * blocks // 256)
    assert len(body) == blocks * CHUNK
    parts = streamed(epp.streamed_body(body, end_of_stream=True))
    assert [len(b) for b, _ in parts] == [CHUNK] * blocks
    assert [eos for _, eos in parts] == [False] * (blocks - 1) + [True]
    assert b"".join(b for b, _ in parts) == body


@pytest.mark.parametrize("size", [1, 100, CHUNK - 1, CHUNK + 1, 2 * CHUNK + 7])
def test_a_body_is_cut_into_chunks_of_at_most_62_kib_in_order(size):
    body = bytes(i % 251 for i in range(size))
    parts = streamed(epp.streamed_body(body, end_of_stream=True))
    sizes = [len(b) for b, _ in parts]
    assert all(0 < s <= CHUNK for s in sizes) and sizes[:-1] == [CHUNK] * (len(sizes) - 1)
    assert len(parts) == -(-size // CHUNK)
    assert b"".join(b for b, _ in parts) == body
    assert [eos for _, eos in parts] == [False] * (len(parts) - 1) + [True]


def test_a_body_that_does_not_end_the_stream_never_says_end_of_stream():
    body = b"x" * (2 * CHUNK)
    parts = streamed(epp.streamed_body(body, end_of_stream=False))
    assert [eos for _, eos in parts] == [False, False]
    assert b"".join(b for b, _ in parts) == body


@pytest.mark.parametrize("end_of_stream", [True, False])
def test_an_empty_body_is_one_empty_chunk_carrying_the_end_of_stream(end_of_stream):
    assert streamed(epp.streamed_body(b"", end_of_stream=end_of_stream)) == [(b"", end_of_stream)]


@pytest.mark.parametrize("end_of_stream", [True, False])
def test_a_response_chunk_passes_through_unchanged(end_of_stream):
    answer = epp.echo_response_chunk(b"data: {}\n\n", end_of_stream)
    assert answer.WhichOneof("response") == "response_body"
    part = answer.response_body.response.body_mutation.streamed_response
    assert (part.body, part.end_of_stream) == (b"data: {}\n\n", end_of_stream)


# --- routing and served answers ------------------------------------------------------------------


def lb(answer, key: str) -> str:
    return answer.dynamic_metadata.fields[epp.LB_NAMESPACE].struct_value.fields[key].string_value


@pytest.mark.parametrize("route", [epp.route_in_headers, epp.route_in_body])
def test_a_routing_answer_overwrites_the_destination_and_names_it_in_metadata(route):
    answer = route("10.0.0.1:8000", {"x-data-parallel-rank": "1"}, owned={"x-a", epp.DP_RANK_HEADER})
    common = (
        answer.request_headers.response if route is epp.route_in_headers else answer.request_body.response
    )
    set_headers = {
        h.header.key: (h.header.raw_value, h.append_action) for h in common.header_mutation.set_headers
    }
    assert set_headers == {
        epp.DESTINATION_HEADER: (b"10.0.0.1:8000", OVERWRITE),  # a client's value never stays
        "x-data-parallel-rank": (b"1", OVERWRITE),
    }
    assert list(common.header_mutation.remove_headers) == [
        "x-a",
        "x-gateway-inference-fairness-id",
        "x-gateway-inference-objective",
        "x-gateway-model-name-rewrite",
    ]
    assert common.clear_route_cache is True
    assert list(answer.dynamic_metadata.fields) == [epp.LB_NAMESPACE]
    assert lb(answer, epp.DESTINATION_HEADER) == "10.0.0.1:8000"


@pytest.mark.parametrize("conformance", [True, False])
def test_the_served_answer_reports_the_endpoint(conformance):
    answer = epp.served_answer("[::1]:8000", conformance=conformance)
    assert answer.WhichOneof("response") == "response_headers"
    headers = answer.response_headers.response.header_mutation.set_headers
    expected = [(epp.CONFORMANCE_SERVED_HEADER, b"[::1]:8000", OVERWRITE)] if conformance else []
    assert [(h.header.key, h.header.raw_value, h.append_action) for h in headers] == expected
    assert lb(answer, epp.SERVED_KEY) == "[::1]:8000"


def test_a_longer_message_timeout_is_asked_in_milliseconds():
    answer = epp.extend_message_timeout(2.5)
    assert answer.WhichOneof("response") is None
    assert answer.HasField("override_message_timeout")
    assert answer.override_message_timeout.ToMilliseconds() == 2500


# --- errors ---------------------------------------------------------------------------------------


def test_statuses_outside_the_table_get_the_type_of_their_class():
    assert [epp.error_type(s) for s in (401, 499, 501, 502, 599)] == [
        "BadRequestError",
        "BadRequestError",
        "InternalServerError",
        "InternalServerError",
        "InternalServerError",
    ]


def test_a_500_hides_an_unexpected_errors_text_but_shows_a_picker_errors_safe_message():
    hidden = json.loads(epp.error_answer(KeyError("secret")).immediate_response.body)["error"]
    assert hidden["message"] == "internal error in the picker" and hidden["code"] == 500
    shown = json.loads(epp.error_answer(errors.PickerError("tokenizer gone")).immediate_response.body)
    assert shown["error"]["message"] == "tokenizer gone" and shown["error"]["code"] == 500


def test_a_client_error_answer_carries_the_errors_text():
    body = json.loads(epp.error_answer(errors.RequestInvalid("no 'model' field")).immediate_response.body)
    assert body["error"]["message"] == "no 'model' field"


# --- subset hints and endpoints -------------------------------------------------------------------


def request_with_hint(value: struct_pb2.Value | None, *, key: str = epp.SUBSET_KEY) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    if value is not None:
        request.metadata_context.filter_metadata[epp.SUBSET_NAMESPACE].fields[key].CopyFrom(value)
    return request


def list_value(*items) -> struct_pb2.Value:
    value = struct_pb2.Value()
    value.list_value.extend(items)
    return value


def test_no_hint_namespace_or_key_is_no_hint():
    assert epp.subset_hint(pb.ProcessingRequest()) is None
    assert epp.subset_hint(request_with_hint(struct_pb2.Value(string_value="a:1"), key="other")) is None


def test_a_hint_list_keeps_its_strings_stripped_and_drops_the_rest():
    value = list_value(" 10.0.0.1:8000 ", 7.0, "", "[::1]:8000", True)
    assert epp.subset_hint(request_with_hint(value)) == ["10.0.0.1:8000", "[::1]:8000"]


def test_a_hint_string_is_comma_separated():
    value = struct_pb2.Value(string_value="10.0.0.1:8000, 10.0.0.2 ,,")
    assert epp.subset_hint(request_with_hint(value)) == ["10.0.0.1:8000", "10.0.0.2"]


def test_a_hint_of_another_kind_allows_nothing():
    assert epp.subset_hint(request_with_hint(struct_pb2.Value(number_value=1.0))) == []


@pytest.mark.parametrize(
    ("endpoint", "allowed", "matches"),
    [
        ("10.0.0.1:8000", ["10.0.0.1:8000"], True),
        ("10.0.0.1:8000", ["10.0.0.1"], True),  # a bare IP allows any port
        ("10.0.0.1:8000", ["10.0.0.1:9000"], False),
        ("10.0.0.1:8000", ["10.0.0.2", "8000"], False),
        ("10.0.0.1:8000", [], False),
        ("[::1]:8000", ["[::1]:8000"], True),
        ("[::1]:8000", ["::1"], True),
        ("[::1]:8000", ["[::1]"], True),
        ("[fd00::1]:8000", ["fd00::1"], True),
        ("[fd00::1]:8000", ["fd00::2", "[fd00::1]:9000"], False),
        ("[fd00::1]:8000", ["fd00:"], False),
        ("[fd00::1]:8000", ["8000"], False),
    ],
)
def test_endpoints_match_subset_hints_with_ipv4_and_ipv6_hosts(endpoint, allowed, matches):
    assert epp.endpoint_matches(endpoint, allowed) is matches


@pytest.mark.parametrize(
    ("host", "port", "endpoint"),
    [
        ("10.0.0.1", 8000, "10.0.0.1:8000"),
        ("worker-0.svc", 80, "worker-0.svc:80"),
        ("::1", 8000, "[::1]:8000"),
        ("fd00::1", 9, "[fd00::1]:9"),
        ("[fd00::1]", 9, "[fd00::1]:9"),  # already bracketed
    ],
)
def test_endpoints_are_formatted_with_ipv6_hosts_in_brackets(host, port, endpoint):
    assert epp.format_endpoint(host, port) == endpoint


def test_the_header_map_has_lower_case_keys_and_prefers_raw_values():
    headers = pb.HttpHeaders()
    headers.headers.headers.add(key="X-Session-Id", raw_value=b"abc")
    headers.headers.headers.add(key="X-Old", value="from value")
    headers.headers.headers.add(key="X-Both", value="ignored", raw_value=b"raw")
    headers.headers.headers.add(key="X-Bad", raw_value=b"caf\xe9")  # not UTF-8: replaced, no error
    assert epp.header_map(headers) == {
        "x-session-id": "abc",
        "x-old": "from value",
        "x-both": "raw",
        "x-bad": "caf\ufffd",
    }


def test_a_router_error_answer_carries_its_text():
    exc = router_errors.AllWorkersBusy(3)
    body = json.loads(epp.error_answer(exc).immediate_response.body)
    assert body["error"]["message"] == "all 3 candidate workers are over a busy threshold"


@pytest.mark.parametrize(
    ("endpoint", "allowed"), [("box:8000", ["Xbox"]), ("Xbox:8000", ["box"]), ("[::1]:80", ["X::1"])]
)
def test_only_brackets_are_ignored_when_hosts_are_compared(endpoint, allowed):
    assert not epp.endpoint_matches(endpoint, allowed)


def test_a_replaced_response_chunk_is_a_body_mutation_with_those_bytes() -> None:
    answer = epp.replace_response_chunk(b'data: {"model":"asked"}\n\n')
    assert answer.WhichOneof("response") == "response_body"
    assert answer.response_body.response.body_mutation.WhichOneof("mutation") == "body"
    assert answer.response_body.response.body_mutation.body == b'data: {"model":"asked"}\n\n'
    emptied = epp.replace_response_chunk(b"")  # all of it held back: the chunk goes as nothing
    assert emptied.response_body.response.body_mutation.WhichOneof("mutation") == "body"
