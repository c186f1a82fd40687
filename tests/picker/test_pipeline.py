"""EndpointPicker in-process: tokenizer choice, fallback to load-only routing, request ids."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from extproc.config import ModelConfig
from extproc.epp import answers as epp
from extproc.errors import PromptTooLong
from extproc.picker.pipeline import EndpointPicker
from extproc.request.tokenizer import HfTokenizer
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import BlocksStored, StoredBlock, Worker

from ..picker_fixtures import MODEL, chat_body, picker_config
from ..tokenizer_files import write_tokenizer_dir


async def pick(picker, body, request_id="r"):
    return await picker.pick(
        body=body, path="/v1/chat/completions", headers={}, subset=None, client_request_id=request_id
    )


async def test_hashes_come_from_the_configured_hugging_face_tokenizer(tmp_path):
    directory = write_tokenizer_dir(tmp_path / "tok")
    picker = EndpointPicker(replace(picker_config(), tokenizer=str(directory)))
    text = "the quick brown fox jumps over the lazy dog " * 20
    chosen = await pick(picker, chat_body(text))
    expected = HfTokenizer(directory).encode_chat([{"role": "user", "content": text}])
    assert chosen.request_blocks == len(expected) // 16
    assert chosen.request_blocks != len(chat_body(text)) // 16
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_a_failing_engine_tokenizer_falls_back_to_load_only_routing(caplog, refusing_port):
    dead = f"http://127.0.0.1:{refusing_port()}"
    picker = EndpointPicker(replace(picker_config(), models=(ModelConfig(MODEL, tokenize_url=dead),)))
    with caplog.at_level("WARNING", logger="extproc.picker"):
        chosen = await pick(picker, chat_body("hello " * 100))
    assert chosen.tracked and chosen.overlap_blocks == 0 and chosen.request_blocks == 0
    assert any("routing on load only" in r.getMessage() for r in caplog.records)
    picker.finish(chosen, "complete")
    assert picker.is_idle()
    await picker.close()


async def test_duplicate_client_request_ids_are_tracked_separately():
    picker = EndpointPicker(picker_config())
    first = await pick(picker, chat_body("a " * 50), request_id="same")
    second = await pick(picker, chat_body("b " * 50), request_id="same")
    assert first.request_id != second.request_id
    picker.finish(first, "complete")
    assert not picker.is_idle()
    picker.finish(second, "complete")
    picker.finish(second, "complete")  # idempotent
    assert picker.is_idle()


async def test_token_id_prompts_are_routed_without_tokenizing():
    picker = EndpointPicker(picker_config())
    body = json.dumps({"model": MODEL, "prompt": list(range(64))}).encode()
    chosen = await picker.pick(
        body=body, path="/v1/completions", headers={}, subset=None, client_request_id="t"
    )
    assert chosen.request_blocks == 4
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_a_prompt_over_the_token_limit_is_refused_and_leaves_no_state():
    picker = EndpointPicker(replace(picker_config(), max_prompt_tokens=100))
    with pytest.raises(PromptTooLong) as refused:
        await pick(picker, chat_body("x" * 400))
    assert epp.status_of(refused.value) == (413, "prompt-too-long")
    assert "exceeds the limit of 100 tokens" in refused.value.message
    assert picker.is_idle()
    short = await pick(picker, chat_body("hi"))
    picker.finish(short, "complete")
    assert picker.is_idle()


async def test_a_salted_prompt_only_reuses_blocks_stored_under_its_salt():
    """vLLM and SGLang isolate prefix caches per `cache_salt`; the router hashes a salted prompt as
    Dynamo does (the salt is the cache namespace), so it is never predicted to hit unsalted blocks."""
    picker = EndpointPicker(picker_config(use_kv_events=True))
    tokens = list(range(1000, 1064))
    router = picker.pools[MODEL].router
    for worker, salt in ((Worker("w0"), None), (Worker("w1"), "tenant-a")):
        hashes = compute_block_hashes(tokens, 16, namespace=salt)
        blocks = tuple(StoredBlock(engine_hash=i + 1, local_hash=h) for i, h in enumerate(hashes))
        router.apply_event(BlocksStored(worker, blocks))

    async def route(**extra):
        body = json.dumps({"model": MODEL, "prompt": tokens, **extra}).encode()
        chosen = await picker.pick(
            body=body, path="/v1/completions", headers={}, subset=None, client_request_id="s"
        )
        picker.finish(chosen, "complete")
        return chosen.worker.worker_id, chosen.overlap_blocks

    assert await route(cache_salt="tenant-a") == ("w1", 4)
    assert await route() == ("w0", 4)
    _, overlap = await route(cache_salt="tenant-b")
    assert overlap == 0
    assert picker.is_idle()


async def test_a_client_id_equal_to_an_id_the_picker_makes_never_shares_its_request():
    """Issue 19: a second `dup` got the made id `dup#1`, which a client had sent as its own: one
    request was untracked and the end of the other freed its load mid-stream. Made ids live in the
    picker's namespace now (`#`), which a client id used as is never enters."""
    picker = EndpointPicker(picker_config())
    router = picker.pools[MODEL].router
    client = await pick(picker, chat_body("a " * 50), request_id="dup#1")
    first = await pick(picker, chat_body("b " * 50), request_id="dup")
    second = await pick(picker, chat_body("c " * 50), request_id="dup")
    ids = {client.request_id, first.request_id, second.request_id}
    assert len(ids) == 3 and "dup#1" not in {first.request_id, second.request_id}
    assert len(router.sequences) == 3
    picker.finish(client, "complete")  # frees the client's own request, nobody else's
    assert picker.selector.owner_of(second.request_id) is not None and len(router.sequences) == 2
    for chosen in (first, second):
        picker.finish(chosen, "complete")
    assert picker.is_idle() and len(router.sequences) == 0


@pytest.mark.parametrize("client_id", ["", "x" * 500, "a#b"])
async def test_empty_overlong_and_marked_client_ids_get_a_made_id(client_id):
    picker = EndpointPicker(picker_config())
    chosen = await pick(picker, chat_body("a " * 50), request_id=client_id)
    assert "#" in chosen.request_id and len(chosen.request_id) <= 80
    assert chosen.request_id.startswith(client_id[:64] or "req")
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_a_path_is_decided_normalised_for_in_process_callers_too():
    """The servicer hands the picker normalised paths; a Python caller may not. An encoded chat path is
    still a chat request (parsed, tracked), as parse_openai_body reads it, not an untracked one."""
    picker = EndpointPicker(picker_config())
    chosen = await picker.pick(
        body=chat_body("a " * 50),
        path="/v1/chat/%63ompletions",
        headers={},
        subset=None,
        client_request_id="p",
    )
    assert chosen.tracked and chosen.request_blocks > 0
    picker.finish(chosen, "complete")
    assert picker.is_idle()


async def test_each_decision_first_awaits_what_the_picker_must_hear_before_it():
    """Replica sync hooks `before_decision` (other replicas' load that already came is applied
    first); it runs once per routed request, before the router counts the request."""
    picker = EndpointPicker(picker_config())
    in_flight_seen: list[int] = []

    async def before() -> None:
        in_flight_seen.append(picker.selector.in_flight())

    picker.before_decision = before
    first = await pick(picker, chat_body("a " * 50), request_id="one")
    second = await pick(picker, chat_body("b " * 50), request_id="two")
    assert in_flight_seen == [0, 1]  # each before its own request was counted
    picker.finish(first, "complete")
    picker.finish(second, "complete")
    assert picker.is_idle()
