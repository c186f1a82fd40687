"""EndpointPicker.pick, request by request: the hints a body gives reach the router and the admission
queue, load-only requests are costed on load, long prompts keep their ids, and each pick reports
its stage times.

- `nvext.agent_hints`: `kv_overlap_score_weight` and `temperature` override the router's (a caller's
  own override wins over them), `osl` is the expected output (else `max_tokens`), and `priority`,
  `latency_sensitivity` and `sheddable` order and bound the wait in the admission queue;
- a request routed on load alone (its prompt not rebuilt, its tokenizer down, or its prompt too big
  to build) counts a quarter of its body's bytes as its prompt and is costed on decode load only;
- the queue keeps sticky sessions, tells saturated candidate sets apart, estimates wspt's new tokens
  from the cache, and gives back a decision whose client left as it was made.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from extproc.config import ModelConfig, PickerConfig
from extproc.epp import answers as epp
from extproc.errors import PromptTooLong, UnknownModel
from extproc.picker.body_parser import MAX_PROMPT_VALUES
from extproc.picker.local_group import Routed
from extproc.picker.pipeline import SESSION_HEADER, EndpointPicker, Pick
from extproc.router import NoWorkers, QueueTimeout, RouterConfigOverride
from extproc.router.hashing import CHECKPOINT_TOKENS, compute_block_hashes
from extproc.router.types import BlocksStored, StoredBlock, Worker

from ..groups.builders import RouteListener, group_config, prompt
from ..groups.test_features_in_groups import build
from ..picker_fixtures import MODEL, chat_body, picker_config
from ..replica_helpers import until
from ..router.clock import FakeClock

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
STAGES = ("parse", "tokenize", "hash", "match", "select", "queue")

PickerFactory = Callable[..., EndpointPicker]


@pytest.fixture
async def make_picker() -> AsyncIterator[PickerFactory]:
    """Builds pickers (`EndpointPicker(config, **kwargs)`) and closes each when the test ends."""
    made: list[EndpointPicker] = []

    def make(config: PickerConfig, **kwargs: Any) -> EndpointPicker:
        made.append(EndpointPicker(config, **kwargs))
        return made[-1]

    yield make
    for picker in made:
        await picker.close()


def completion(tokens: Sequence[int], **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": list(tokens), **extra}).encode()


def agent_hints(**values: Any) -> dict[str, Any]:
    return {"nvext": {"agent_hints": values}}


def continuation(text: str = "and then?") -> bytes:
    """A Responses API follow-up of a response nobody is known to store: routed on load alone."""
    return json.dumps({"model": MODEL, "input": text, "previous_response_id": "resp_unknown"}).encode()


async def pick(
    picker: EndpointPicker,
    body: bytes,
    *,
    path: str = COMPLETIONS,
    headers: Mapping[str, str] | None = None,
    on: str | None = None,
    request_id: str = "r",
    override: RouterConfigOverride | None = None,
) -> Pick:
    """Route `body`; `on` names the one worker it may go to (a subset hint)."""
    subset = [picker.pools[MODEL].workers[on].endpoint] if on is not None else None
    return await picker.pick(
        body=body,
        path=path,
        headers=headers or {},
        subset=subset,
        client_request_id=request_id,
        override=override,
    )


def worker_of(chosen: Pick) -> str:
    return str(chosen.worker.worker_id)


def store_blocks(picker: EndpointPicker, worker: str, tokens: Sequence[int]) -> None:
    """`worker` reports (a KV event) that it caches the full blocks of `tokens`."""
    hashes = compute_block_hashes(tokens, 16)
    blocks = tuple(StoredBlock(engine_hash=i + 1, local_hash=h) for i, h in enumerate(hashes))
    picker.pools[MODEL].router.apply_event(BlocksStored(Worker(worker), blocks))


def stage(picker: EndpointPicker, name: str, sample: str) -> float:
    value = picker.metrics.registry.get_sample_value(
        f"extproc_decision_stage_seconds_{sample}", {"stage": name}
    )
    assert value is not None
    return value


def cache_lookups(picker: EndpointPicker) -> float:
    """Prompts looked up in the block-hash prefix cache (process-wide), as /metrics reports them."""
    registry = picker.metrics.registry
    return sum(
        registry.get_sample_value("extproc_block_hash_cache_lookups_total", {"result": result}) or 0.0
        for result in ("hit", "miss")
    )


def queued_picker(
    make_picker: PickerFactory, n_workers: int = 1, *, clock: FakeClock | None = None, **options: Any
) -> EndpointPicker:
    """A picker whose admission queue holds every request while its worker has a prompt in prefill
    (queue threshold 0); `options` are PickerConfig fields, or router fields."""
    fields = {k: options.pop(k) for k in list(options) if k in PickerConfig.__dataclass_fields__}
    config = replace(picker_config(n_workers, router_queue_threshold=0.0, **options), **fields)
    return make_picker(config, **({"clock": clock} if clock is not None else {}))


def start(picker: EndpointPicker, body: bytes, request_id: str, **kwargs: Any) -> asyncio.Task[Pick]:
    return asyncio.create_task(pick(picker, body, request_id=request_id, **kwargs))


async def queued(picker: EndpointPicker, count: int) -> None:
    await until(lambda: len(picker.gate(MODEL)) == count, 5.0, f"{count} requests waiting in the queue")


class Listener(RouteListener):
    """Hears each tracked request's route, as replica sync does."""

    def ids(self) -> list[str]:
        return [routed.request_id for routed, *_ in self.routed]


def listen(picker: EndpointPicker) -> Listener:
    listener = Listener()
    picker.listeners.append(listener)
    return listener


# --- router config overrides --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hints", "override", "expected"),
    [
        ({}, None, ("w0", 4)),  # the cached blocks outweigh w0's decode load
        ({"kv_overlap_score_weight": 2.0}, None, ("w0", 4)),
        ({"kv_overlap_score_weight": 0}, None, ("w1", 0)),  # 0: load alone, no cache lookup
        ({"kv_overlap_score_weight": 0.0, "temperature": 0.0}, None, ("w1", 0)),
        ({}, RouterConfigOverride(overlap_score_weight=0.0), ("w1", 0)),
        ({"kv_overlap_score_weight": 2.0}, RouterConfigOverride(overlap_score_weight=0.0), ("w1", 0)),
    ],
    ids=["no-hint", "weight-2", "weight-0", "weight-0-temperature-0", "override-0", "override-0-over-hint-2"],
)
async def test_the_overlap_weight_comes_from_the_callers_override_else_the_bodys_hints(
    make_picker: PickerFactory,
    hints: dict[str, Any],
    override: RouterConfigOverride | None,
    expected: tuple[str, int],
) -> None:
    """w0 caches the prompt's 4 blocks and decodes 2 blocks of another request; w1 is idle. Costs are
    weight x prefill blocks + decode blocks: w0 = weight x 0 + (2 + 4), w1 = weight x 4 + 4. At
    weight 0 nothing is looked up in the cache, so no overlap is reported either."""
    picker = make_picker(picker_config(use_kv_events=True))
    tokens = prompt(1, 64)
    store_blocks(picker, "w0", tokens)
    other = await pick(picker, completion(prompt(2, 32)), on="w0", request_id="other")
    picker.first_token(other)
    chosen = await pick(picker, completion(tokens, **agent_hints(**hints)), override=override)
    assert (worker_of(chosen), chosen.overlap_blocks) == expected
    for done in (other, chosen):
        picker.finish(done, "complete")
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("hints", "workers"),
    [({}, {"w1"}), ({"temperature": 0.0}, {"w1"}), ({"temperature": 5.0}, {"w0", "w1"})],
    ids=["no-hint", "temperature-0", "temperature-5"],
)
async def test_a_temperature_hint_spreads_requests_over_costlier_workers(
    make_picker: PickerFactory, hints: dict[str, Any], workers: set[str]
) -> None:
    """w0 prefills a 64-token prompt, so every 32-token request costs 12 there and 4 on w1: at
    temperature 0 all go to w1; at 5 each goes to w0 with probability ~0.45 (20 seeded draws)."""
    picker = make_picker(picker_config())
    busy = await pick(picker, completion(prompt(1, 64)), on="w0", request_id="busy")
    seen = set()
    for i in range(20):
        chosen = await pick(
            picker, completion(prompt(10 + i, 32), **agent_hints(**hints)), request_id=f"t{i}"
        )
        seen.add(worker_of(chosen))
        picker.finish(chosen, "complete")
    assert seen == workers
    picker.finish(busy, "complete")
    assert picker.is_idle()


# --- requests routed on load alone -------------------------------------------------------------


@pytest.fixture(params=["not-rebuilt", "tokenizer-down", "too-many-values"])
def load_only(
    request: pytest.FixtureRequest, refusing_port: Callable[[], int]
) -> tuple[PickerConfig, bytes, str]:
    """A picker config, and a body routed on load alone there: a Responses follow-up (its prompt is not
    rebuilt), a chat whose tokenizer (an engine's /tokenize) refuses connections, or a chat whose prompt
    fields hold more JSON values than the picker builds (`MAX_PROMPT_VALUES`)."""
    if request.param == "not-rebuilt":
        return picker_config(), continuation("tell me more " * 20), RESPONSES
    if request.param == "too-many-values":
        body = chat_body("tell me more", nvext={"padding": [0] * (MAX_PROMPT_VALUES + 1)})
        return replace(picker_config(), body_parse_workers=0), body, CHAT
    dead = ModelConfig(MODEL, tokenize_url=f"http://127.0.0.1:{refusing_port()}")
    return replace(picker_config(), models=(dead,)), chat_body("tell me more " * 20), CHAT


async def test_a_request_routed_on_load_alone_is_costed_on_decode_load_only(
    make_picker: PickerFactory, load_only: tuple[PickerConfig, bytes, str]
) -> None:
    """w0 prefills 256 tokens (16 blocks); w1 decodes 20 blocks. On decode load w0 is lighter; counting
    prefill (Dynamo's weight 1) w1 would be: with no prompt to find in any cache, the prefill term
    would only count the guessed prompt against w0's real one."""
    config, body, path = load_only
    picker = make_picker(config)
    prefilling = await pick(picker, completion(prompt(1, 256)), on="w0", request_id="p")
    decoding = await pick(picker, completion(prompt(2, 320)), on="w1", request_id="d")
    picker.first_token(decoding)
    chosen = await pick(picker, body, path=path, request_id="load-only")
    assert chosen.tracked and chosen.request_blocks == 0
    assert worker_of(chosen) == "w0"
    for done in (prefilling, decoding, chosen):
        picker.finish(done, "complete")
    assert picker.is_idle()


async def test_a_request_routed_on_load_alone_counts_a_quarter_of_its_body_as_its_prompt(
    make_picker: PickerFactory, load_only: tuple[PickerConfig, bytes, str]
) -> None:
    config, body, path = load_only
    picker = make_picker(config)
    listener = listen(picker)
    chosen = await pick(picker, body, path=path)
    [(_, hashes, isl, _)] = listener.routed
    assert hashes == [] and isl == len(body) // 4
    assert picker.pools[MODEL].router.sequences.prefill_tokens(chosen.worker) == len(body) // 4
    picker.finish(chosen, "complete")
    assert picker.is_idle()


# --- what else reaches the router --------------------------------------------------------------


@pytest.mark.parametrize(
    ("hints", "max_tokens", "expected"),
    [
        ({}, 100, 100),
        ({"osl": 64}, None, 64),
        ({"osl": 1}, 100, 1),
        ({"osl": 0}, 100, 100),  # 0 is no estimate: max_tokens stands
        ({"osl": 0}, None, None),
    ],
    ids=["max-tokens", "osl", "osl-1", "osl-0", "osl-0-no-max-tokens"],
)
async def test_the_expected_output_is_the_osl_hint_when_positive_else_max_tokens(
    make_picker: PickerFactory, hints: dict[str, Any], max_tokens: int | None, expected: int | None
) -> None:
    picker = make_picker(picker_config())
    listener = listen(picker)
    extra = {"max_tokens": max_tokens} if max_tokens is not None else {}
    chosen = await pick(picker, completion(prompt(1, 32), **extra, **agent_hints(**hints)))
    [(_, _, _, expected_output)] = listener.routed
    assert expected_output == expected
    picker.finish(chosen, "complete")


@pytest.mark.parametrize("n", [1, 2, 3])
async def test_each_of_n_sequences_holds_its_own_partial_block_from_the_decision(
    make_picker: PickerFactory, n: int
) -> None:
    """47 tokens: 2 full blocks shared by the sequences, and a 15-token tail each. With output-block
    tracking on, no output token is counted before the stream reports one."""
    picker = make_picker(picker_config(router_track_output_blocks=True))
    chosen = await pick(picker, completion(prompt(1, 47), n=n))
    assert picker.pools[MODEL].router.sequences.decode_blocks(chosen.worker) == 2 + n
    picker.finish(chosen, "complete")
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("length", "big_id", "lookups"),
    [
        (2 * CHECKPOINT_TOKENS - 1, False, 0),
        (2 * CHECKPOINT_TOKENS, False, 1),
        (3 * CHECKPOINT_TOKENS - 1, False, 1),
        (2 * CHECKPOINT_TOKENS, True, 1),  # an id past 2**31 is still a uint32
    ],
    ids=["just-under", "two-checkpoints", "just-under-three", "two-checkpoints-big-id"],
)
async def test_prompts_of_two_checkpoints_or_more_take_their_hashes_through_the_prefix_cache(
    make_picker: PickerFactory, length: int, big_id: bool, lookups: int
) -> None:
    """A long chat's next turn finds its earlier turns' block hashes in the process's prefix cache;
    shorter prompts are hashed without it (`extproc_block_hash_cache_lookups_total` counts both)."""
    picker = make_picker(picker_config())
    tokens = prompt(7, length)
    if big_id:
        tokens[-1] = 3_000_000_000
    before = cache_lookups(picker)
    chosen = await pick(picker, completion(tokens))
    assert cache_lookups(picker) - before == lookups
    assert chosen.request_blocks == length // 16
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_an_anthropic_request_is_routed_on_its_system_messages_merged_when_the_template_needs_it(
    make_picker: PickerFactory,
) -> None:
    """The default tokenizer has no chat template, so vLLM merges inline system messages into the
    leading one: the prompt routed is the chat whose messages are the merged ones."""
    picker = make_picker(picker_config())
    long = "a question that takes many blocks " * 8
    anthropic = {
        "model": MODEL,
        "max_tokens": 16,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": long},
            {"role": "system", "content": " Answer in French."},
            {"role": "user", "content": "go on"},
        ],
    }
    first = await pick(picker, json.dumps(anthropic).encode(), path="/v1/messages", request_id="m")
    picker.finish(first, "complete")
    merged = [
        {"role": "system", "content": "You are terse. Answer in French."},
        {"role": "user", "content": long},
        {"role": "user", "content": "go on"},
    ]
    body = json.dumps({"model": MODEL, "messages": merged}).encode()
    second = await pick(picker, body, path=CHAT, request_id="c")
    assert first.request_blocks > 0
    assert second.worker == first.worker and second.overlap_blocks == second.request_blocks
    picker.finish(second, "complete")
    assert picker.is_idle()


async def test_with_info_logging_on_each_routed_request_is_logged_with_its_worker(
    make_picker: PickerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """info is the picker's default log level (`--log-level`): the routed line's arguments are built
    for every request, with or without a session."""
    picker = make_picker(picker_config())
    with caplog.at_level(logging.INFO, logger="extproc.picker"):
        chosen = await pick(picker, completion(prompt(1, 64)), request_id="logged")
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("routed logged ")]
    assert f"model={MODEL} to {chosen.worker} ({chosen.endpoint})" in line
    picker.finish(chosen, "complete")


# --- refusals -----------------------------------------------------------------------------------


async def test_a_prompt_at_the_token_limit_is_routed_and_one_token_over_it_refused_with_its_size(
    make_picker: PickerFactory,
) -> None:
    picker = make_picker(replace(picker_config(), max_prompt_tokens=64))
    chosen = await pick(picker, completion(prompt(1, 64)))
    picker.finish(chosen, "complete")
    with pytest.raises(PromptTooLong) as refused:
        await pick(picker, completion(prompt(2, 65)))
    assert epp.status_of(refused.value) == (413, "prompt-too-long")
    assert refused.value.message.startswith("prompt of 65 tokens")
    assert picker.is_idle()


async def test_a_request_for_a_model_not_served_is_told_which_model_it_asked_for(
    make_picker: PickerFactory,
) -> None:
    picker = make_picker(picker_config())
    with pytest.raises(UnknownModel) as refused:
        await pick(picker, chat_body("hi", model="other-model"), path=CHAT)
    assert epp.status_of(refused.value) == (404, "unknown-model")
    assert refused.value.model == "other-model" and "'other-model'" in refused.value.message


@pytest.mark.parametrize("threshold", [None, 1.0])
async def test_a_model_left_without_workers_answers_no_workers_not_a_subset_refusal(
    make_picker: PickerFactory, threshold: float | None
) -> None:
    picker = make_picker(picker_config(router_queue_threshold=threshold))
    picker.set_workers(MODEL, [])
    with pytest.raises(NoWorkers):
        await pick(picker, completion(prompt(1, 32)))
    assert picker.is_idle()


# --- sessions -----------------------------------------------------------------------------------


async def pin_session(picker: EndpointPicker, session: str) -> Pick:
    """A session's first turn, answered 2xx (its session is pinned to its worker) and still decoding."""
    first = await pick(picker, completion(prompt(1, 64)), headers={SESSION_HEADER: session}, request_id="s1")
    picker.answered(first, 200)
    picker.first_token(first)
    return first


@pytest.mark.parametrize("threshold", [None, 1.0], ids=["no-queue", "queue"])
async def test_a_sessions_next_turn_goes_to_its_pinned_worker_with_or_without_the_queue(
    make_picker: PickerFactory, threshold: float | None
) -> None:
    picker = make_picker(picker_config(router_queue_threshold=threshold))
    first = await pin_session(picker, "chat-1")
    unpinned = await pick(picker, completion(prompt(2, 64)), request_id="x")
    assert unpinned.worker != first.worker  # by load, the next request goes to the other worker
    picker.finish(unpinned, "complete")
    second = await pick(
        picker, completion(prompt(3, 64)), headers={SESSION_HEADER: "chat-1"}, request_id="s2"
    )
    assert second.worker == first.worker
    for done in (first, second):
        picker.finish(done, "complete")
    assert picker.is_idle()


async def test_a_follow_up_of_an_unknown_stored_response_keeps_its_sessions_worker(
    make_picker: PickerFactory,
) -> None:
    picker = make_picker(picker_config())
    first = await pin_session(picker, "chat-1")
    follow_up = await pick(picker, continuation(), path=RESPONSES, headers={SESSION_HEADER: "chat-1"})
    assert follow_up.worker == first.worker and follow_up.request_blocks == 0
    for done in (first, follow_up):
        picker.finish(done, "complete")
    assert picker.is_idle()


# --- the admission queue ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hints", "first"),
    [
        ({}, "early"),
        ({"priority": 1}, "late"),  # a strict class: above the default 0
        ({"latency_sensitivity": 1.5}, "late"),  # a 1.5 s jump over the 1 s it came later
    ],
    ids=["no-hint", "priority", "latency-sensitivity"],
)
async def test_a_later_request_leaves_the_queue_first_by_its_priority_or_latency_sensitivity(
    make_picker: PickerFactory, hints: dict[str, Any], first: str
) -> None:
    clock = FakeClock(100.0)
    picker = queued_picker(make_picker, clock=clock)
    listener = listen(picker)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    early = start(picker, completion(prompt(2, 64)), "early")
    await queued(picker, 1)
    clock.advance(1.0)
    late = start(picker, completion(prompt(3, 64), **agent_hints(**hints)), "late")
    await queued(picker, 2)
    picker.first_token(busy)  # room for one: the next request prefills, the worker is saturated again
    await until(lambda: len(listener.routed) == 2, 5.0, "a queued request routed")
    assert listener.ids()[1] == first
    picker.first_token(await (early if first == "early" else late))
    chosen = [busy, await early, await late]
    for done in chosen:
        picker.finish(done, "complete")
    assert picker.is_idle()


@pytest.mark.parametrize(
    ("hints", "status"),
    [
        ({}, (503, "rejected-queue-timeout")),
        ({"sheddable": False}, (503, "rejected-queue-timeout")),
        ({"sheddable": True}, (429, "shed-queue-timeout")),
        ({"priority": -1}, (429, "shed-queue-timeout")),  # the Inference Extension's convention
    ],
    ids=["no-hint", "not-sheddable", "sheddable", "negative-priority"],
)
async def test_a_request_queued_past_its_bound_is_refused_429_when_sheddable_else_503(
    make_picker: PickerFactory, hints: dict[str, Any], status: tuple[int, str]
) -> None:
    picker = queued_picker(make_picker, queue_max_wait_s=0.05)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    with pytest.raises(QueueTimeout) as refused:
        await pick(picker, completion(prompt(2, 64), **agent_hints(**hints)), request_id="waits")
    assert epp.status_of(refused.value) == status
    picker.finish(busy, "complete")
    assert picker.is_idle()


async def test_a_request_with_room_on_its_own_workers_is_not_held_behind_one_bound_for_a_saturated_worker(
    make_picker: PickerFactory,
) -> None:
    """w0 prefills; a request restricted to w0 waits. The next one may use w1, which has room: it is
    queued (someone waits) and decided in the same round, not when w0 frees (the bound: 30 s)."""
    picker = queued_picker(make_picker, n_workers=2)
    busy = await pick(picker, completion(prompt(1, 64)), on="w0", request_id="busy")
    bound = start(picker, completion(prompt(2, 64)), "bound", on="w0")
    await queued(picker, 1)
    free = await asyncio.wait_for(pick(picker, completion(prompt(3, 64)), request_id="free"), 5.0)
    assert worker_of(free) == "w1" and not bound.done()
    picker.first_token(busy)
    chosen = [busy, free, await bound]
    assert worker_of(chosen[2]) == "w0"
    for done in chosen:
        picker.finish(done, "complete")
    assert picker.is_idle()


async def test_wspt_decides_the_request_with_the_fewest_uncached_tokens_first(
    make_picker: PickerFactory,
) -> None:
    """`long` is 160 tokens, all cached on the worker (1 new token by the estimate); `short` is 48
    uncached tokens. Under wspt `long` leaves first though it came later and is longer."""
    picker = queued_picker(make_picker, use_kv_events=True, router_queue_policy="wspt")
    listener = listen(picker)
    long_tokens = prompt(9, 160)
    store_blocks(picker, "w0", long_tokens)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    short = start(picker, completion(prompt(2, 48)), "short")
    await queued(picker, 1)
    long = start(picker, completion(long_tokens), "long")
    await queued(picker, 2)
    picker.first_token(busy)
    await until(lambda: len(listener.routed) >= 2, 5.0, "a queued request routed")
    assert listener.ids()[1] == "long"
    for task in (long, short):  # each prefills in turn
        picker.first_token(await task)
    for done in (busy, await long, await short):
        picker.finish(done, "complete")
    assert picker.is_idle()


class CancelsOnRoute(Listener):
    """The client of `task` goes away the moment its request is decided (before it resumes)."""

    task: asyncio.Task[Pick] | None = None

    def on_routed(
        self, routed: Routed, local_hashes: Sequence[int], isl: int, expected_output_tokens: int | None
    ) -> None:
        super().on_routed(routed, local_hashes, isl, expected_output_tokens)
        if routed.request_id == "gone" and self.task is not None:
            self.task.cancel()


async def test_a_queued_request_whose_client_leaves_as_it_is_decided_gives_its_load_back(
    make_picker: PickerFactory,
) -> None:
    picker = queued_picker(make_picker)
    listener = CancelsOnRoute()
    picker.listeners.append(listener)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    listener.task = start(picker, completion(prompt(2, 64)), "gone")
    await queued(picker, 1)
    picker.first_token(busy)
    with pytest.raises(asyncio.CancelledError):
        await listener.task
    assert listener.ids() == ["busy", "gone"]  # decided, then given back
    picker.finish(busy, "complete")
    assert picker.is_idle() and picker.selector.in_flight() == 0


# --- stage times ----------------------------------------------------------------------------------


async def test_a_pick_reports_each_stage_time_within_its_own_duration(make_picker: PickerFactory) -> None:
    picker = make_picker(picker_config())
    started = time.perf_counter_ns()
    chosen = await pick(picker, chat_body("hello " * 40), path=CHAT)
    elapsed = time.perf_counter_ns() - started
    assert set(chosen.timings_ns) == set(STAGES)
    assert all(0 <= chosen.timings_ns[name] <= elapsed for name in STAGES)
    assert chosen.queued_s == 0.0 and chosen.timings_ns["queue"] == 0
    for name in STAGES:
        assert stage(picker, name, "count") == 1
        assert stage(picker, name, "sum") == chosen.timings_ns[name] / 1e9
    picker.finish(chosen, "complete")


async def test_a_queued_pick_reports_its_wait_on_the_pickers_clock(make_picker: PickerFactory) -> None:
    clock = FakeClock(100.0)
    picker = queued_picker(make_picker, clock=clock)
    busy = await pick(picker, completion(prompt(1, 64)), request_id="busy")
    waiting = start(picker, completion(prompt(2, 64)), "waits")
    await queued(picker, 1)
    clock.advance(2.0)
    picker.first_token(busy)
    chosen = await waiting
    assert chosen.queued_s == 2.0 and chosen.timings_ns["queue"] == 2_000_000_000
    assert stage(picker, "queue", "count") == 2 and stage(picker, "queue", "sum") == 2.0
    for done in (busy, chosen):
        picker.finish(done, "complete")
    assert picker.is_idle()


async def test_a_remote_groups_decision_is_timed_as_the_groups_stage() -> None:
    """A remote group does not say how long its stages took: the pick times the whole call."""
    setup = await build("remote", group_config("w"))
    try:
        started = time.perf_counter_ns()
        chosen = await pick(setup.top, completion(prompt(1, 64)))
        elapsed = time.perf_counter_ns() - started
        assert chosen.group == "there"
        assert 0 < chosen.timings_ns["groups"] <= elapsed
        setup.top.finish(chosen, "complete")
        await setup.settle()
    finally:
        await setup.close()
