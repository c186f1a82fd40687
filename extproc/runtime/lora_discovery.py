"""The LoRA adapters and other model names the workers serve, read from their model lists: each
worker's `GET /v1/models` every `--lora-discovery-interval-ms` (30 s), its names handed to the picker
(`EndpointPicker.set_discovered_names`), so a request naming an adapter goes to its base model's
workers and matches the blocks cached under it, and one naming another of the model's served names
goes to its workers, without listing either in the config.

What the engines answer, checked against their code (fixtures: tests/runtime/lora_models/):

    vLLM 0.33.0   `{"object": "list", "data": [card, ...]}`: one card per served model name
                  (`parent` null), one per adapter (`--lora-modules`, or loaded at run time by
                  POST /v1/load_lora_adapter) whose `parent` is the base model's first served
                  name, or the one its `--lora-modules` JSON named
    SGLang 0.5.23 the same shape: adapters (`--lora-paths`, /load_lora_adapter) with `parent` the
                  served model name, listed while `--enable-lora` is on; but SGLang serves an
                  adapter only as `model: "BASE:ADAPTER"` or `lora_path` (the picker reads both
                  from the request), while a bare adapter name gets the base model. So its cards
                  (`owned_by` "sglang") name no model here

A card with a `parent` is an adapter of the model the worker serves (its `parent` may be another of
the worker's served names), unless SGLang owns it; a card without one is a name the worker serves
its model as (vLLM's `--served-model-name llama llama-3.1` lists both), an alias of the picker's model
when it is not the model's own name. A vLLM worker that does not list its model's name would answer
its requests 404: logged once. A model's names are those any of its workers lists; a worker that
cannot be read keeps its last answer (a slow engine does not take its names away), one that leaves
takes its answer with it.

Bounds, whatever a worker does: the GET is bounded (`bounded_get`: `--lora-discovery-timeout-ms`,
MAX_MODELS_BYTES, no redirects, no compression), at most MAX_CONCURRENT_READS at once, at most
MAX_NAMES_PER_WORKER names (adapters and aliases) of at most MAX_NAME characters are taken from one
answer (the rest are left out). A worker that fails is logged once, and once more when it answers again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extproc.config import DiscoveryConfig, WorkerConfig
from extproc.picker.client_ids import loggable
from extproc.runtime.bounded_get import FetchFailed, bounded_get, bounded_session
from extproc.runtime.rounds import Rounds

log = logging.getLogger("extproc.lora_discovery")

MAX_MODELS_BYTES = 1 << 20  # a /v1/models body; vLLM's is about 500 bytes a card
MAX_CONCURRENT_READS = 16
MAX_NAMES_PER_WORKER = 1024  # vLLM keeps --max-cpu-loras adapters loaded; SGLang --max-loaded-loras
MAX_NAME = 256  # characters


class ModelsInvalid(FetchFailed):
    """The body is not a model list."""


@dataclass(frozen=True, slots=True)
class ListedNames:
    """What one `/v1/models` body names: `served`, the cards without a `parent` (the worker's own
    model's names), and `adapters`, those with one; SGLang's cards are left out of both."""

    served: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()


def names_in(body: bytes) -> ListedNames:
    """The names a `/v1/models` body lists, in order, each once, at most MAX_NAMES_PER_WORKER of at
    most MAX_NAME characters (longer ones and cards past the bound are left out). Raises
    ModelsInvalid for a body that is no model list."""
    try:
        listed = json.loads(body)
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, not UTF-8
        raise ModelsInvalid(f"not JSON: {str(exc)[:80]}") from None
    cards = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(cards, list):
        raise ModelsInvalid("not a model list: no `data` list")
    served: dict[str, None] = {}
    adapters: dict[str, None] = {}
    for card in cards:
        if not isinstance(card, dict):
            continue
        name, parent = card.get("id"), card.get("parent")
        if card.get("owned_by") == "sglang":  # one served name; adapters served as BASE:ADAPTER only
            continue
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name in served or name in adapters:
            continue
        if isinstance(parent, str):
            adapters[name] = None
        elif parent is None:
            served[name] = None
        if len(served) + len(adapters) == MAX_NAMES_PER_WORKER:
            break
    return ListedNames(tuple(served), tuple(adapters))


class NameTarget(Protocol):
    """What discovery reads and feeds: `EndpointPicker` satisfies it."""

    @property
    def pools(self) -> Mapping[str, Any]: ...

    def set_discovered_names(
        self, model: str, aliases: Iterable[str], adapters: Iterable[str]
    ) -> tuple[list[str], list[str]]: ...


@dataclass
class WorkerModels:
    """What one worker's model list said last."""

    url: str
    model: str
    names: ListedNames = ListedNames()
    serves_model: bool = True  # its last answer named its model (or named none: SGLang)
    ok: bool | None = None  # None until the first read ends
    error: str | None = None
    workers: set[str] = field(default_factory=set)


class AdapterDiscovery(Rounds):
    """Reads every worker's /v1/models each `config.lora_interval_s` and tells the picker its
    models' adapters."""

    def __init__(self, target: NameTarget, config: DiscoveryConfig) -> None:
        super().__init__("lora-discovery", config.lora_interval_s, log)
        self.config = config
        self._target = target
        self._states: dict[tuple[str, str], WorkerModels] = {}  # (model, url) -> its last answer
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_READS)

    @staticmethod
    def url_of(worker: WorkerConfig) -> str:
        return f"http://{worker.endpoint}/v1/models"

    async def one_round(self) -> None:
        await self.read_once()

    async def read_once(self) -> None:
        """One round: every worker's model list once, then each model's adapters to the picker."""
        wanted: dict[tuple[str, str], set[str]] = {}
        for model, pool in self._target.pools.items():
            for worker in pool.all_workers().values():
                wanted.setdefault((model, self.url_of(worker)), set()).add(worker.id)
        for key in set(self._states) - set(wanted):
            del self._states[key]  # its workers left
        states = [self._states.setdefault(key, WorkerModels(key[1], key[0])) for key in wanted]
        for state, key in zip(states, wanted, strict=True):
            state.workers = wanted[key]
        await asyncio.gather(*(self._read(state) for state in states))
        for model in self._target.pools:
            states = [state for (m, _), state in self._states.items() if m == model]
            aliases = {name for state in states for name in state.names.served}
            adapters = {name for state in states for name in state.names.adapters}
            added, removed = self._target.set_discovered_names(model, aliases, adapters)
            if added or removed:
                log.info("names of %s listed by its workers: %d adapters, %d other served names "
                         "(+%s -%s)", model, len(adapters), len(aliases - {model}), _names(added),
                         _names(removed))  # fmt: skip

    async def _read(self, state: WorkerModels) -> None:
        if self._session is None:
            self._session = bounded_session(self.config.lora_timeout_s, MAX_CONCURRENT_READS)
        async with self._slots:
            try:
                body = await bounded_get(
                    self._session, state.url, max_bytes=MAX_MODELS_BYTES, accept="application/json"
                )
                names = names_in(body)
            except FetchFailed as exc:
                if state.ok is not False:  # once per failing spell
                    log.warning("LoRA discovery: %s at %s: %s; its names as last read (%d) until it "
                                "answers (logged again only when it does)", ", ".join(sorted(state.workers)),
                                state.url, exc, len(state.names.served + state.names.adapters))  # fmt: skip
                state.ok, state.error = False, str(exc)
                return
        if state.ok is False:
            log.info("LoRA discovery: %s at %s answers again", ", ".join(sorted(state.workers)), state.url)
        serves_model = not names.served or state.model in names.served
        if state.serves_model and not serves_model:  # once, as it begins
            log.warning("%s at %s serves %s, not %s: it would answer that model's requests 404 (its "
                        "--served-model-name?)", ", ".join(sorted(state.workers)), state.url,
                        ", ".join(loggable(n) for n in names.served[:5]), state.model)  # fmt: skip
        state.ok, state.error, state.names, state.serves_model = True, None, names, serves_model


def _names(names: list[str]) -> str:
    shown = ", ".join(loggable(n) for n in names[:10])
    return f"[{shown}{', ...' if len(names) > 10 else ''}]"


async def start_lora_discovery(target: NameTarget, config: DiscoveryConfig) -> AdapterDiscovery | None:
    """Start reading the workers' model lists when `config.lora_interval_s` > 0; None when it is off."""
    if config.lora_interval_s <= 0:
        return None
    discovery = AdapterDiscovery(target, config)
    discovery.start()
    log.info("LoRA discovery: each worker's /v1/models every %g s (timeout %g s)", config.lora_interval_s,
             config.lora_timeout_s)  # fmt: skip
    return discovery
