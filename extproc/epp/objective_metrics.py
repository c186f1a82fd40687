"""The Inference Extension's per-request series, as its endpoint picker names them, so a dashboard or
alert built on GIE's or llm-d's picker (and llm-d's own end-to-end test) reads ours unchanged.

Kept by the ext_proc servicer from what each stream shows; rendered at scrape time. Names, label
names, meanings and bucket bounds are those of llm-d's picker (`pkg/epp/metrics/metrics.go` and
`handlers/server.go`, read at llm-d-inference-scheduler 520af47):

    inference_objective_request_total{model_name, target_model_name, priority}   requests routed
    inference_objective_request_error_total{model_name, target_model_name, error_code}
        requests that failed, once each: refused by the picker (its status as the Inference
        Extension's code: BadRequest, NotFound, ResourceExhausted, ServiceUnavailable, ...) or
        answered non-2xx by the worker (ModelServerError; Envoy's 503 when it could not connect too)
    inference_objective_running_requests{model_name}        routed and not yet ended
    inference_objective_request_sizes{...}                  request body bytes, when routed
    inference_objective_request_duration_seconds{...}       from the stream's start to the answer's end
    inference_objective_response_sizes{...}                 answer body bytes, as the worker sent them
    inference_objective_input_tokens{...}                   prompt tokens
    inference_objective_output_tokens{...}                  generated tokens
    inference_objective_prompt_cached_tokens{...}           prompt tokens the engine found cached
    inference_objective_normalized_time_per_output_token_seconds{...}   duration / output tokens
    inference_objective_request_ttft_seconds{...}           from the stream's start to the first token
    inference_objective_request_tpot_seconds{...}           from the first token to the answer's end,
                                                            over the tokens after the first (per sequence,
                                                            rounded up: it ends with its longest)
    inference_objective_request_predicted_ttft_seconds{...} the time to first token the router predicted
                                                            (its timing or aic prefill model: the default)

(`{...}` is `{model_name, target_model_name}`.) The first four are counted when a request is routed
and ends (a refused one only in the errors); the others when a routed request's 2xx answer ends,
the last three only for an answer that streamed its tokens (server-sent events: a whole answer has
no first token of its own) and, for the time per token, whose output tokens are known; the
predicted time only where the deciding router group's prefill model predicted one (not `none`), for
the same answers as the measured one, so the two compare like with like. The prediction starts at
the decision, the measured time at the stream's start: a wait in the admission queue (its own
series, `extproc/picker/flow_metrics.py`) and the parsing before are in the second only.
An error answer, a cancelled or reset stream are not in those six (the Inference Extension's picker
times error answers too: here a fast error does not pull the latency percentiles down). Token
counts are the engine's `usage` (`epp.usage`): a streamed answer has one when its client asked
with `stream_options.include_usage`. Without it, input tokens are the prompt as tokenized here
(exact where the picker tokenizes as the engine does) and output tokens are those counted from the
stream under `--router-track-output-blocks`; else none is observed, as there. Cached tokens only
come from the engine (vLLM says them with `--enable-prompt-tokens-details`).

Labels never hold a client's text (`extproc.picker.pick.ObjectiveLabels`): a model this picker
does not list is `unlisted`; a request refused before its model was read has `model_name=""`.
Every request that names a model counts (embeddings and the other requests routed on load alone
too, as there); one that names none (GET /v1/models, /health) does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from extproc.picker.metrics import LabelledCounts, LabelledHistogram
from extproc.picker.pick import ObjectiveLabels

MODEL_SERVER_ERROR = "ModelServerError"
# the picker's error answers, by HTTP status, as the Inference Extension's error codes
ERROR_CODES: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    413: "BadRequest",  # a body or prompt over the limit: the request's own fault
    429: "ResourceExhausted",
    500: "Internal",
    503: "ServiceUnavailable",
}
UNKNOWN_ERROR = "Unknown"

_LATENCY = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45,
    60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
_REQUEST_BYTES = tuple(2**n for n in range(6, 31))  # 64 B to 1 GiB
# as there, 32778 (not 32768) included: the same bounds keep quantiles comparable across pickers
_RESPONSE_BYTES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
_INPUT_TOKENS = (*_RESPONSE_BYTES, 131072, 262144, 524288, 1048576)
_OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1,
    1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_MODELS = ("model_name", "target_model_name")
# series (after `inference_objective_`) -> its HELP and, for a histogram, its bucket bounds
HELP: dict[str, str] = {
    "request": "Requests routed, per model asked for, model sent as and objective priority.",
    "request_error": (
        "Requests that failed, once each, per model and error code (ModelServerError: a non-2xx answer "
        "from the worker)."
    ),
    "running_requests": "Requests routed and not yet ended, per model asked for.",
}
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "request_sizes": ("Request body sizes in bytes.", _REQUEST_BYTES),
    "request_duration_seconds": ("Seconds from a request's arrival to its answer's end.", _LATENCY),
    "response_sizes": ("Answer body sizes in bytes, as the worker sent them.", _RESPONSE_BYTES),
    "input_tokens": ("Prompt tokens per answered request.", _INPUT_TOKENS),
    "output_tokens": ("Generated tokens per answered request.", _OUTPUT_TOKENS),
    "prompt_cached_tokens": ("Prompt tokens the engine found cached, per answered request.", _INPUT_TOKENS),
    "normalized_time_per_output_token_seconds": (
        "A request's duration divided by its generated tokens.",
        _NTPOT,
    ),
    "request_ttft_seconds": ("Seconds from a streamed request's arrival to its first token.", _LATENCY),
    "request_predicted_ttft_seconds": (
        "Per streamed answer: its time to first token as the router predicted it when it chose the worker.",
        _LATENCY,
    ),
    "request_tpot_seconds": (
        "Per streamed answer: seconds between its tokens after the first (per sequence, rounded up), on "
        "average.",
        _TPOT,
    ),
}


def error_code(status: int) -> str:
    """The Inference Extension's code for an error answer of HTTP `status`."""
    return ERROR_CODES.get(status, UNKNOWN_ERROR)


def _histogram(name: str) -> LabelledHistogram:
    documentation, buckets = HISTOGRAMS[name]
    return LabelledHistogram(f"inference_objective_{name}", documentation, _MODELS, buckets)


class ObjectiveMetrics:
    """The series above, as plain numbers per label tuple."""

    def __init__(self) -> None:
        self.requests = LabelledCounts("inference_objective_request", HELP["request"], [*_MODELS, "priority"])
        self.errors = LabelledCounts(
            "inference_objective_request_error", HELP["request_error"], [*_MODELS, "error_code"]
        )
        self.running: Counter[str] = Counter()
        self.request_bytes = _histogram("request_sizes")
        self.duration = _histogram("request_duration_seconds")
        self.response_bytes = _histogram("response_sizes")
        self.input_tokens = _histogram("input_tokens")
        self.output_tokens = _histogram("output_tokens")
        self.cached_tokens = _histogram("prompt_cached_tokens")
        self.ntpot = _histogram("normalized_time_per_output_token_seconds")
        self.ttft = _histogram("request_ttft_seconds")
        self.predicted_ttft = _histogram("request_predicted_ttft_seconds")
        self.tpot = _histogram("request_tpot_seconds")

    def routed(self, labels: ObjectiveLabels, request_bytes: int) -> None:
        models = (labels.model_name, labels.target_model_name)
        self.requests.values[(*models, str(labels.priority))] += 1
        self.request_bytes.observe(models, request_bytes)
        self.running[labels.model_name] += 1

    def ended(self, labels: ObjectiveLabels) -> None:
        """A routed request's stream ended, however (once per routed request)."""
        self.running[labels.model_name] -= 1

    def failed(self, labels: ObjectiveLabels, code: str) -> None:
        self.errors.values[labels.model_name, labels.target_model_name, code] += 1

    def answered(
        self,
        labels: ObjectiveLabels,
        duration_s: float,
        response_bytes: int,
        input_tokens: int | None,
        output_tokens: int | None,
        cached_tokens: int | None,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        predicted_ttft_s: float | None = None,
    ) -> None:
        """A routed request's 2xx answer ended; token counts None where unknown; its first token's
        time and the time per token after it None unless it streamed tokens."""
        models = (labels.model_name, labels.target_model_name)
        self.duration.observe(models, duration_s)
        self.response_bytes.observe(models, response_bytes)
        if input_tokens:
            self.input_tokens.observe(models, input_tokens)
        if output_tokens:
            self.output_tokens.observe(models, output_tokens)
            self.ntpot.observe(models, duration_s / output_tokens)
        if cached_tokens is not None:
            self.cached_tokens.observe(models, cached_tokens)
        if ttft_s is not None:
            self.ttft.observe(models, ttft_s)
            if predicted_ttft_s is not None:
                self.predicted_ttft.observe(models, predicted_ttft_s)
        if tpot_s is not None:
            self.tpot.observe(models, tpot_s)

    def collect(self) -> Iterator[Metric]:
        yield from self.requests.collect()
        yield from self.errors.collect()
        running = GaugeMetricFamily(
            "inference_objective_running_requests", HELP["running_requests"], labels=["model_name"]
        )
        for model, count in sorted(self.running.items()):
            running.add_metric([model], count)
        yield running
        for family in (
            self.request_bytes, self.duration, self.response_bytes, self.input_tokens,
            self.output_tokens, self.cached_tokens, self.ntpot, self.ttft, self.tpot,
            self.predicted_ttft,
        ):  # fmt: skip
            yield from family.collect()
