"""The file's `workers:` and `models:` lists -> `WorkerConfig`s and `ModelConfig`s, and the worker
role and device words discovery shares. Workers have no flags: they come from the file (or from
discovery, extproc/runtime/discovery.py).

    models:                      # optional: per-model tokenizer
      - name: llama
        tokenizer: /models/llama # a Hugging Face tokenizer directory
        tokenize-url: worker     # or http://host:port: the engine's /tokenize
        aliases: [llama-3.1]     # other names the workers serve it as (vLLM --served-model-name)
        lora-adapters: [sql-lora] # LoRA adapters the workers serve as models (vLLM --lora-modules)
    workers:
      - id: w0
        endpoint: 10.0.0.5:8000
        model: llama
        dp-ranks: [0]            # or dp-size: 2 (ranks 0 and 1)
        total-blocks: 16384
        max-num-batched-tokens: 8192
        kv-events: tcp://10.0.0.5:5557   # optional, per worker; kv-replay likewise
        role: prefill            # prefill | decode | both (default; aggregated)
        device: cpu              # cuda (default; any accelerator) | cpu
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from extproc.config.options import ConfigError, snake_keys

WORKER_ROLES = ("prefill", "decode", "both")
WORKER_DEVICES = ("cuda", "cpu")
_ROLE_ALIASES = {"aggregated": "both", "agg": "both"}
_DEVICE_ALIASES = {"gpu": "cuda", "accelerator": "cuda", "xpu": "cuda", "npu": "cuda", "hpu": "cuda"}
NameKind = Literal["alias", "adapter"]  # what a model's other name is: extproc/picker/model_names.py
MAX_DP_SIZE = 1024  # data-parallel ranks per worker a config's dp_size may ask for


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    id: str
    endpoint: str
    model: str
    dp_ranks: tuple[int, ...] = (0,)
    total_blocks: int = 16384
    max_num_batched_tokens: int = 8192
    kv_events: str | None = None  # ZMQ PUB endpoint of dp rank 0 (tcp://ip:port); rank r uses port + r
    kv_replay: str | None = None  # ZMQ replay (ROUTER) endpoint of dp rank 0, same port rule
    instance_id: int | None = None  # the engine's u64 id in Dynamo-style NATS events (default: int(id))
    role: str = "both"  # prefill | decode | both (aggregated): see WORKER_ROLES
    device: str = "cuda"  # cuda (any accelerator) | cpu: see WORKER_DEVICES

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0].strip("[]")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model the workers serve, the other names they serve it as, and the LoRA adapters they serve
    on top of it.

    A request naming an alias (vLLM's further `--served-model-name`s) is the model's. A request
    naming an adapter (vLLM's `--lora-modules NAME=PATH`) goes to the model's workers, tokenized by
    its tokenizer, and its blocks are hashed with the adapter's name, as the engines hash them
    (their KV events carry `lora_name`).
    """

    name: str
    tokenizer: str | None = None
    tokenize_url: str | None = None
    lora_adapters: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()


def worker_role(text: object, where: str) -> str:
    """A worker role from config or discovery: prefill, decode or both (aggregated, the default)."""
    role = str(text).strip().lower() if text is not None else "both"
    role = _ROLE_ALIASES.get(role, role)
    if role not in WORKER_ROLES:
        raise ConfigError(f"invalid {where}={text!r}: expected one of {', '.join(WORKER_ROLES)}")
    return role


def worker_device(text: object, where: str) -> str:
    """A worker device class: cuda (any accelerator; gpu, xpu, ... are aliases) or cpu."""
    device = str(text).strip().lower() if text is not None else "cuda"
    device = _DEVICE_ALIASES.get(device, device)
    if device not in WORKER_DEVICES:
        raise ConfigError(f"invalid {where}={text!r}: expected cuda (or another accelerator) or cpu")
    return device


def read_workers(raw: Any) -> tuple[WorkerConfig, ...]:
    """The file's `workers:` list (None: no workers). Raises ConfigError naming the entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("invalid workers: expected a list of {id, endpoint, model, ...}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ConfigError(f"invalid workers[{i}]={item!r}: expected a mapping")
        w = snake_keys(item)
        for key in ("id", "endpoint", "model"):
            if not w.get(key):
                raise ConfigError(f"invalid workers[{i}]: missing {key!r}")
        endpoint = str(w["endpoint"])
        if ":" not in endpoint:
            raise ConfigError(f"invalid workers[{i}].endpoint={endpoint!r}: expected ip:port")
        try:
            dp = w.get("dp_ranks")
            if dp is None and "dp_size" in w:
                dp = range(int(w["dp_size"]))
                if not 1 <= len(dp) <= MAX_DP_SIZE:
                    raise ValueError(f"dp_size={w['dp_size']!r} is not in [1, {MAX_DP_SIZE}]")
            out.append(
                WorkerConfig(
                    id=str(w["id"]),
                    endpoint=endpoint,
                    model=str(w["model"]),
                    dp_ranks=tuple(int(r) for r in (dp if dp is not None else [0])),
                    total_blocks=int(w.get("total_blocks", 16384)),
                    max_num_batched_tokens=int(w.get("max_num_batched_tokens", 8192)),
                    kv_events=_zmq_endpoint(w, "kv_events", i),
                    kv_replay=_zmq_endpoint(w, "kv_replay", i),
                    instance_id=int(w["instance_id"]) if w.get("instance_id") is not None else None,
                    role=worker_role(w.get("role"), f"workers[{i}].role"),
                    device=worker_device(w.get("device"), f"workers[{i}].device"),
                )
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"invalid workers[{i}]: {exc}") from None
    ids = [w.id for w in out]
    if len(set(ids)) != len(ids):
        raise ConfigError("invalid workers: worker ids must be unique")
    return tuple(out)


def _zmq_endpoint(w: Mapping[str, Any], key: str, index: int) -> str | None:
    value = w.get(key)
    if value is None:
        return None
    text = str(value)
    if not text.startswith("tcp://") or ":" not in text[6:]:
        raise ConfigError(
            f"invalid workers[{index}].{key.replace('_', '-')}={text!r}: expected tcp://host:port"
        )
    return text


def read_models(raw: Any, workers: Sequence[WorkerConfig]) -> tuple[ModelConfig, ...]:
    """The file's `models:` list, plus a tokenizer-less entry for each model only workers name."""
    if raw and not isinstance(raw, list):
        raise ConfigError(
            "invalid models: expected a list of {name, tokenizer, tokenize-url, aliases, lora-adapters}"
        )
    models: dict[str, ModelConfig] = {}
    for i, item in enumerate(raw or []):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"invalid models[{i}]={item!r}: expected a mapping with a name")
        m = snake_keys(item)
        name = str(m["name"])
        adapters = _names(m.get("lora_adapters"), i, "lora-adapters")
        aliases = _names(m.get("aliases"), i, "aliases")
        models[name] = ModelConfig(name, m.get("tokenizer"), m.get("tokenize_url"), adapters, aliases)
    for w in workers:
        models.setdefault(w.model, ModelConfig(w.model))
    other_names(models.values())  # every name one thing
    return tuple(models.values())


def _names(raw: Any, index: int, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, str) and a for a in raw):
        raise ConfigError(f"invalid models[{index}].{key}={raw!r}: expected a list of names")
    return tuple(raw)


def other_names(models: Iterable[ModelConfig]) -> dict[str, tuple[str, NameKind]]:
    """Each alias's and LoRA adapter's model and kind ("alias" or "adapter"). Raises ConfigError
    when a name is two things: a model and another's name, two models' names, or an alias and an
    adapter (a request's `model` would not say which it means)."""
    models = list(models)
    names = {m.name for m in models}
    meant: dict[str, tuple[str, NameKind]] = {}
    for model in models:
        kinds: tuple[tuple[NameKind, str, tuple[str, ...]], ...] = (
            ("alias", "aliases", model.aliases),
            ("adapter", "lora-adapters", model.lora_adapters),
        )
        for kind, key, listed in kinds:
            for name in listed:
                if name in names:
                    raise ConfigError(f"invalid {key} of {model.name}: {name!r} is also a model")
                if meant.get(name, (model.name, kind)) != (model.name, kind):
                    other, what = meant[name]
                    raise ConfigError(f"invalid {key} of {model.name}: {name!r} is already {other}'s {what}")
                meant[name] = (model.name, kind)
    return meant
