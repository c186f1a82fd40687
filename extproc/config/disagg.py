"""Disaggregated prefill/decode serving: which header names the prefill worker, when a prompt is worth
prefilling remotely, and the prefill workers' health probe -> `DisaggConfig`. The file section is
`disagg:`. Active for a model that has `role: prefill` workers (workers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extproc.config.options import ConfigError, Option, Reader, _float_or_none, check_at_least_zero
from extproc.router import DisaggPolicy

SECTION = "disagg"


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """Disaggregated prefill/decode serving: active for a model that has prefill workers."""

    prefill_header: str = "x-prefill-endpoint"  # tells the decode side where to prefill
    min_remote_prefill_tokens: int = 256  # prefill locally when fewer prompt tokens are uncached
    max_decode_prefix_frac: float = 0.8  # prefill locally when the decode worker caches this much
    decode_overlap_weight: float | None = None  # decode stage's overlap weight (None: the router's)
    prefill_health_interval_s: float = 2.0  # GET /health of prefill workers; 0 = off

    @property
    def policy(self) -> DisaggPolicy:
        """The router core's view: when to prefill remotely, and the decode stage's weight."""
        return DisaggPolicy(
            self.min_remote_prefill_tokens, self.max_decode_prefix_frac, self.decode_overlap_weight
        )


PREFILL_ENDPOINT_HEADER = Option(
    "--prefill-endpoint-header",
    str,
    "x-prefill-endpoint",
    "Disaggregated serving (a model with `role: prefill` workers): request header that names the "
    "chosen prefill worker (ip:port) to the decode worker's side.",
)
DISAGG_MIN_REMOTE_PREFILL_TOKENS = Option(
    "--disagg-min-remote-prefill-tokens",
    int,
    256,
    "Prefill on the decode worker itself when fewer prompt tokens than this are uncached there.",
)
DISAGG_MAX_DECODE_PREFIX_FRAC = Option(
    "--disagg-max-decode-prefix-frac",
    float,
    0.8,
    "Prefill on the decode worker itself when it already caches at least this fraction of the prompt.",
)
DISAGG_DECODE_OVERLAP_WEIGHT = Option(
    "--disagg-decode-overlap-weight",
    _float_or_none,
    None,
    "Overlap weight when choosing the decode worker of a disaggregated model (default: the router's "
    "--router-kv-overlap-score-weight; 0 is Dynamo's decode stage: balance decode load only).",
)
PREFILL_HEALTH_INTERVAL_SECS = Option(
    "--prefill-health-interval-secs",
    float,
    2.0,
    "Probe each prefill worker's GET /health this often; one that fails is not named in the prefill "
    "header until it answers again. 0 turns probing off.",
)

DISAGG_OPTIONS: tuple[Option[Any], ...] = (
    PREFILL_ENDPOINT_HEADER,
    DISAGG_MIN_REMOTE_PREFILL_TOKENS,
    DISAGG_MAX_DECODE_PREFIX_FRAC,
    DISAGG_DECODE_OVERLAP_WEIGHT,
    PREFILL_HEALTH_INTERVAL_SECS,
)


def read_disagg(reader: Reader) -> DisaggConfig:
    """The disaggregation settings; the header name lower-cased. Raises ConfigError."""
    read = reader.read
    disagg = DisaggConfig(
        prefill_header=read(PREFILL_ENDPOINT_HEADER).strip().lower(),
        min_remote_prefill_tokens=read(DISAGG_MIN_REMOTE_PREFILL_TOKENS),
        max_decode_prefix_frac=read(DISAGG_MAX_DECODE_PREFIX_FRAC),
        decode_overlap_weight=read(DISAGG_DECODE_OVERLAP_WEIGHT),
        prefill_health_interval_s=read(PREFILL_HEALTH_INTERVAL_SECS),
    )
    header = disagg.prefill_header
    if not header or any(c.isspace() or c == ":" for c in header):
        raise ConfigError(f"invalid prefill-endpoint-header={header!r}: expected a header name")
    check_at_least_zero("disagg-min-remote-prefill-tokens", disagg.min_remote_prefill_tokens)
    if not 0 <= disagg.max_decode_prefix_frac <= 1:
        raise ConfigError(
            f"invalid disagg-max-decode-prefix-frac={disagg.max_decode_prefix_frac}: "
            "expected a fraction in [0, 1]"
        )
    check_at_least_zero("prefill-health-interval-secs", disagg.prefill_health_interval_s)
    weight = disagg.decode_overlap_weight
    if weight is not None and not 0 <= weight < float("inf"):
        raise ConfigError(f"invalid disagg-decode-overlap-weight={weight}: expected a number >= 0")
    return disagg
