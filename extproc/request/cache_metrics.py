"""Prometheus metrics of the tokenizers' piece caches, read from their counters at scrape time.

The request path only adds to plain integers (`TokenCache`); this renders them, per model:
- `extproc_tokenizer_cache_lookups_total{model, result}`: pieces found (hit) or not (miss);
- `extproc_tokenizer_cache_tokens_total{model, result}`: prompt tokens served from the cache (hit) or
  encoded (miss): their ratio is the share of tokenization work saved;
- `extproc_tokenizer_cache_evictions_total{model}`: entries dropped to stay within the bound;
- `extproc_tokenizer_cache_bytes{model}`, `extproc_tokenizer_cache_entries{model}` and
  `extproc_tokenizer_cache_capacity_bytes{model}` (`--tokenizer-cache-bytes`).
Models whose tokenizer has no piece cache (remote, byte-level, off, or inexact) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.request.token_cache import TokenCacheStats


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
