"""PromptPrefixes: a prompt encoded from a stored prefix of an earlier turn gets the whole prompt's ids."""

from __future__ import annotations

import random

import pytest

from extproc.request.prefix_cache import PromptPrefixes
from extproc.request.tokenizer import HfTokenizer
from tests.request.chat_generator import ChatGenerator
from tests.request.test_piecewise_exactness import FAMILIES, SEED, TOKENIZERS, _check, _Whole

COUNT = 60


def _with_prefixes(family: str, max_bytes: int) -> tuple[HfTokenizer, PromptPrefixes]:
    tokenizer = HfTokenizer(TOKENIZERS / family)
    assert tokenizer.pieces is not None and tokenizer.pieces.prefixes is not None
    prefixes = PromptPrefixes(max_bytes, min_chars=0)  # every prompt: short ones exercise the cut too
    tokenizer.pieces.prefixes = prefixes
    return tokenizer, prefixes


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_from_stored_prefixes_equal_whole_prompt_ids_in_any_order(family: str):
    conversations = ChatGenerator(family, SEED + 1).conversations(COUNT)
    rng = random.Random(f"prefixes:{family}")
    in_order = [(c, turn, rng.random() < 0.1) for c in conversations for turn in range(len(c.requests))]
    whole = _Whole(family)
    tokenizer, prefixes = _with_prefixes(family, 8 << 20)
    results = [
        _check(in_order, tokenizer, whole),
        _check(rng.sample(in_order, len(in_order)), tokenizer, whole),
    ]
    stats = prefixes.stats()
    assert stats.hits > COUNT and stats.hit_tokens > 0 and stats.bytes <= stats.capacity_bytes

    tiny_tokenizer, tiny = _with_prefixes(family, 20_000)
    results.append(_check(rng.sample(in_order, len(in_order)), tiny_tokenizer, whole))
    tiny_stats = tiny.stats()
    assert tiny_stats.evictions > 0 and tiny_stats.bytes <= 20_000
    mismatches = [m for r in results for m in r["mismatches"]]
    assert not mismatches, mismatches[:5]


def test_a_growing_chat_keeps_one_prefix_and_the_bound_holds():
    prefixes = PromptPrefixes(100_000, min_chars=10)
    from array import array

    text = "system<|x|>"
    for turn in range(30):
        text += f"turn {turn} " * 50 + "<|x|>"
        assert prefixes.longest(text + "tail") is None or prefixes.longest(text + "tail")[0] != text
        prefixes.store(text, array("I", range(turn + 1)))
        found = prefixes.longest(text + "tail")
        assert found is not None and found[0] == text
        stats = prefixes.stats()
        assert stats.entries == 1 and stats.bytes <= 100_000
    for k in range(100):  # distinct prompts: evicted, least recently used key first
        prefixes.store(f"{k:04d}" + "y" * 5000, array("I", [k]))
        assert prefixes.stats().bytes <= 100_000
    assert prefixes.stats().evictions > 0
    with pytest.raises(ValueError, match="max_bytes"):
        PromptPrefixes(-1)


def test_the_picker_exposes_the_prefix_cache_metrics():
    from prometheus_client import generate_latest

    from extproc.config import ModelConfig, PickerConfig, WorkerConfig
    from extproc.picker.pipeline import EndpointPicker
    from extproc.router import RouterConfig

    config = PickerConfig(
        router=RouterConfig(),
        workers=(WorkerConfig("w0", "127.0.0.1:8000", "m"),),
        models=(ModelConfig("m", tokenizer=str(TOKENIZERS / "llama3_1")),),
    )
    text = generate_latest(EndpointPicker(config).metrics.registry).decode()
    for name in (
        "lookups_total",
        "hit_tokens_total",
        "evictions_total",
        "bytes",
        "entries",
        "capacity_bytes",
    ):
        assert f'extproc_prompt_prefix_cache_{name}{{model="m"' in text
