"""Pass-time model: the REFERENCE section 6 check values."""

import pytest

from extproc.sim.timing import decode_ms, prefill_ms


def test_cold_40160_token_prompt_in_8192_token_chunks_has_ttft_828_29_ms():
    chunks = [8192] * 4 + [7392]
    assert sum(chunks) == 40_160
    assert sum(prefill_ms(c) for c in chunks) == pytest.approx(828.29, abs=0.005)


@pytest.mark.parametrize(
    "tokens, expected_ms",
    [(0, 16.50142), (1, 16.5166038), (8192, 169.1369184)],
)
def test_prefill_ms_is_quadratic_in_uncached_tokens(tokens, expected_ms):
    assert prefill_ms(tokens) == pytest.approx(expected_ms, abs=1e-6)


@pytest.mark.parametrize(
    "usage, expected_ms",
    [(0.0, 5.74), (0.5, -25.74 * 0.25 + 54.01 * 0.5 + 5.74), (1.0, 34.01)],
)
def test_decode_ms_follows_kv_usage(usage, expected_ms):
    assert decode_ms(usage) == pytest.approx(expected_ms)


def test_decode_ms_never_below_one_ms():
    assert decode_ms(-1.0) == 1.0
