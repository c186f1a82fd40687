"""Endpoint-picker protocol: how a decision or an error is said to Envoy. Builds protobufs only.

Follows the Gateway API Inference Extension endpoint-picker protocol v1.0 (REFERENCE section 1):
the destination goes both into the request header `x-gateway-destination-endpoint` (overwriting
any client value) and into dynamic metadata `envoy.lb` / `x-gateway-destination-endpoint`, with
`clear_route_cache`. This is the only module that builds an `ImmediateResponse`, and the one
place where errors become HTTP statuses (`ANSWERS`, with `RETRY_AFTER_S` for the answers worth
retrying soon).

Owned headers (`OWNED_HEADERS`, `owned_headers`): request headers that only the picker may set,
because the worker's side acts on them (`x-prefill-endpoint` makes the decode side send the prompt to
that address; `x-data-parallel-rank` picks the engine's rank). Every routing answer removes a
client's copies of those it does not set itself (`HeaderMutation.remove_headers`), routed and
untracked requests alike, in both body modes; our Envoy templates strip the same list before the
picker runs (`extproc/devstack/envoy_config.py` renders it from here), which also covers requests
that `failopen` sends without the picker. Input headers (`INPUT_HEADERS`: the objective a request
names, the model it is to be sent as, its fairness id) reach the picker and are removed by its
routing answers, never sent to the worker.

Error answers are OpenAI-style JSON, `{"error": {"message", "type", "param", "code"}}` (vLLM's
ErrorResponse: `code` is the HTTP status), with the reason in `x-gateway-request-dropped-reason`;
our Envoy templates give Envoy's own local replies the same shape (`local_reply_config`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

from extproc import errors
from extproc.router import errors as router_errors

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
CONFORMANCE_SELECTION_HEADER = "test-epp-endpoint-selection"
CONFORMANCE_SERVED_HEADER = "x-conformance-test-served-endpoint"
DROPPED_REASON_HEADER = "x-gateway-request-dropped-reason"
WORKER_HEADER = "x-extproc-worker"
DP_RANK_HEADER = "x-data-parallel-rank"  # vLLM's header for pinning a data-parallel rank
DEFAULT_PREFILL_HEADER = "x-prefill-endpoint"  # --prefill-endpoint-header's default
RETRY_AFTER_HEADER = "retry-after"
# Request headers the picker owns, besides the configurable prefill endpoint header: see the docstring.
OWNED_HEADERS: frozenset[str] = frozenset({DESTINATION_HEADER, SERVED_KEY, DP_RANK_HEADER, WORKER_HEADER})
# Request headers that tell the picker something and stop there (the worker has no use for them):
# every routing answer removes them, as the Inference Extension's picker strips its input headers.
INPUT_HEADERS: frozenset[str] = frozenset(
    {"x-gateway-inference-objective", "x-gateway-model-name-rewrite", "x-gateway-inference-fairness-id"}
)
MAX_STREAMED_CHUNK = 62 * 1024  # Envoy accepts streamed body answers up to ~64 KiB per message

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

# error class -> (HTTP status, dropped-reason); first match in order wins
ANSWERS: tuple[tuple[type[BaseException], int, str], ...] = (
    (errors.BodyTooLarge, 413, "body-too-large"),
    (errors.PromptTooLong, 413, "prompt-too-long"),
    (errors.RequestInvalid, 400, "invalid-request"),
    (errors.UnknownModel, 404, "unknown-model"),
    (errors.NoEligibleWorker, 503, "rejected-no-endpoints"),
    (errors.TooManyStreams, 429, "rejected-too-many-streams"),
    (errors.ShuttingDown, 503, "rejected-shutting-down"),
    (router_errors.NoWorkers, 503, "rejected-no-endpoints"),
    (router_errors.AllWorkersBusy, 503, "rejected-saturated"),
    (router_errors.PinnedWorkerUnavailable, 503, "rejected-pinned-unavailable"),
    (router_errors.QueueTimeout, 503, "rejected-queue-timeout"),  # 429 when sheddable: see status_of
)
# Seconds a client should wait before retrying, by reason (`retry-after`): only where a retry soon
# may be served. A stream slot or a busy worker frees as soon as requests end, and a picker that
# stops has replicas or a successor, so 1 s; a queue timeout means the request already waited the
# whole queue bound without capacity freeing, so the overload is not momentary: 5 s. The other
# reasons are the request's own fault or the deployment's.
RETRY_AFTER_S: dict[str, int] = {
    "rejected-too-many-streams": 1,
    "rejected-saturated": 1,
    "rejected-shutting-down": 1,
    "rejected-queue-timeout": 5,
    "shed-queue-timeout": 5,
}
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "BadRequestError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def owned_headers(prefill_header: str = DEFAULT_PREFILL_HEADER) -> frozenset[str]:
    """Every request header the picker owns: `OWNED_HEADERS` and the prefill endpoint header
    (`--prefill-endpoint-header`), lower-cased."""
    return OWNED_HEADERS | {prefill_header.strip().lower()}


def error_type(status: int) -> str:
    """The OpenAI-style `error.type` of an HTTP status (vLLM's names)."""
    return _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and dropped-reason for an error (500 for anything unexpected)."""
    if isinstance(exc, router_errors.QueueTimeout) and exc.sheddable:
        return 429, "shed-queue-timeout"
    for cls, status, reason in ANSWERS:
        if isinstance(exc, cls):
            return status, reason
    return 500, "internal-error"


def error_answer(exc: BaseException) -> pb.ProcessingResponse:
    """An ImmediateResponse with an OpenAI-style JSON error body."""
    status, reason = status_of(exc)
    # the picker's errors are written for clients, and the router's that have an answer; any other
    # text (even a `message` attribute, as aiohttp's errors carry) stays in the log
    if isinstance(exc, errors.PickerError):
        message = exc.message
    elif isinstance(exc, router_errors.RouterError) and status != 500:
        message = str(exc)
    else:
        message = "internal error in the picker"
    return immediate_response(status, message, reason)


def immediate_response(status: int, message: str, reason: str) -> pb.ProcessingResponse:
    """An ImmediateResponse: OpenAI-style JSON error, the reason header, `retry-after` if it helps."""
    body = json.dumps(
        {"error": {"message": message, "type": error_type(status), "param": None, "code": status}}
    ).encode()
    set_headers = [_header("content-type", "application/json"), _header(DROPPED_REASON_HEADER, reason)]
    if reason in RETRY_AFTER_S:
        set_headers.append(_header(RETRY_AFTER_HEADER, str(RETRY_AFTER_S[reason])))
    headers = pb.HeaderMutation(set_headers=set_headers)
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status), headers=headers, body=body, details=reason
        )
    )


def extend_message_timeout(seconds: float) -> pb.ProcessingResponse:
    """Ask Envoy to wait this long for the answer to the current message (bounded by the filter's
    `max_message_timeout`); Envoy ignores every other field of this response."""
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(int(seconds * 1000))
    return pb.ProcessingResponse(override_message_timeout=timeout)


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def _routing_common(
    endpoint: str, extra_headers: Mapping[str, str], owned: Collection[str] | None
) -> pb.CommonResponse:
    """Set the destination and the pick's headers; remove every other owned header a client sent
    (`owned`: `owned_headers()` when None)."""
    owned = owned_headers() if owned is None else owned
    set_headers = [_header(DESTINATION_HEADER, endpoint)]
    set_headers += [_header(k, v) for k, v in extra_headers.items()]
    kept = {DESTINATION_HEADER, *(k.lower() for k in extra_headers)}
    remove = sorted(h for h in {*owned, *INPUT_HEADERS} if h not in kept)
    return pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=set_headers, remove_headers=remove),
        clear_route_cache=True,
    )


def _lb_metadata(key: str, endpoint: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.fields[LB_NAMESPACE].struct_value.fields[key].string_value = endpoint
    return metadata


def route_in_headers(
    endpoint: str, extra_headers: Mapping[str, str], owned: Collection[str] | None = None
) -> pb.ProcessingResponse:
    """The routing answer to the request-headers message (no body, or duplex mode); removes a
    client's copies of the `owned` headers the pick does not set."""
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=_routing_common(endpoint, extra_headers, owned)),
        dynamic_metadata=_lb_metadata(DESTINATION_HEADER, endpoint),
    )


def route_in_body(
    endpoint: str,
    extra_headers: Mapping[str, str],
    owned: Collection[str] | None = None,
    body: bytes | None = None,
) -> pb.ProcessingResponse:
    """The routing answer to a BUFFERED body: the header mutation rides on the body response.
    `body`: the body to send instead (a model rewrite), with its content-length, which Envoy leaves
    to the processor in this mode (a wrong one: Envoy refuses the mutation)."""
    if body is not None:
        extra_headers = {**extra_headers, "content-length": str(len(body))}
    common = _routing_common(endpoint, extra_headers, owned)
    if body is not None:
        common.body_mutation.body = body
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common),
        dynamic_metadata=_lb_metadata(DESTINATION_HEADER, endpoint),
    )


def streamed_body(body: bytes, *, end_of_stream: bool) -> Iterable[pb.ProcessingResponse]:
    """Echo a duplex-mode body back in chunks of at most MAX_STREAMED_CHUNK bytes."""
    if not body:
        yield _streamed_chunk(b"", end_of_stream)
        return
    for start in range(0, len(body), MAX_STREAMED_CHUNK):
        chunk = body[start : start + MAX_STREAMED_CHUNK]
        last = start + MAX_STREAMED_CHUNK >= len(body)
        yield _streamed_chunk(chunk, end_of_stream and last)


def _streamed_chunk(chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    answer = pb.ProcessingResponse()  # set through the path: a quarter of the nested constructors' cost
    streamed = answer.request_body.response.body_mutation.streamed_response
    streamed.body = chunk
    streamed.end_of_stream = end_of_stream
    return answer


def echo_response_chunk(chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """Answer a duplex-mode response body chunk by passing it through (as given)."""
    answer = pb.ProcessingResponse()
    streamed = answer.response_body.response.body_mutation.streamed_response
    streamed.body = chunk
    streamed.end_of_stream = end_of_stream
    return answer


def replace_response_chunk(chunk: bytes) -> pb.ProcessingResponse:
    """Answer a streamed-mode response body chunk with other bytes (a model name said again)."""
    answer = pb.ProcessingResponse()  # set through the path: a quarter of the nested constructors' cost
    answer.response_body.response.body_mutation.body = chunk
    return answer


CONTINUE_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
CONTINUE_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def served_answer(endpoint: str, *, conformance: bool) -> pb.ProcessingResponse:
    """Response-headers answer: report the served endpoint (and the conformance echo header)."""
    common = pb.CommonResponse()
    if conformance:
        common.header_mutation.set_headers.append(_header(CONFORMANCE_SERVED_HEADER, endpoint))
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=common),
        dynamic_metadata=_lb_metadata(SERVED_KEY, endpoint),
    )


def subset_hint(request: pb.ProcessingRequest) -> list[str] | None:
    """Endpoints the proxy allows (`envoy.lb.subset_hint`), or None when no hint was sent."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        items = []
    return [i.strip() for i in items if i.strip()]


def endpoint_matches(endpoint: str, allowed: Iterable[str]) -> bool:
    """Whether `endpoint` (ip:port) is in `allowed`; a bare IP allows any port."""
    host = endpoint.rsplit(":", 1)[0]
    return any(item in (endpoint, host) or item.strip("[]") == host.strip("[]") for item in allowed)


def format_endpoint(host: str, port: int) -> str:
    """`ip:port`, with IPv6 addresses in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Envoy's header list as a dict (lower-case keys; `raw_value` preferred, as Envoy sends it)."""
    return {
        h.key.lower(): raw.decode("utf-8", "replace") if (raw := h.raw_value) else h.value
        for h in headers.headers.headers
    }
