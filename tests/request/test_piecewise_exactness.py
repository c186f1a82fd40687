"""Piecewise encoding gives the ids of a whole-prompt encoding, on generated conversations, in any order.

For each real tokenizer in `../shared/tokenizers/`, every request of `EXACTNESS_CONVERSATIONS` (default 100;
the opt-in run takes 1,000 or more: `EXTPROC_EXACTNESS_CONVERSATIONS=1000 pytest -s` this file) generated
conversations (`chat_generator.py`) is encoded with the piece cache and without it (the whole prompt, as
before), and the ids must be equal: turns in order, then all requests shuffled into one cache warmed by
the others, then shuffled through a cache so small that it evicts all the time, with and without the
post-processor's special tokens. Prints one JSON line of counts per tokenizer (seen with `-s`).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from extproc.errors import TokenizerUnavailable
from extproc.request.tokenizer import HfTokenizer
from tests.request.chat_generator import ChatGenerator, Conversation

TOKENIZERS = Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
FAMILIES = ("qwen3", "llama3_1")
COUNT = int(os.environ.get("EXTPROC_EXACTNESS_CONVERSATIONS", "100"))
SEED = 21


Request = tuple[Conversation, int, bool]  # a conversation, which of its requests, add_special_tokens


class _Whole:
    """The whole-prompt ids of each request (the reference), computed once."""

    def __init__(self, family: str) -> None:
        self.tokenizer = HfTokenizer(TOKENIZERS / family, piece_cache_bytes=0)
        self.ids: dict[tuple[int, int, bool], list[int] | None] = {}

    def __call__(self, conv: Conversation, turn: int, add: bool) -> list[int] | None:
        key = (conv.index, turn, add)
        if key not in self.ids:
            try:
                self.ids[key] = self.tokenizer.encode_chat(conv.requests[turn], **_kwargs(conv, add))
            except TokenizerUnavailable:
                self.ids[key] = None
        return self.ids[key]


def _kwargs(conv: Conversation, add: bool) -> dict[str, Any]:
    return {"tools": conv.tools, "chat_template_kwargs": conv.kwargs, "add_special_tokens": add}


def _check(requests: list[Request], tokenizer: HfTokenizer, whole: _Whole) -> dict[str, Any]:
    counts: dict[str, Any] = {"requests": 0, "tokens": 0, "refused_by_template": 0, "mismatches": []}
    for conv, turn, add in requests:
        expected = whole(conv, turn, add)
        if expected is None:
            with pytest.raises(TokenizerUnavailable):  # the same refusal on both paths
                tokenizer.encode_chat(conv.requests[turn], **_kwargs(conv, add))
            counts["refused_by_template"] += 1
            continue
        got = tokenizer.encode_chat(conv.requests[turn], **_kwargs(conv, add))
        counts["requests"] += 1
        counts["tokens"] += len(expected)
        if got != expected:
            at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            counts["mismatches"].append(f"conversation {conv.index} request {turn}: first difference at {at}")
    return counts


@pytest.mark.parametrize("family", FAMILIES)
def test_piecewise_ids_equal_whole_prompt_ids_in_any_order(family: str):
    conversations = ChatGenerator(family, SEED).conversations(COUNT)
    rng = random.Random(f"{SEED}:{family}")
    in_order = [(c, turn, rng.random() < 0.1) for c in conversations for turn in range(len(c.requests))]
    whole = _Whole(family)

    tokenizer = HfTokenizer(TOKENIZERS / family)
    assert tokenizer.pieces is not None, tokenizer.piecewise_off_reason
    results = {
        "in_order": _check(in_order, tokenizer, whole),
        # the same cache, now warm from every conversation, in an order no client sends
        "shuffled_warm": _check(rng.sample(in_order, len(in_order)), tokenizer, whole),
    }
    stats = tokenizer.piece_cache_stats()
    assert stats is not None and stats.hits > 0 and stats.evictions == 0

    tiny = HfTokenizer(TOKENIZERS / family, piece_cache_bytes=64 * 1024)
    results["shuffled_evicting"] = _check(rng.sample(in_order, len(in_order)), tiny, whole)
    tiny_stats = tiny.piece_cache_stats()
    assert tiny_stats is not None and tiny_stats.evictions > 0 and tiny_stats.bytes <= 64 * 1024

    mismatches = [m for r in results.values() for m in r["mismatches"]]
    summary = {
        "family": family,
        "conversations": COUNT,
        "requests_compared": sum(r["requests"] for r in results.values()),
        "tokens_compared": sum(r["tokens"] for r in results.values()),
        "refused_by_template": sum(r["refused_by_template"] for r in results.values()),
        "mismatches": len(mismatches),
    }
    print(json.dumps(summary))
    assert not mismatches, mismatches[:5]
    assert summary["requests_compared"] >= COUNT
