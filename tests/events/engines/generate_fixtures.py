"""Records the KV event fixtures of `tests/events/engines/` from vLLM 0.33.0's and SGLang 0.5.23's own code.

Run from the repository root, in a separate venv holding the engines' light dependencies (never
the project's; nothing from the wheels is committed, only this script and the data it writes):

    python3 -m venv /tmp/genvenv
    /tmp/genvenv/bin/pip install msgspec pyzmq pydantic msgpack cbor2 psutil urllib3 xxhash numpy
    /tmp/genvenv/bin/python tests/events/engines/generate_fixtures.py [--cache DIR] [--check]

What it does:

1. `pip download --no-deps vllm==0.33.0 sglang==0.5.23` into `--cache` (default
   /tmp/kv-engine-wheels; wheels already there are reused) and extracts only the modules below.
2. Loads those modules from the extracted files and stubs what they import but need not run:
   vllm.logger (a stdlib logger), vllm.config / vllm.config.kv_events (a plain KVEventsConfig),
   vllm.multimodal.utils (`get_mm_features_in_window`, a bisect over our fake features),
   vllm.v1.kv_cache_interface, vllm.v1.kv_cache_spec_registry, vllm.v1.request, vllm.v1.utils
   (`tensor_data`: numpy bytes), vllm.v1.core.kv_cache_metrics; sglang.srt.runtime_context,
   sglang.srt.environ, sglang.kernels..., sglang.srt.mem_cache.evict_policy, and SGLang's C++ page
   hash (`hash_binding.cpp`, built with torch at run time), replaced by a Python port of its
   regular path (SHA-256 over the previous digest and the page's little-endian uint32 tokens).
   vllm.utils.network_utils is the real module with `get_ip` answering 127.0.0.1, so vLLM's
   `tcp://*:0` binds loopback only through its own `_bind`; SGLang binds 127.0.0.1 with `bind=True`.
3. Drives the engines' real producers: vLLM's `BlockPool` (cache_full_blocks, chunked
   continuations, emit_cached_block_events, cache_partial_block in a hybrid-model pool whose hash
   unit is half the block, evict_blocks, eviction by allocation, reset_prefix_cache) with requests
   hashed by its own `get_request_block_hasher` (sha256, salted, LoRA via its `LoRARequest`,
   multimodal, prompt embeds, lookahead); SGLang's `KVCacheEventRecorder` (record_store,
   record_remove, record_all_cleared) over small fake radix nodes (salted, LoRA, a partial last
   page and a child under it, a CPU tier copy, a session id), in its default and "dynamo" formats.
   Each step's events go out as one batch (`KVEventBatch`) through the engine's real
   `ZmqEventPublisher`.
4. Records with a SUB socket every live message, and with a DEALER socket two replay exchanges
   (from seq 0 and from a middle seq), verbatim with the end marker, and writes one JSON file per
   capture (frames as hex) plus `manifest.json`: versions, wheel sha256s, and per capture what
   it holds and what the router must index after each batch (computed from what the script asked
   the engine to do and the engine's own state, never from decoding the events).

`--check` then runs our real `ZmqEventSubscriber` (imported from the checkout) against each
engine's live publisher, restarted with the same batches, and asserts that the router rebuilt
from the engine's replay holds exactly the blocks the manifest says.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import bisect
import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
import types
import zipfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
VLLM_VERSION, SGLANG_VERSION = "0.33.0", "0.5.23"
BLOCK_SIZE = 16  # the router's block size for every capture (vLLM's default block, SGLang page)
TS0 = 1767225600.0  # batch i is stamped TS0 + i / 2, so the files are reproducible
RECV_TIMEOUT_MS = 5000

VLLM_FILES = (
    "vllm/envs.py",
    "vllm/utils/hashing.py",
    "vllm/utils/math_utils.py",
    "vllm/utils/network_utils.py",
    "vllm/lora/request.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/distributed/kv_events.py",
    "vllm/v1/core/block_pool.py",
)
SGLANG_FILES = (
    "sglang/srt/utils/network.py",
    "sglang/srt/disaggregation/kv_events.py",
    "sglang/srt/mem_cache/cpp_utils/native_hash.py",
    "sglang/srt/mem_cache/utils.py",
    "sglang/srt/mem_cache/events.py",
)

log = logging.getLogger("generate_fixtures")


# --- wheels ------------------------------------------------------------------------------------


def fetch_wheels(cache: Path) -> dict[str, Path]:
    """The two wheels in `cache/wheels`, downloaded with pip unless already there."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = {name: next(iter(wheels.glob(f"{name}-{v}-*.whl")), None) for name, v in _versions()}
    missing = [f"{name}=={v}" for name, v in _versions() if found[name] is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *missing, "-d", str(wheels)]
        log.info("%s", " ".join(cmd))
        subprocess.run(cmd, check=True)
        found = {name: next(wheels.glob(f"{name}-{v}-*.whl")) for name, v in _versions()}
    return {name: path for name, path in found.items() if path is not None}


def _versions() -> list[tuple[str, str]]:
    return [("vllm", VLLM_VERSION), ("sglang", SGLANG_VERSION)]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract(wheel: Path, names: tuple[str, ...], into: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for name in names:
            target = into / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))


# --- loading the engines' modules with stubs --------------------------------------------------


def package(name: str) -> types.ModuleType:
    """An empty package (its real __init__ is not run), so that submodules can be registered."""
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(package(parent), child, module)
    return module


def stub(name: str, **attrs: Any) -> types.ModuleType:
    parent, _, child = name.rpartition(".")
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    if parent:
        setattr(package(parent), child, module)
    return module


def load(name: str, root: Path) -> types.ModuleType:
    """The real module `name` from the extracted wheel under `root`."""
    parent, _, child = name.rpartition(".")
    package(parent)
    spec = importlib.util.spec_from_file_location(name, root / (name.replace(".", "/") + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    setattr(sys.modules[parent], child, module)
    spec.loader.exec_module(module)
    return module


class _Any:
    """A stand-in for a class only named in type hints or isinstance checks that never match."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _mm_features_in_window(features: list[Any], start: int, end: int) -> tuple[int, int]:
    """(lo, hi) indices of the features overlapping [start, end) (vllm.multimodal.utils contract)."""
    lo = bisect.bisect_left([f.mm_position.offset + f.mm_position.length for f in features], start + 1)
    hi = bisect.bisect_left([f.mm_position.offset for f in features], end)
    return lo, hi


@dataclass
class Vllm:
    kv_events: types.ModuleType
    kv_cache_utils: types.ModuleType
    block_pool: types.ModuleType
    hashing: types.ModuleType
    lora: types.ModuleType


def load_vllm(root: Path) -> Vllm:
    os.environ.pop("PYTHONHASHSEED", None)  # NONE_HASH from vLLM's fixed seed: reproducible ids
    stub("vllm.logger", init_logger=logging.getLogger)
    load("vllm.envs", root)
    stub("vllm.config", VllmConfig=_Any)
    stub("vllm.config.kv_events", KVEventsConfig=_Any)
    stub("vllm.multimodal.utils", get_mm_features_in_window=_mm_features_in_window)
    kinds = ("KVCacheConfig", "KVCacheGroupSpec", "KVCacheSpec", "MambaSpec", "UniformTypeKVCacheSpecs")
    stub("vllm.v1.kv_cache_interface", **{k: type(k, (), {}) for k in kinds}, iter_layer_specs=iter)
    stub("vllm.v1.kv_cache_spec_registry", KVCacheSpecRegistry=_Any)
    stub("vllm.v1.request", Request=_Any)
    stub("vllm.v1.utils", tensor_data=lambda a: a.tobytes())
    stub("vllm.v1.core.kv_cache_metrics", KVCacheMetricsCollector=_Any)
    hashing = load("vllm.utils.hashing", root)
    load("vllm.utils.math_utils", root)
    network = load("vllm.utils.network_utils", root)
    network.get_ip = lambda: "127.0.0.1"  # the node's IP, for `tcp://*:0`: loopback only
    lora = load("vllm.lora.request", root)
    kv_cache_utils = load("vllm.v1.core.kv_cache_utils", root)
    kv_events = load("vllm.distributed.kv_events", root)
    block_pool = load("vllm.v1.core.block_pool", root)
    kv_cache_utils.init_none_hash(hashing.sha256)
    return Vllm(kv_events, kv_cache_utils, block_pool, hashing, lora)


class _NativeHashPort:
    """SGLang's `hicache_hash_cpp.get_hash` (hash_binding.cpp), regular token pages only: each
    page's digest is SHA-256(previous digest, if any, + the page's tokens as little-endian u32)."""

    @staticmethod
    def get_hash(
        raw: Any,
        logical_len: int,
        unit_width: int,
        is_bigram: bool,
        prior: bytes | None,
        page_size: int | None,
    ) -> str | list[str]:
        if is_bigram or unit_width != 1 or any(t > 0xFFFFFFFF for t in raw[:logical_len]):
            raise NotImplementedError("only regular uint32 token pages are ported")
        digest = prior
        pages = []
        step = page_size or max(logical_len, 1)
        for start in range(0, logical_len, step):
            h = hashlib.sha256()
            if digest is not None:
                h.update(digest)
            h.update(array("I", raw[start : min(start + step, logical_len)]).tobytes())
            digest = h.digest()
            pages.append(digest.hex())
        if page_size is None:
            return pages[0] if pages else hashlib.sha256(prior or b"").hexdigest()
        return pages


@dataclass
class Sglang:
    kv_events: types.ModuleType
    events: types.ModuleType


def load_sglang(root: Path) -> Sglang:
    assert sys.byteorder == "little"
    stub("sglang.srt.runtime_context", get_parallel=lambda: None)
    stub("sglang.srt.environ", envs=_Any())
    names = (
        "get_mla_kv_buffer_kernel",
        "get_mla_kv_buffer_triton",
        "set_mla_kv_buffer_dcp_sharded_triton",
        "set_mla_kv_buffer_fp8_quant_kernel",
        "set_mla_kv_buffer_kernel",
        "set_mla_kv_buffer_triton",
        "set_mla_kv_buffer_triton_fp8_quant",
        "set_mla_kv_scale_buffer_kernel",
        "set_mla_kv_scale_buffer_triton",
    )
    stub("sglang.kernels.ops.kvcache.mla_buffer", **dict.fromkeys(names))
    strategies = (
        "EvictionStrategy",
        "FIFOStrategy",
        "FILOStrategy",
        "LFUStrategy",
        "LRUStrategy",
        "MRUStrategy",
        "PriorityStrategy",
        "SLRUStrategy",
        "TLRUStrategy",
    )
    stub("sglang.srt.mem_cache.evict_policy", **{k: _Any for k in strategies})
    load("sglang.srt.utils.network", root)
    kv_events = load("sglang.srt.disaggregation.kv_events", root)
    native = load("sglang.srt.mem_cache.cpp_utils.native_hash", root)
    native._load_native_hash_module = lambda: _NativeHashPort
    load("sglang.srt.mem_cache.utils", root)
    events = load("sglang.srt.mem_cache.events", root)
    return Sglang(kv_events, events)


# --- expectations (what the router must hold), written as plain JSON ----------------------------


def block_json(
    engine_id: int, parent: int | None, tokens: list[int], lora: str | None, salt: str | None
) -> dict[str, Any]:
    """One stored block as the router must get it: engine ids (its own and the block before it, None
    at the root) and what its local hash is computed from."""
    return {"engine_id": engine_id, "parent": parent, "tokens": tokens, "lora_name": lora, "cache_salt": salt}


@dataclass
class Expect:
    """One batch's expected decode: stored blocks in order (an engine may merge consecutive stores
    into one event, so blocks, not events, are compared), removed ids (sorted), counters."""

    stored: list[dict[str, Any]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    cleared: bool = False
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        if n:
            self.counters[key] = self.counters.get(key, 0) + n

    def json(self) -> dict[str, Any]:
        return {
            "cleared": self.cleared,
            "stored": self.stored,
            "removed": sorted(self.removed),
            "counters": self.counters,
        }


@dataclass
class Chain:
    """A cached token sequence as a request would ask for it, and how many leading blocks match."""

    tokens: list[int]
    lora: str | None
    salt: str | None
    blocks: int
    note: str

    def json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "lora_name": self.lora,
            "cache_salt": self.salt,
            "blocks": self.blocks,
            "note": self.note,
        }


@dataclass
class Capture:
    """One engine run: its batches (engine structs), what each must decode to, the final state."""

    engine: str
    name: str
    description: str
    dp_rank: int
    batches: list[Any] = field(default_factory=list)
    expects: list[Expect] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    num_blocks: int = 0


# --- vLLM: BlockPool driven with fake requests ------------------------------------------------


class FakeRequest:
    """The attributes of vllm.v1.request.Request that BlockPool and the block hasher read."""

    def __init__(
        self,
        rid: str,
        tokens: list[int],
        *,
        lora: Any = None,
        salt: str | None = None,
        mm: list[Any] | None = None,
        embeds: Any = None,
        session: str | None = None,
    ) -> None:
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.lora_request = lora
        self.cache_salt = salt
        self.mm_features = mm or []
        self.prompt_embeds = embeds
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self.session_id = session
        self.block_hashes: list[bytes] = []
        self.blocks: list[Any] = []

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def lora_name(self) -> str | None:
        return self.lora_request.name if self.lora_request else None

    def unindexable_from(self, block_size: int) -> int:
        """The first block whose content tokens cannot name (multimodal or prompt embeds)."""
        first = len(self.all_token_ids) // block_size
        if self.prompt_embeds is not None:
            first = 0
        for f in self.mm_features:
            first = min(first, f.mm_position.offset // block_size)
        return first


def mm_feature(identifier: str, offset: int, length: int) -> Any:
    return types.SimpleNamespace(
        identifier=identifier, mm_position=types.SimpleNamespace(offset=offset, length=length)
    )


class VllmEngine:
    """A real BlockPool with events on; each `flush` is one scheduler step's batch."""

    def __init__(
        self,
        v: Vllm,
        capture: Capture,
        *,
        hash_block_size: int = BLOCK_SIZE,
        lookahead: int = 0,
        num_blocks: int = 48,
    ) -> None:
        self.v = v
        self.capture = capture
        self.pool = v.block_pool.BlockPool(
            num_blocks,
            True,
            hash_block_size,
            enable_kv_cache_events=True,
            num_hash_lookahead_tokens=lookahead,
        )
        self.hasher = v.kv_cache_utils.get_request_block_hasher(hash_block_size, v.hashing.sha256, lookahead)
        self.hash_block_size = hash_block_size
        self.owner: dict[int, tuple[FakeRequest, int]] = {}  # engine id -> (request, block index)
        self.unindexed: set[int] = set()
        self.requests: list[FakeRequest] = []
        self.expect = Expect()

    def ext(self, block_hash: bytes) -> int:
        converted = self.v.kv_cache_utils.maybe_convert_block_hash(block_hash)
        return converted if isinstance(converted, int) else int.from_bytes(converted, "big") & ((1 << 64) - 1)

    def block_ids(self, req: FakeRequest) -> list[int]:
        """The request's engine ids at BLOCK_SIZE granularity (what full-block stores carry)."""
        view = self.v.kv_cache_utils.resolve_block_hashes(req.block_hashes, self.hash_block_size, BLOCK_SIZE)
        return [self.ext(h) for h in view]

    def admit(self, req: FakeRequest) -> FakeRequest:
        req.block_hashes.extend(self.hasher(req))
        self.requests.append(req)
        return req

    def grow(self, req: FakeRequest, tokens: list[int]) -> None:
        req.all_token_ids.extend(tokens)
        req.block_hashes.extend(self.hasher(req))

    def cache(self, req: FakeRequest, start: int, end: int) -> None:
        """Compute blocks [start, end) of `req` (a prefill chunk) and cache them."""
        need = -(-len(req.all_token_ids) // BLOCK_SIZE) - len(req.blocks)
        if need > 0:
            req.blocks += self.pool.get_new_blocks(need)
        # a partial entry promoted to a full block is removed first (BlockRemoved of its id)
        self._removing(lambda: self.pool.cache_full_blocks(req, req.blocks, start, end, BLOCK_SIZE, 0))
        self._expect_store(req, start, end)

    def _expect_store(self, req: FakeRequest, start: int, end: int) -> None:
        ids = self.block_ids(req)
        for i in range(start, end):
            self.owner[ids[i]] = (req, i)
        parent = ids[start - 1] if start else None
        if parent is not None and parent in self.unindexed:
            self.expect.count("vllm.unindexed_parent")
            self.unindexed.update(ids[start:end])
            return
        cut = max(start, min(end, req.unindexable_from(BLOCK_SIZE)))
        if cut < end:
            key = "vllm.prompt_embeds_block" if req.prompt_embeds is not None else "vllm.multimodal_block"
            self.expect.count(key, end - cut)
            self.unindexed.update(ids[cut:end])
        if cut > start:
            t = req.all_token_ids
            self.expect.stored += [
                block_json(
                    ids[i],
                    ids[i - 1] if i else None,
                    t[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE],
                    req.lora_name,
                    req.cache_salt,
                )
                for i in range(start, cut)
            ]
            if self.pool.num_hash_lookahead_tokens:
                self.expect.count("vllm.lookahead_block", cut - start)

    def hit(self, req: FakeRequest, blocks: int) -> None:
        """A request that found `blocks` blocks in the prefix cache: vLLM re-announces them."""
        self.pool.emit_cached_block_events(req, blocks, BLOCK_SIZE, 0)
        self._expect_store(req, 0, blocks)

    def partial(self, req: FakeRequest, num_tokens: int) -> None:
        """The prompt's tail inside a block, registered as a partial prefix-cache entry."""
        block = req.blocks[num_tokens // BLOCK_SIZE]
        self.pool.cache_partial_block(req, block, num_tokens, 0, BLOCK_SIZE)
        self.unindexed.add(self.ext(req.block_hashes[num_tokens // self.hash_block_size - 1]))
        self.expect.count("vllm.partial_block")

    def free(self, req: FakeRequest) -> None:
        self.pool.free_blocks(reversed(req.blocks))  # as KVCacheManager.free: the tail evicted first

    def evict(self, reqs_blocks: list[tuple[FakeRequest, int]]) -> None:
        """Evict blocks of finished requests (KV connectors do, `evict_blocks`)."""
        kcu = self.v.kv_cache_utils
        for r, i in reqs_blocks:  # still that request's cached block (not reused since)
            assert self.ext(kcu.get_block_hash(r.blocks[i].block_hash)) == self.block_ids(r)[i]
        self._removing(lambda: self.pool.evict_blocks({r.blocks[i].block_id for r, i in reqs_blocks}))

    def pressure(self, n: int) -> None:
        """Allocate (and free) `n` blocks: the pool evicts its least recently used cached blocks."""
        self._removing(lambda: self.pool.free_blocks(self.pool.get_new_blocks(n)))

    def clear(self) -> None:
        assert self.pool.reset_prefix_cache()
        self.expect.cleared = True
        self.unindexed.clear()

    def _cached(self) -> set[int]:
        return {
            self.ext(self.v.kv_cache_utils.get_block_hash(k))
            for k in self.pool.cached_block_hash_to_block._cache
        }

    def _removing(self, action: Callable[[], object]) -> None:
        before = self._cached()
        action()
        for engine_id in before - self._cached():
            if engine_id in self.unindexed:
                self.unindexed.discard(engine_id)
                self.expect.count("vllm.unindexed_removal")
            else:
                self.expect.removed.append(engine_id)

    def flush(self) -> None:
        events = self.pool.take_events()
        ts = TS0 + len(self.capture.batches) / 2
        self.capture.batches.append(self.v.kv_events.KVEventBatch(ts=ts, events=events))
        self.capture.expects.append(self.expect)
        self.expect = Expect()

    def finish(self) -> None:
        """The truth the router must hold: every cached full block tokens can name, per request."""
        cached = self._cached() - self.unindexed
        self.capture.num_blocks = len({i for i in cached if i in self.owner})
        for req in self.requests:
            ids = self.block_ids(req)
            if not ids:
                continue
            held = 0
            while held < len(ids) and ids[held] in cached:
                held += 1
            tokens = req.all_token_ids[: len(ids) * BLOCK_SIZE]
            chains = self.capture.chains
            chains.append(Chain(tokens, req.lora_name, req.cache_salt, held, f"request {req.request_id}"))
            twin = any(
                r.all_token_ids[:BLOCK_SIZE] == tokens[:BLOCK_SIZE]
                and r.lora_name == req.lora_name
                and not r.cache_salt
                for r in self.requests
            )
            if req.cache_salt and not twin:  # its tokens without the salt must not match its blocks
                chains.append(
                    Chain(tokens, req.lora_name, None, 0, f"request {req.request_id} without its salt")
                )


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def vllm_standard(v: Vllm) -> Capture:
    cap = Capture(
        "vllm",
        "standard",
        "vLLM 0.33.0 BlockPool, block 16 = hash unit, int ids (the default): a "
        "plain prompt, a reset, a salted prompt prefilled in two chunks (the salt only in the first "
        "block's extra_keys), the same tokens unsalted, LoRA and LoRA+salt prompts, a prefix-cache "
        "hit re-announced from block 0, a multimodal prompt continued after its image, a "
        "prompt-embeds prompt, explicit evictions and evictions by allocation.",
        0,
    )
    e = VllmEngine(v, cap)
    lora = v.lora.LoRARequest("sql-lora", 1, "/adapters/sql-lora")
    z = e.admit(FakeRequest("z", toks(100, 32)))
    e.cache(z, 0, 2)
    e.free(z)
    e.flush()  # 0
    e.clear()
    e.requests.remove(z)
    p = e.admit(FakeRequest("p", toks(1000, 53)))
    e.cache(p, 0, 3)
    e.free(p)
    e.flush()  # 1
    s = e.admit(FakeRequest("s", toks(5000, 35), salt="salt-A", session="sess-1"))
    e.cache(s, 0, 1)
    e.flush()  # 2: the first chunk
    e.cache(s, 1, 2)
    u = e.admit(FakeRequest("u", toks(5000, 32)))
    e.cache(u, 0, 2)
    e.free(s)
    e.free(u)
    e.flush()  # 3: the continuation inherits the salt; the unsalted twin is another chain
    lo = e.admit(FakeRequest("l", toks(1000, 32), lora=lora))
    e.cache(lo, 0, 2)
    ls = e.admit(FakeRequest("ls", toks(7000, 32), lora=lora, salt="salt-B"))
    e.cache(ls, 0, 2)
    e.free(lo)
    e.free(ls)
    e.flush()  # 4
    p2 = FakeRequest("p2", toks(1000, 48) + toks(60000, 20))
    p2.block_hashes.extend(e.hasher(p2))
    e.hit(p2, 3)
    e.flush()  # 5
    m = e.admit(FakeRequest("m", toks(9000, 48), mm=[mm_feature("img-1", 20, 8)]))
    e.cache(m, 0, 3)
    e.flush()  # 6: only the block before the image is indexed
    e.grow(m, toks(9048, 16))
    e.cache(m, 3, 4)
    pe = e.admit(FakeRequest("pe", toks(8000, 32), embeds=np.arange(32 * 4, dtype=np.float32).reshape(32, 4)))
    e.cache(pe, 0, 2)
    e.free(m)
    e.free(pe)
    e.flush()  # 7
    e.evict([(s, 1), (m, 2)])
    e.flush()  # 8: a salted block and a block never indexed go
    e.pressure(e.pool.get_num_free_blocks() - 14)
    e.flush()  # 9: the least recently used blocks go
    e.finish()
    return cap


def vllm_hybrid(v: Vllm) -> Capture:
    cap = Capture(
        "vllm",
        "hybrid-partial",
        "vLLM 0.33.0 BlockPool of a hybrid model: hash unit 8 "
        "(prefix_match_unit), block 16. A prompt's tail inside a block is registered as a partial "
        "block (cache_partial_block: block_size 8, one id), promoted later (BlockRemoved of the "
        "partial id, then the full block); a salted 12-token prompt's partial first block carries "
        "the salt; dp rank 0.",
        0,
    )
    e = VllmEngine(v, cap, hash_block_size=8)
    h = e.admit(FakeRequest("h", toks(2000, 45)))
    e.cache(h, 0, 2)
    e.partial(h, 40)
    e.flush()  # 0
    e.grow(h, toks(2045, 5))
    e.cache(h, 2, 3)  # the partial entry's block becomes full
    hs = e.admit(FakeRequest("hs", toks(2500, 12), salt="salt-A"))
    hs.blocks = e.pool.get_new_blocks(1)
    e.partial(hs, 8)
    e.free(h)
    e.free(hs)
    e.flush()  # 1
    e.finish()
    return cap


def vllm_digests(v: Vllm) -> Capture:
    cap = Capture(
        "vllm",
        "digests-lookahead-dp1",
        "vLLM 0.33.0 with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 "
        "(32-byte SHA-256 ids) and one lookahead token per block hash (EAGLE), data parallel rank 1: "
        "plain and salted prompts, lookahead_token_ids on every store, a removal.",
        1,
    )
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
    try:
        e = VllmEngine(v, cap, lookahead=1)
        k = e.admit(FakeRequest("k", toks(1200, 41)))
        e.cache(k, 0, 2)
        ks = e.admit(FakeRequest("ks", toks(1300, 34), salt="salt-C"))
        e.cache(ks, 0, 2)
        e.free(k)
        e.free(ks)
        e.flush()  # 0
        e.evict([(k, 1)])
        e.flush()  # 1
        e.finish()
    finally:
        del os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"]
    return cap


# --- SGLang: KVCacheEventRecorder over fake radix nodes ----------------------------------------


class FakeKey:
    """The attributes of sglang RadixKey the recorder and the page hash read."""

    def __init__(
        self, tokens: list[int], extra_key: str | None = None, cache_salt: str | None = None
    ) -> None:
        self.token_ids = array("I", tokens)
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.is_bigram = False

    def __len__(self) -> int:
        return len(self.token_ids)


class FakeNode:
    """A radix tree node: its own key segment, its parent, the hashes the recorder caches on it."""

    def __init__(self, key: FakeKey, parent: FakeNode | None) -> None:
        self.key = key
        self.parent = parent
        self.hash_value: list[str] | None = [] if parent is None else None
        self.event_hash_value: list[str] | None = None

    def path(self) -> list[int]:
        return (self.parent.path() if self.parent else []) + list(self.key.token_ids)


class SglangEngine:
    def __init__(self, s: Sglang, capture: Capture, *, dynamo_format: bool) -> None:
        self.s = s
        self.capture = capture
        self.lora_names = s.events.KvEventLoraNames()
        self.recorder = s.events.KVCacheEventRecorder(
            enabled=True, page_size=BLOCK_SIZE, dynamo_format=dynamo_format, lora_names=self.lora_names
        )
        self.root = FakeNode(FakeKey([]), None)
        self.stored: dict[int, FakeNode] = {}  # GPU nodes held, by id()
        self.lora: dict[str, str] = {}  # extra_key -> adapter name
        self.expect = Expect()

    def register_lora(self, name: str, lora_id: str, extra_key: str) -> None:
        req = types.SimpleNamespace(lora_id=lora_id, extra_key=extra_key)
        self.lora_names.register(req, name)
        self.lora_names.register(lora_id=lora_id, lora_name=name)
        self.lora[extra_key] = name

    def node(
        self,
        parent: FakeNode | None,
        tokens: list[int],
        *,
        extra_key: str | None = None,
        salt: str | None = None,
    ) -> FakeNode:
        return FakeNode(FakeKey(tokens, extra_key, salt), parent or self.root)

    def ids(self, node: FakeNode) -> list[int]:
        """The page ids the recorder publishes for `node` (its own hashing, namespaced as it does)."""
        values = self.recorder._node_event_hash_values(node)
        seed = self.recorder._namespace_seed(node)
        ev = self.s.kv_events
        h = self.s.events.hash_str_to_int64
        return [ev.namespaced_block_hash(h(x), namespace_seed=seed) & ((1 << 64) - 1) for x in values]

    def aligned(self, node: FakeNode) -> bool:
        """Whether every ancestor's pages are full (the node's tokens start on a page boundary)."""
        p = node.parent
        while p is not None and p.parent is not None:
            if len(p.key) % BLOCK_SIZE:
                return False
            p = p.parent
        return True

    def store(self, node: FakeNode, medium: Any = None, session: str | None = None) -> None:
        self.recorder.record_store(node, medium, session_id=session)
        if medium is not None:
            self.expect.count("vllm.other_medium")
            return
        self.stored[id(node)] = node
        ids = self.ids(node)
        full, tail = divmod(len(node.key), BLOCK_SIZE)
        if not self.aligned(node):
            self.expect.count("vllm.partial_parent")
            return
        if tail:
            self.expect.count("vllm.partial_block")
        parent = self.ids(node.parent)[-1] if node.parent is not self.root else None
        lora = self.lora.get(node.key.extra_key or "")
        t = list(node.key.token_ids)
        self.expect.stored += [
            block_json(
                ids[i],
                ids[i - 1] if i else parent,
                t[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE],
                lora,
                node.key.cache_salt,
            )
            for i in range(full)
        ]

    def remove(self, node: FakeNode, medium: Any = None) -> None:
        self.recorder.record_remove(node, medium)
        if medium is not None:
            self.expect.count("vllm.other_medium")
            return
        del self.stored[id(node)]
        ids = self.ids(node)
        full = len(node.key) // BLOCK_SIZE
        if not self.aligned(node):
            self.expect.count("vllm.unindexed_removal")
            return
        self.expect.removed += ids[:full]

    def clear(self) -> None:
        self.recorder.record_all_cleared()
        self.stored.clear()
        self.expect.cleared = True

    def flush(self) -> None:
        ts = TS0 + len(self.capture.batches) / 2
        self.capture.batches.append(self.s.kv_events.KVEventBatch(ts=ts, events=self.recorder.take()))
        self.capture.expects.append(self.expect)
        self.expect = Expect()

    def finish(self, queries: list[tuple[FakeNode, str | None, str | None, str]]) -> None:
        """The truth: full pages of the GPU nodes held (aligned ones), and per query the leading
        pages a request with that path, adapter and salt finds."""
        held = [n for n in self.stored.values() if self.aligned(n)]
        self.capture.num_blocks = sum(len(n.key) // BLOCK_SIZE for n in held)
        for node, lora, salt, note in queries:
            path = node.path()
            nodes: list[FakeNode] = []
            p: FakeNode | None = node
            while p is not None and p.parent is not None:
                nodes.insert(0, p)
                p = p.parent
            same = lora == self.lora.get(node.key.extra_key or "") and salt == node.key.cache_salt
            matched = 0
            for n in nodes if same else []:
                if id(n) not in self.stored or not self.aligned(n):
                    break
                matched += len(n.key) // BLOCK_SIZE
                if len(n.key) % BLOCK_SIZE:
                    break
            full = len(path) // BLOCK_SIZE * BLOCK_SIZE
            self.capture.chains.append(Chain(path[:full], lora, salt, matched, note))


def sglang_capture(s: Sglang, dynamo_format: bool) -> Capture:
    fmt = "dynamo" if dynamo_format else "default"
    cap = Capture(
        "sglang",
        f"{fmt}-format",
        f"SGLang 0.5.23 KVCacheEventRecorder (page 16, format "
        f"{fmt!r}) over fake radix nodes: a node with a partial last page and a child under it, a "
        "salted node (cache_salt on every store) and its salted child, a LoRA node, a CPU tier copy "
        "(CPU_PINNED), removals (a leaf, the partial lineage, the CPU copy), a reset, a session id; "
        "attn dp rank 0.",
        0,
    )
    e = SglangEngine(s, cap, dynamo_format=dynamo_format)
    cpu = s.kv_events.StorageMedium.CPU
    z = e.node(None, toks(100, 32))
    e.store(z)
    e.flush()  # 0
    e.clear()
    a = e.node(None, toks(3000, 40))  # two full pages and a partial one
    c = e.node(a, toks(3040, 32))  # under the partial page
    salted = e.node(None, toks(5000, 32), salt="salt-A")
    salted_child = e.node(salted, toks(5032, 16), salt="salt-A")
    for n in (a, c, salted, salted_child):
        e.store(n)
    e.flush()  # 1
    lora_id = "0123456789abcdef0123456789abcdef"
    e.register_lora("sql-lora", lora_id, lora_id)
    lo = e.node(None, toks(3000, 32), extra_key=lora_id)
    e.store(lo)
    host = e.node(None, toks(5000, 32), salt="salt-A")
    e.store(host, cpu)
    e.flush()  # 2
    e.remove(c)
    e.flush()  # 3: c's pages were never indexed
    e.remove(salted_child)
    e.remove(host, cpu)
    e.flush()  # 4
    d = e.node(None, toks(6000, 16))
    e.store(d, session="sess-7")
    e.flush()  # 5
    e.finish(
        [
            (a, None, None, "node a: two full pages (its partial page is not a block)"),
            (c, None, None, "node c under a's partial page: only a's full pages match"),
            (salted, None, "salt-A", "salted node"),
            (salted, None, None, "salted node's tokens without the salt"),
            (salted_child, None, "salt-A", "salted child, removed"),
            (lo, "sql-lora", None, "LoRA node"),
            (d, None, None, "node d, stored with a session id"),
        ]
    )
    return cap


# --- recording through the engines' publishers -------------------------------------------------


@dataclass
class Publisher:
    """An engine's running ZmqEventPublisher: where it is and how to publish and stop it."""

    pub: str
    replay: str
    publish: Callable[[Any], None]
    shutdown: Callable[[], None]


def vllm_publisher(v: Vllm, dp_rank: int) -> Publisher:
    p = v.kv_events.ZmqEventPublisher(
        dp_rank, endpoint="tcp://*:0", replay_endpoint="tcp://*:0", buffer_steps=100
    )
    assert p._endpoint.startswith("tcp://127.0.0.1:") and p._replay_endpoint.startswith("tcp://127.0.0.1:")
    return Publisher(p._endpoint, p._replay_endpoint, p.publish, p.shutdown)


def sglang_publisher(s: Sglang, dp_rank: int) -> Publisher:
    p = s.kv_events.ZmqEventPublisher(
        dp_rank,
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        buffer_steps=100,
        bind=True,
    )
    atexit.unregister(p.shutdown)  # it registers itself; we shut it down once, below

    return Publisher(p._local_pub_endpoint, p._local_replay_endpoint, p.publish, p.shutdown)


def subscribe(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A SUB socket whose subscription has reached the publisher (waits for the handshake)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    assert monitor.poll(RECV_TIMEOUT_MS), "SUB socket never connected"
    monitor.recv_multipart()
    sub.disable_monitor()
    monitor.close(linger=0)
    time.sleep(0.3)  # the subscription travels after the handshake; a script may wait, a test may not
    sub.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    return sub


def replay(ctx: zmq.Context, endpoint: str, start: int) -> dict[str, Any]:
    """One replay exchange, as a DEALER sends and receives it, to the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    dealer.connect(endpoint)
    request = [b"", start.to_bytes(8, "big")]
    dealer.send_multipart(request)
    reply = []
    end = (-1).to_bytes(8, "big", signed=True)
    while True:
        frames = dealer.recv_multipart()
        reply.append(frames)
        if end in frames[1:3]:
            break
    dealer.close(linger=0)
    return {
        "start": start,
        "request": [f.hex() for f in request],
        "reply": [[f.hex() for f in m] for m in reply],
    }


def record(capture: Capture, publisher: Publisher) -> dict[str, Any]:
    ctx = zmq.Context()
    try:
        sub = subscribe(ctx, publisher.pub)
        live = []
        for batch in capture.batches:
            publisher.publish(batch)
            live.append([f.hex() for f in sub.recv_multipart()])
        sub.close(linger=0)
        middle = len(capture.batches) // 2
        replays = [replay(ctx, publisher.replay, 0), replay(ctx, publisher.replay, middle)]
    finally:
        publisher.shutdown()
        ctx.term()
    return {"engine": capture.engine, "capture": capture.name, "live": live, "replays": replays}


def capture_json(capture: Capture, file: str) -> dict[str, Any]:
    return {
        "file": file,
        "description": capture.description,
        "router_block_size": BLOCK_SIZE,
        "dp_rank": capture.dp_rank,
        "batches": [e.json() for e in capture.expects],
        "final": {"num_blocks": capture.num_blocks, "chains": [c.json() for c in capture.chains]},
    }


def dump(obj: Any) -> str:
    """Indented JSON with lists of numbers on one line (token ids stay readable)."""
    text = json.dumps(obj, indent=1)
    return (
        re.sub(
            r"\[\s*((?:-?\d+|null)(?:,\s*(?:-?\d+|null))*)\s*\]",
            lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
            text,
        )
        + "\n"
    )


def build_captures(v: Vllm, s: Sglang) -> list[tuple[Capture, Callable[[], Publisher]]]:
    out: list[tuple[Capture, Callable[[], Publisher]]] = []
    for make in (vllm_standard, vllm_hybrid, vllm_digests):
        cap = make(v)
        out.append((cap, lambda r=cap.dp_rank: vllm_publisher(v, r)))
    for dynamo in (False, True):
        cap = sglang_capture(s, dynamo)
        out.append((cap, lambda r=cap.dp_rank: sglang_publisher(s, r)))
    return out


def generate(cache: Path) -> list[tuple[Capture, Callable[[], Publisher]]]:
    wheels = fetch_wheels(cache)
    src = cache / "src"
    extract(wheels["vllm"], VLLM_FILES, src)
    extract(wheels["sglang"], SGLANG_FILES, src)
    v, s = load_vllm(src), load_sglang(src)
    captures = build_captures(v, s)
    manifest: dict[str, Any] = {
        "generated_by": "tests/events/engines/generate_fixtures.py",
        "engines": {
            name: {"version": version, "wheel": wheels[name].name, "sha256": sha256_of(wheels[name])}
            for name, version in _versions()
        },
        "python": sys.version.split()[0],
        "fixtures": {},
    }
    for capture, start in captures:
        directory = f"{capture.engine}-{VLLM_VERSION if capture.engine == 'vllm' else SGLANG_VERSION}"
        file = f"{directory}/{capture.name}.json"
        data = record(capture, start())
        (HERE / directory).mkdir(exist_ok=True)
        (HERE / file).write_text(dump(data))
        manifest["fixtures"][f"{capture.engine}/{capture.name}"] = capture_json(capture, file)
        log.info("wrote %s: %d batches", file, len(capture.batches))
    (HERE / "manifest.json").write_text(dump(manifest))
    return captures


# --- --check: our subscriber against the engines' live publishers ------------------------------


async def check_one(capture: Capture, expected: dict[str, Any], publisher: Publisher) -> str:
    sys.path.insert(0, str(REPO))
    from extproc.events.counters import EventCounters
    from extproc.events.zmq_subscriber import SubscriberTimings, ZmqEndpoint, ZmqEventSubscriber
    from extproc.router import KvRouter, RouterConfig
    from extproc.router.hashing import compute_block_hashes
    from extproc.router.types import Worker

    for batch in capture.batches:  # into the replay buffer before anyone subscribes
        publisher.publish(batch)
    router = KvRouter(RouterConfig(block_size=BLOCK_SIZE, use_kv_events=True), clock=lambda: 0.0)
    worker = Worker("w0", capture.dp_rank)

    class Sink:
        def apply_events(self, events: Any) -> None:
            for event in events:
                router.apply_event(event)

        def reset_worker(self, w: Any, reason: str) -> None:
            router.indexer.clear_worker(w)

        def stream_state(self, w: Any, up: bool, reason: str) -> None:
            pass

    sub = ZmqEventSubscriber(
        ZmqEndpoint(worker, publisher.pub, publisher.replay),
        Sink(),
        block_size=BLOCK_SIZE,
        counters=EventCounters(),
        timings=SubscriberTimings(replay_timeout_s=2.0),
    )
    await sub.start()
    try:
        deadline = time.monotonic() + 10
        while not (sub.status.up and sub.status.reason.startswith("rebuilt")):
            assert time.monotonic() < deadline, f"no rebuild: {sub.status}"
            await asyncio.sleep(0.02)
        final = expected["final"]
        assert router.indexer.num_blocks(worker) == final["num_blocks"], router.indexer.num_blocks(worker)
        for chain in final["chains"]:
            local = compute_block_hashes(
                chain["tokens"], BLOCK_SIZE, lora_name=chain["lora_name"], namespace=chain["cache_salt"]
            )
            got = router.indexer.find_matches(local).get(worker, 0)
            assert got == chain["blocks"], (chain["note"], got, chain["blocks"])
        return (
            f"{capture.engine}/{capture.name}: {sub.status.reason}, {final['num_blocks']} blocks as expected"
        )
    finally:
        await sub.stop()
        publisher.shutdown()


def check(captures: list[tuple[Capture, Callable[[], Publisher]]]) -> None:
    manifest = json.loads((HERE / "manifest.json").read_text())
    for capture, start in captures:
        expected = manifest["fixtures"][f"{capture.engine}/{capture.name}"]
        print("check:", asyncio.run(check_one(capture, expected, start())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=Path("/tmp/kv-engine-wheels"), help="wheels and sources"
    )
    parser.add_argument("--check", action="store_true", help="then run our subscriber against the publishers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    captures = generate(args.cache)
    if args.check:
        check(captures)


if __name__ == "__main__":
    main()
