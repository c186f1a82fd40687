"""extproc: a KV-cache-aware endpoint picker for LLM serving behind Envoy."""

from extproc.router import KvRouter, RouterConfig, compute_block_hashes

__all__ = ["KvRouter", "RouterConfig", "compute_block_hashes"]
__version__ = "0.1.0"
