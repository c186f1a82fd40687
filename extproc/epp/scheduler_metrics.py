"""The Inference Extension's scheduler and prefix-cache series, as its endpoint picker names them, so a
dashboard or alert built on GIE's or llm-d's picker reads ours unchanged.

Names, label names, meanings and bucket bounds are those of llm-d's picker (`pkg/epp/metrics/metrics.go`,
`scheduling/scheduler.go` and the approximate prefix plugin, read at llm-d-inference-scheduler 520af47):

    inference_extension_scheduler_e2e_duration_seconds            one decision, from the hashing of its
        prompt's blocks to the chosen worker (the router's stages; parsing, tokenizing and the
        admission queue's wait are not the scheduler's there either)
    inference_extension_scheduler_attempts_total{status, target_model_name, pod_name, namespace, port}
        decisions: `success` with the chosen worker (a pod is `<worker>-rank-<dp rank>`, as the pool
        series name it; `namespace` is `--pool-namespace`; `port` the endpoint's), or `failure` with
        the three left empty (no worker could take it: none eligible, all busy, no router group)
    inference_extension_prefix_indexer_hit_ratio                  per decision on a tokenized prompt: its
        blocks cached on the chosen worker, over its blocks
    inference_extension_prefix_indexer_hit_bytes                  the same match in bytes, counted as
        there: matched tokens x 4 characters a token (the plugin's own constant)

`inference_extension_prefix_indexer_size` is rendered at scrape time from the routers
(`extproc/admin/inference_extension_metrics.py`). A request routed on load alone (no prompt to
match) has no prefix match; an untracked one (embeddings and the like, chosen without the router's
stages) is not timed either. `target_model_name` is the model the request was sent as, as the
per-request series label it (`extproc.picker.pick.ObjectiveLabels`: never a client's text).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from extproc.config import PickerConfig
from extproc.errors import NoEligibleWorker
from extproc.groups.errors import GroupError
from extproc.picker.metrics import LabelledCounts, LabelledHistogram
from extproc.picker.pick import Pick, pod_name, refusal_labels
from extproc.router.errors import AllWorkersBusy, NoWorkers, PinnedWorkerUnavailable

CHARACTERS_PER_TOKEN = 4  # the Inference Extension's prefix plugin: bytes counted per matched token
SUCCESS, FAILURE = "success", "failure"
# the router's stages: what the Inference Extension's scheduler does (filter, score, pick)
DECISION_STAGES = frozenset({"hash", "match", "select", "groups"})

# what the Inference Extension's scheduler fails with: no endpoint could take the request (a bad
# request, an unknown model, the admission queue's timeout never reach its scheduler there)
SCHEDULING_FAILURES = (NoEligibleWorker, NoWorkers, AllWorkersBusy, PinnedWorkerUnavailable, GroupError)
_DECISION_SECONDS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_ATTEMPT_LABELS = ("status", "target_model_name", "pod_name", "namespace", "port")


def decision_seconds(timings_ns: Mapping[str, int]) -> float | None:
    """The scheduler's part of a request's stage timings (`Pick.timings_ns`); None when they hold
    none (a request routed untracked, on load alone, is not timed)."""
    stages = [ns for stage, ns in timings_ns.items() if stage in DECISION_STAGES]
    return sum(stages) / 1e9 if stages else None


# series -> its HELP (what a person reads in a metrics browser)
HELP: dict[str, str] = {
    "inference_extension_scheduler_e2e_duration_seconds": (
        "Seconds one routing decision took, from hashing the prompt's blocks to the chosen worker."
    ),
    "inference_extension_scheduler_attempts": (
        "Routing decisions, by outcome and, for a success, the chosen pod (a worker's dp rank)."
    ),
    "inference_extension_prefix_indexer_hit_ratio": (
        "Per decision on a tokenized prompt: its blocks cached on the chosen worker, over its blocks."
    ),
    "inference_extension_prefix_indexer_hit_bytes": (
        f"Per decision on a tokenized prompt: its cached prefix on the chosen worker, as tokens x "
        f"{CHARACTERS_PER_TOKEN} bytes."
    ),
}


def _histogram(name: str, buckets: tuple[float, ...]) -> LabelledHistogram:
    return LabelledHistogram(name, HELP[name], (), buckets)


class SchedulerMetrics:
    """The series above, as plain numbers per label tuple (rendered with the servicer's)."""

    def __init__(self, namespace: str = "", block_size: int = 16) -> None:
        self.namespace = namespace  # the pool's (`--pool-namespace`), as every success's label
        self.block_size = block_size  # tokens a block holds (`--router-block-size`)
        self.duration = _histogram("inference_extension_scheduler_e2e_duration_seconds", _DECISION_SECONDS)
        name = "inference_extension_scheduler_attempts"
        self.attempts = LabelledCounts(name, HELP[name], _ATTEMPT_LABELS)
        self.hit_ratio = _histogram("inference_extension_prefix_indexer_hit_ratio", _RATIO)
        self.hit_bytes = _histogram("inference_extension_prefix_indexer_hit_bytes", _HIT_BYTES)

    def scheduled(self, pick: Pick) -> None:
        """A decision chose `pick.worker`; a pick routed on load alone has no prompt blocks."""
        port = pick.endpoint.rpartition(":")[2]
        pod = pod_name(pick.worker)
        self.attempts.values[SUCCESS, pick.labels.target_model_name, pod, self.namespace, port] += 1
        seconds = decision_seconds(pick.timings_ns)
        if seconds is not None:
            self.duration.observe((), seconds)
        if pick.request_blocks and pick.prompt_tokens:
            self.hit_ratio.observe((), pick.overlap_blocks / pick.request_blocks)
            self.hit_bytes.observe((), pick.overlap_blocks * self.block_size * CHARACTERS_PER_TOKEN)

    def refused(self, exc: BaseException) -> None:
        """The picker refused a request with `exc`: a failed attempt when no worker could take it
        (none eligible, all busy, no router group answered)."""
        if isinstance(exc, SCHEDULING_FAILURES):
            self.attempts.values[FAILURE, refusal_labels(exc).target_model_name, "", "", ""] += 1

    def collect(self) -> Iterator[Metric]:
        for family in (self.duration, self.attempts, self.hit_ratio, self.hit_bytes):
            yield from family.collect()


def for_picker(picker: object) -> SchedulerMetrics:
    """The series for `picker`, labelled with its config's pool namespace and block size (the
    defaults for a picker without a `PickerConfig`, as in tests)."""
    config = getattr(picker, "config", None)
    if not isinstance(config, PickerConfig):
        return SchedulerMetrics()
    return SchedulerMetrics(config.inference_extension.pool.namespace or "", config.router.block_size)
