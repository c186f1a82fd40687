"""Pick: a routed request, as the picker hands it to the ext_proc servicer and follows it to its end.

`ObjectiveLabels` are what the Inference Extension's per-request series (`inference_objective_*`,
`extproc/epp/objective_metrics.py`) are labelled with. A client's text never becomes a label: a
model name is kept only when this picker lists it (a served model, an alias, a LoRA adapter, a
rewrite rule's match), else it is `unlisted`; the priority is an InferenceObjective's, read from
`--inference-resources` (never a body's hint). A request refused once its model was read carries
its labels on the exception (`label_refusal`), so its error is counted under its model too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extproc.router import Worker

UNLISTED = "unlisted"  # a model name this picker does not list, as a label


@dataclass(frozen=True, slots=True)
class ObjectiveLabels:
    model_name: str = ""  # the model its client asked for ("": not read, as for a body that is not JSON)
    target_model_name: str = ""  # the model it was sent as (a rewrite's target, else the same)
    priority: int = 0  # its InferenceObjective's priority (0 without one)


NO_LABELS = ObjectiveLabels()


def pod_name(worker: Worker) -> str:
    """A worker's data-parallel rank as the Inference Extension's series name its pod: llm-d names an
    endpoint `<pod>-rank-<i>`, i its port's index (a data-parallel rank), even when the pod has one."""
    return f"{worker.worker_id}-rank-{worker.dp_rank}"


@dataclass(slots=True)
class Pick:
    """A routed request: where it goes and what the router tracks for it."""

    request_id: str  # the picker's id (unique while in flight)
    model: str
    worker: Worker
    endpoint: str
    headers: dict[str, str]
    overlap_blocks: int = 0
    request_blocks: int = 0
    tracked: bool = False
    timings_ns: dict[str, int] = field(default_factory=dict)
    session_id: str | None = None
    queued_s: float = 0.0  # time spent in the admission queue
    group: str | None = None  # the router group that owns the request
    prefill_worker: Worker | None = None  # disaggregated: the worker that prefills the prompt
    prefill_endpoint: str | None = None  # its ip:port (also in `headers` under the prefill header)
    session_pin: str | None = None  # the session pinned to `worker` once it answers 2xx (not on close)
    session_opened_on: str | None = None  # `endpoint`, when a worker session is open there for it
    session_opened_new: bool = False  # this request opened it (not already open): closed if refused
    session_close_on: str | None = None  # `endpoint`, when its session is closed there once it ends
    responses_api: bool = False  # POST /v1/responses: its answer's id is remembered (`response_stored`)
    response_id: str | None = None  # that id when the request named it (vLLM's `request_id` field)
    started_ns: int = 0  # perf_counter_ns when its decision began (0: untracked)
    first_token_ns: int = 0  # perf_counter_ns of its first streamed token (0: none yet)
    output_tokens: int = 0  # tokens generated per sequence, as counted (--router-track-output-blocks)
    body: bytes | None = None  # the body as sent upstream when the picker rewrote it (a model rewrite)
    # (the model it was sent as, the one its client named) when they differ: its answer says the
    # second again
    renamed: tuple[str, str] | None = None
    prompt_tokens: int = 0  # its prompt's tokens as tokenized here (0: routed on load alone)
    sequences: int = 1  # sequences generated from its prompt (the request's `n`)
    predicted_ttft_ms: float | None = None  # its time to first token as its router predicted it
    labels: ObjectiveLabels = NO_LABELS  # for the per-request series: a request that named a model

    @property
    def counted(self) -> bool:
        """Whether the per-request series count it: it named a model (not GET /v1/models, /health)."""
        return self.labels is not NO_LABELS


def label_refusal(exc: BaseException, labels: ObjectiveLabels) -> None:
    """Mark `exc`, raised for a request whose model was read, with that request's labels."""
    exc.objective_labels = labels  # type: ignore[attr-defined]


def refusal_labels(exc: BaseException) -> ObjectiveLabels:
    """The labels `label_refusal` put on `exc`; none when it was raised before the model was read."""
    labels = getattr(exc, "objective_labels", NO_LABELS)
    return labels if isinstance(labels, ObjectiveLabels) else NO_LABELS
