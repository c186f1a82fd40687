"""Prometheus metrics of the tokenizers' piece caches, read from their counters at scrape time.

The request path only adds to plain integers (`TokenCache`); this renders them, per model:
- `extproc_tokenizer_cache_lookups_total{model, result}`: pieces found (hit) or not (miss);
- `extproc_tokenizer_cache_tokens_total{model, result}`: prompt tokens served from the cache (hit) or
  encoded (miss): their ratio is the share of tokenization work saved;
- `extproc_tokenizer_cache_evictions_total{model}`: entries dropped to stay within the bound;
- `extproc_tokenizer_cache_bytes{model}`, `extproc_tokenizer_cache_entries{model}` and
  `extproc_tokenizer_cache_capacity_bytes{model}` (`--tokenizer-cache-bytes`).
Models whose tokenizer has no piece cache (remote, byte-level, off, or inexact) are left out.

`BlockHashCacheCollector` renders the router's block-hash prefix cache (`extproc.router.hashing`,
one per process): `extproc_block_hash_cache_lookups_total{result}`,
`extproc_block_hash_cache_blocks_total{result}` (blocks whose hashes came from it, or were hashed),
`extproc_block_hash_cache_evictions_total`, `extproc_block_hash_cache_bytes`,
`extproc_block_hash_cache_entries` and `extproc_block_hash_cache_capacity_bytes`.
`PromptPrefixCollector` renders each model's prompt prefix cache (`prefix_cache.py`):
`extproc_prompt_prefix_cache_lookups_total{model, result}`, `..._hit_tokens_total{model}`,
`..._evictions_total{model}`, `..._bytes{model}`, `..._entries{model}`, `..._capacity_bytes{model}`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.request.prefix_cache import PromptPrefixStats
from extproc.request.token_cache import TokenCacheStats
from extproc.router.hashing import BlockHashCacheStats


class TokenCacheCollector(Collector):
    """Collects each model's piece-cache counters, from `stats()` ({model: stats or None}), on each scrape."""

    def __init__(self, stats: Callable[[], Mapping[str, TokenCacheStats | None]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        model = ["model"]
        lookups = CounterMetricFamily(
            "extproc_tokenizer_cache_lookups",
            "Chat prompt pieces looked up, by result.",
            labels=[*model, "result"],
        )
        tokens = CounterMetricFamily(
            "extproc_tokenizer_cache_tokens",
            "Chat prompt tokens served from the piece cache (hit) or encoded (miss).",
            labels=[*model, "result"],
        )
        evictions = CounterMetricFamily(
            "extproc_tokenizer_cache_evictions",
            "Piece-cache entries evicted to stay within its bound.",
            labels=model,
        )
        size = GaugeMetricFamily(
            "extproc_tokenizer_cache_bytes", "Bytes held by the piece cache.", labels=model
        )
        entries = GaugeMetricFamily(
            "extproc_tokenizer_cache_entries", "Pieces in the piece cache.", labels=model
        )
        capacity = GaugeMetricFamily(
            "extproc_tokenizer_cache_capacity_bytes",
            "The piece cache's bound (--tokenizer-cache-bytes).",
            labels=model,
        )
        for name, stats in self._stats().items():
            if stats is None:
                continue
            lookups.add_metric([name, "hit"], stats.hits)
            lookups.add_metric([name, "miss"], stats.misses)
            tokens.add_metric([name, "hit"], stats.hit_tokens)
            tokens.add_metric([name, "miss"], stats.miss_tokens)
            evictions.add_metric([name], stats.evictions)
            size.add_metric([name], stats.bytes)
            entries.add_metric([name], stats.entries)
            capacity.add_metric([name], stats.capacity_bytes)
        yield from (lookups, tokens, evictions, size, entries, capacity)


class BlockHashCacheCollector(Collector):
    """Collects the block-hash prefix cache's counters, from `stats()`, on each scrape."""

    def __init__(self, stats: Callable[[], BlockHashCacheStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        prefix = "extproc_block_hash_cache"
        lookups = CounterMetricFamily(
            f"{prefix}_lookups", "Prompts looked up in the block-hash prefix cache.", labels=["result"]
        )
        lookups.add_metric(["hit"], stats.hits)
        lookups.add_metric(["miss"], stats.lookups - stats.hits)
        blocks = CounterMetricFamily(
            f"{prefix}_blocks", "Prompt blocks whose hashes came from the cache (hit) or were hashed.",
            labels=["result"],
        )  # fmt: skip
        blocks.add_metric(["hit"], stats.hit_blocks)
        blocks.add_metric(["miss"], stats.miss_blocks)
        yield lookups
        yield blocks
        yield CounterMetricFamily(
            f"{prefix}_evictions", "Prompts evicted to stay within the bound.", value=stats.evictions
        )
        yield GaugeMetricFamily(f"{prefix}_bytes", "Bytes held by the block-hash cache.", value=stats.bytes)
        yield GaugeMetricFamily(f"{prefix}_entries", "Prompts in the block-hash cache.", value=stats.entries)
        yield GaugeMetricFamily(
            f"{prefix}_capacity_bytes", "The block-hash cache's bound.", value=stats.capacity_bytes
        )


class PromptPrefixCollector(Collector):
    """Collects each model's prompt prefix cache counters, from `stats()` ({model: stats or None})."""

    def __init__(self, stats: Callable[[], Mapping[str, PromptPrefixStats | None]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        prefix = "extproc_prompt_prefix_cache"
        lookups = CounterMetricFamily(
            f"{prefix}_lookups",
            "Chat prompts looked up by their prefix, by result.",
            labels=["model", "result"],
        )
        tokens = CounterMetricFamily(
            f"{prefix}_hit_tokens", "Prompt ids copied from a prefix.", labels=["model"]
        )
        evictions = CounterMetricFamily(f"{prefix}_evictions", "Prefixes evicted.", labels=["model"])
        size = GaugeMetricFamily(
            f"{prefix}_bytes", "Bytes held by the prompt prefix cache.", labels=["model"]
        )
        entries = GaugeMetricFamily(f"{prefix}_entries", "Prefixes held.", labels=["model"])
        capacity = GaugeMetricFamily(
            f"{prefix}_capacity_bytes", "The prefix cache's bound.", labels=["model"]
        )
        for name, stats in self._stats().items():
            if stats is None:
                continue
            lookups.add_metric([name, "hit"], stats.hits)
            lookups.add_metric([name, "miss"], stats.lookups - stats.hits)
            tokens.add_metric([name], stats.hit_tokens)
            evictions.add_metric([name], stats.evictions)
            size.add_metric([name], stats.bytes)
            entries.add_metric([name], stats.entries)
            capacity.add_metric([name], stats.capacity_bytes)
        yield from (lookups, tokens, evictions, size, entries, capacity)
