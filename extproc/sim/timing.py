"""Pass-time model of the simulated engine: prefill and decode step durations in milliseconds.

Pure functions, no state. The coefficients are Dynamo's mocker defaults (REFERENCE section 6);
`tests/sim/test_timing.py` pins them with the cold 40,160-token prompt whose TTFT is 828.29 ms.
"""

from __future__ import annotations

PREFILL_QUADRATIC = 4.209989e-7  # ms per token^2
PREFILL_LINEAR = 0.01518344  # ms per token
PREFILL_CONSTANT_MS = 16.50142
DECODE_QUADRATIC = -25.74  # ms per usage^2
DECODE_LINEAR = 54.01  # ms per usage
DECODE_CONSTANT_MS = 5.74
DECODE_MIN_MS = 1.0


def prefill_ms(uncached_tokens: int) -> float:
    """Duration of the prefill part of a pass computing `uncached_tokens` new prefill tokens."""
    t = float(uncached_tokens)
    return PREFILL_QUADRATIC * t * t + PREFILL_LINEAR * t + PREFILL_CONSTANT_MS


def decode_ms(kv_usage: float) -> float:
    """Duration of the decode part of a pass; `kv_usage` is active KV tokens / KV capacity in [0, 1]."""
    u = kv_usage
    return max(DECODE_MIN_MS, DECODE_QUADRATIC * u * u + DECODE_LINEAR * u + DECODE_CONSTANT_MS)
