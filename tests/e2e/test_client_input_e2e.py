"""What a client can send past the picker, through a real Envoy 1.40 (issue 19).

The real picker (in-process: the test reads what it tracks) behind every Envoy variant, and behind
"bare" Envoys that have none of our configs' own protection (no header stripping before the picker,
no path normalisation), which stand for any other gateway: there the picker alone must hold; and
behind an Envoy shaped like the Inference Extension's reference config (both bodies
FULL_DUPLEX_STREAMED, the upstream keyed on the destination header a client can send too).

- Headers the picker owns (`x-prefill-endpoint`, `x-data-parallel-rank`, ...) never reach a worker
  from a client, routed or untracked, also when `failopen` skips the picker.
- An encoded path (`/v1/chat/%63ompletions`, `//`, `..`) is parsed, limited and tracked like the plain
  one; an encoded slash is a 400 (or, where Envoy unescapes and redirects, the redirect reaches the
  client whole and the path it names is routed).
- An HTTP/2 request with trailers (a real h2c client) is decided like any other, at once.
- A POST without a body to a routable path is the picker's 400, not a worker's answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import pytest
import pytest_asyncio
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from yarl import URL

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.config.disagg import DisaggConfig
from extproc.devstack.envoy_config import Variant, render_envoy_config
from extproc.devstack.procs import EnvoyProcess, reserve_port, start_envoy
from extproc.devstack.stack import MODEL
from extproc.epp import answers as epp
from extproc.epp.service import ExtProcService
from extproc.picker.pipeline import EndpointPicker
from extproc.router import RouterConfig
from extproc.runtime.server import start_picker

from .h2client import H2Response, h2_request
from .harness import EchoWorker, start_echo_workers

pytestmark = pytest.mark.asyncio(loop_scope="module")
T = TypeVar("T")

TIMEOUT = aiohttp.ClientTimeout(total=30)
PROMPT_LIMIT = 200  # --max-prompt-tokens
# Envoy waits this long for each picker answer; a request decided at once is answered far sooner.
MESSAGE_TIMEOUT_S = 5.0
PROMPT_S = 2.0
STOCK: list[Variant] = ["buffered", "duplex", "failopen"]
BARE = ["bare-buffered", "bare-duplex"]  # without our configs' protection: the picker alone holds
# The Inference Extension's and llm-d's reference Envoy (llm-d-inference-scheduler's
# test/testdata/envoy.yaml): both bodies FULL_DUPLEX_STREAMED, the upstream keyed on the
# x-gateway-destination-endpoint request header, nothing removed before the picker, encoded
# slashes unescaped and redirected
GIE = "gie-duplex"
ALL = [*STOCK, *BARE, GIE]
CLIENT_COPIES = {
    "x-prefill-endpoint": "10.9.9.9:80",
    "x-data-parallel-rank": "7",
    "x-extproc-worker": "forged",
    "x-gateway-destination-endpoint-served": "10.9.9.9:80",
    "x-gateway-destination-endpoint": "10.9.9.9:80",
}


def bare(config: str) -> str:
    """A rendered config without our own protection: nothing stripped before the picker, paths
    forwarded as the client sent them."""
    config = re.sub(
        r"request_mutations:( \[[^\]]*\]|\n(\s+- remove: .*\n)+)", "request_mutations: []\n", config
    )
    for line in ("normalize_path: true", "merge_slashes: true"):
        config = config.replace(line, line.replace("true", "false"))
    return config.replace("REJECT_REQUEST", "KEEP_UNCHANGED")


@dataclass
class Stack:
    picker: EndpointPicker
    workers: list[EchoWorker]
    envoys: dict[str, EnvoyProcess]

    def url(self, variant: str) -> str:
        return self.envoys[variant].url

    def port(self, variant: str) -> int:
        return self.envoys[variant].listen_port

    def release(self, key: str) -> None:
        for worker in self.workers:
            worker.release(key)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client-input")


def picker_config(endpoints: list[str], **options: Any) -> PickerConfig:
    return PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        # w0 has two data-parallel ranks: the picker names one in x-data-parallel-rank; w1 has one
        workers=(
            WorkerConfig("w0", endpoints[0], MODEL, dp_ranks=(0, 1)),
            WorkerConfig("w1", endpoints[1], MODEL),
        ),
        models=(ModelConfig(MODEL),),
        max_prompt_tokens=PROMPT_LIMIT,
        seed=5,
        **options,
    )


def inference_extension_style(config: str) -> str:
    """A rendered duplex config in the shape of the Inference Extension's reference Envoy: `bare`,
    paths normalised, encoded slashes unescaped and redirected, the upstream keyed on the request
    header the picker sets (which a client can send too: the picker must overwrite it)."""
    config = bare(config).replace("KEEP_UNCHANGED", "UNESCAPE_AND_REDIRECT")
    for line in ("normalize_path: false", "merge_slashes: false"):
        config = config.replace(line, line.replace("false", "true"))
    keyed = re.sub(
        r"use_http_header: false\n(\s+)metadata_key:\n(\s+key: envoy.lb\n\s+path:\n\s+- key: .*\n)",
        lambda m: f"use_http_header: true\n{m.group(1)}http_header_name: {epp.DESTINATION_HEADER}\n",
        config,
    )
    assert keyed != config, "the duplex template's upstream cluster changed: update this test"
    return keyed


def start_variant(
    name: str, picker_address: str, workers: list[str], log_dir: Path, **render: Any
) -> EnvoyProcess:
    variant: Variant = name.removeprefix("bare-").removeprefix("gie-")  # type: ignore[assignment]
    config = render_envoy_config(variant, picker_address=picker_address, workers=workers, **render)
    if name.startswith("bare-"):
        config = bare(config)
    elif name.startswith("gie-"):
        config = inference_extension_style(config)
    return start_envoy(config, log_path=log_dir / f"envoy-{name}-{uuid.uuid4().hex[:6]}.log")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(log_dir: Path) -> AsyncIterator[Stack]:
    workers = await start_echo_workers(2)
    endpoints = [w.address for w in workers]
    picker = EndpointPicker(picker_config(endpoints))
    service = ExtProcService(picker, max_body_bytes=picker.config.max_body_bytes)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    envoys: dict[str, EnvoyProcess] = {}
    dead = reserve_port()  # failopen-down: a picker address where nothing listens
    try:
        for name in ALL:
            envoys[name] = start_variant(name, f"127.0.0.1:{port}", endpoints, log_dir)
        envoys["failopen-down"] = start_variant("failopen", dead.address, endpoints, log_dir)
        yield Stack(picker, workers, envoys)
    finally:
        for envoy in envoys.values():
            envoy.stop()
        dead.release()
        await server.stop(0)
        await picker.close()
        for worker in workers:
            await worker.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        yield session


def chat(text: str, **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}).encode()


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def post(
    http: aiohttp.ClientSession, url: str | URL, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with http.post(url, data=body, headers=headers) as response:
        return (
            response.status,
            {k.lower(): v for k, v in response.headers.items()},
            json.loads(await response.read()),
        )


def assert_error(
    status: int, headers: dict[str, str], answer: dict[str, Any], expected: int, reason: str
) -> None:
    assert status == expected, answer
    assert headers[epp.DROPPED_REASON_HEADER] == reason
    assert (
        set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["code"] == expected
    )


def assert_clean(echoed: dict[str, Any]) -> None:
    """The worker got only the picker's own values of the headers it owns."""
    seen = echoed["headers"]
    assert seen[epp.DESTINATION_HEADER] == echoed["worker"]
    for name in ("x-prefill-endpoint", "x-extproc-worker", "x-gateway-destination-endpoint-served"):
        assert name not in seen, (name, seen)
    assert seen.get("x-data-parallel-rank") in (None, "0", "1")  # the picker's rank, never the client's 7


# --- 1. owned headers -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
async def test_a_clients_copies_of_the_headers_the_picker_owns_never_reach_a_worker(
    variant: str, stack: Stack, http: aiohttp.ClientSession
) -> None:
    # each worker in turn, the one with ranks and the one without (routing alone need not spread 8
    # sequential requests over both: the timing model learns their speeds from real first tokens)
    configured = list(stack.picker.config.workers)
    served = set()
    try:
        for only in configured:
            stack.picker.set_workers(MODEL, [only])
            for i in range(4):
                status, _, echoed = await post(
                    http, stack.url(variant) + "/v1/chat/completions", chat(f"{i} " * 40), CLIENT_COPIES
                )
                assert status == 200, echoed
                assert_clean(echoed)
                assert echoed["worker"] == only.endpoint
                served.add(echoed["worker"])
    finally:
        stack.picker.set_workers(MODEL, configured)
    async with http.get(stack.url(variant) + "/v1/models", headers=CLIENT_COPIES) as r:  # untracked
        assert r.status == 200
        assert_clean(await r.json())
    assert served == {w.address for w in stack.workers}
    await until(stack.picker.is_idle)


async def test_a_clients_owned_headers_are_removed_when_failopen_skips_the_picker(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    for path in ("/v1/chat/completions", "/v1/models"):
        status, _, echoed = await post(
            http, stack.url("failopen-down") + path, chat("no picker"), CLIENT_COPIES
        )
        assert status == 200
        assert not set(CLIENT_COPIES) & set(echoed["headers"]), echoed["headers"]


async def test_the_configured_prefill_endpoint_header_is_owned_too(
    log_dir: Path, http: aiohttp.ClientSession
) -> None:
    """`serve`'s own wiring (start_picker) with --prefill-endpoint-header x-prefiller-host-port:
    the picker removes it (bare Envoy), and so does the Envoy config rendered for it."""
    header = "x-prefiller-host-port"
    workers = await start_echo_workers(2)
    endpoints = [w.address for w in workers]
    config = replace(
        picker_config(endpoints), port=0, health_port=0, disagg=DisaggConfig(prefill_header=header)
    )
    running = await start_picker(config)
    envoys = []
    try:
        for name in ("bare-buffered", "duplex"):
            envoys.append(
                start_variant(
                    name, f"127.0.0.1:{running.port}", endpoints, log_dir, prefill_endpoint_header=header
                )
            )
        for envoy in envoys:
            status, _, echoed = await post(
                http, envoy.url + "/v1/chat/completions", chat("prefill"), {header: "10.9.9.9:80"}
            )
            assert status == 200 and header not in echoed["headers"]
    finally:
        for envoy in envoys:
            envoy.stop()
        await running.stop(0)
        for worker in workers:
            await worker.stop()


# --- 2. encoded paths -------------------------------------------------------------------------

ENCODED = [
    "/v1/chat/%63ompletions",
    "/v1//chat/completions",
    "/v1/x/../chat/completions",
    "/v1/chat/%2e/completions",
]


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("path", ENCODED)
async def test_an_encoded_path_is_parsed_limited_and_tracked(
    variant: str, path: str, stack: Stack, http: aiohttp.ClientSession
) -> None:
    url = URL(stack.url(variant) + path, encoded=True)
    assert_error(*await post(http, url, chat("many words " * 200)), 413, "prompt-too-long")  # limited
    assert_error(*await post(http, url, chat("hi", model="no-such-model")), 404, "unknown-model")  # parsed
    key = uuid.uuid4().hex
    held = asyncio.create_task(
        post(http, URL(f"{stack.url(variant)}{path}?hold={key}", encoded=True), chat("held"))
    )
    try:
        await until(lambda: stack.picker.selector.in_flight() == 1)  # tracked while the worker holds it
    finally:
        stack.release(key)
    status, _, echoed = await held
    assert status == 200 and echoed["headers"][epp.DESTINATION_HEADER] == echoed["worker"]
    await until(stack.picker.is_idle)


ENCODED_SLASH_TARGETS = ("/v1/chat/completions", "/v1/completions")


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("path", ["/v1%2Fchat%2Fcompletions", "/v1/chat%2fcompletions", "/v1%5Ccompletions"])
async def test_an_encoded_slash_is_refused_with_400_or_redirected_unescaped(
    variant: str, path: str, stack: Stack, http: aiohttp.ClientSession
) -> None:
    url = URL(stack.url(variant) + path, encoded=True)
    if variant == GIE:
        # Envoy answers a redirect to the path unescaped, itself: the stream's first message is that
        # answer, which the picker must pass on (before, in duplex, Envoy made it a 503); the
        # client then sends the plain path, routed like any other
        body = chat("hi") if "chat" in path else json.dumps({"model": MODEL, "prompt": "hi"}).encode()
        async with http.post(url, data=body, allow_redirects=False) as redirect:
            assert redirect.status == 307 and redirect.headers["location"] in ENCODED_SLASH_TARGETS
            # a redirect, not an error: no error body or dropped reason from our local-reply mappers
            assert b"error" not in await redirect.read()
            assert "x-gateway-request-dropped-reason" not in redirect.headers
        status, _, echoed = await post(http, url, body)  # aiohttp follows it, body and all
        assert status == 200 and echoed["path"] == redirect.headers["location"]
        assert_clean(echoed)
        await until(stack.picker.is_idle)
        return
    status, headers, answer = await post(http, url, chat("hi"))
    assert_error(status, headers, answer, 400, "invalid-request")  # Envoy's (stock) or the picker's (bare)
    assert "worker" not in answer
    await until(stack.picker.is_idle)


# --- 3. HTTP/2 request trailers ---------------------------------------------------------------

TRAILERS = [("x-checksum", "abc")]


async def timed(coroutine: Awaitable[T]) -> tuple[T, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await coroutine
    return result, loop.time() - started


@pytest.mark.parametrize("variant", ALL)
async def test_a_request_with_trailers_is_decided_like_any_other_at_once(variant: str, stack: Stack) -> None:
    port = stack.port(variant)
    headers = [("content-type", "application/json")]

    async def send(
        path: str, body: bytes, trailers: list[tuple[str, str]] = TRAILERS
    ) -> tuple[H2Response, float]:
        return await timed(h2_request("127.0.0.1", port, path, headers=headers, body=body, trailers=trailers))

    answer, took = await send("/v1/chat/completions", chat("many words " * 200))
    assert (answer.status, answer.headers[epp.DROPPED_REASON_HEADER]) == (413, "prompt-too-long")
    assert took < PROMPT_S < MESSAGE_TIMEOUT_S  # decided, not Envoy's 504 (or failopen's skip) at 5 s
    answer, took = await send("/v1/chat/completions", chat("hi", model="no-such-model"))
    assert answer.status == 404 and took < PROMPT_S
    answer, took = await send("/v1/chat/completions", b"", trailers=TRAILERS)  # headers, trailers, no data
    assert (answer.status, answer.headers[epp.DROPPED_REASON_HEADER]) == (400, "invalid-request")
    assert took < PROMPT_S
    key = uuid.uuid4().hex
    held = asyncio.create_task(send(f"/v1/chat/completions?hold={key}", chat("with trailers")))
    try:
        await until(lambda: stack.picker.selector.in_flight() == 1)  # routed and tracked
    finally:
        stack.release(key)
    answer, _ = await held
    assert answer.status == 200, answer.body
    echoed = json.loads(answer.body)
    assert echoed["headers"][epp.DESTINATION_HEADER] == echoed["worker"]
    await until(stack.picker.is_idle)


# --- 4. a POST without a body -----------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"])
async def test_a_post_without_a_body_is_the_pickers_400(
    variant: str, path: str, stack: Stack, http: aiohttp.ClientSession
) -> None:
    status, headers, answer = await post(http, stack.url(variant) + path, b"")
    assert_error(status, headers, answer, 400, "invalid-request")
    assert "request body is empty" in answer["error"]["message"] and "worker" not in answer
    h2 = await h2_request("127.0.0.1", stack.port(variant), path)  # END_STREAM on the headers
    assert (h2.status, h2.headers[epp.DROPPED_REASON_HEADER]) == (400, "invalid-request")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as other, other.get(stack.url(variant) + path) as r:
        assert r.status == 200  # a GET is not a generation request: the worker answers it (vLLM: 405)
    await until(stack.picker.is_idle)


# --- 6. a batch of prompts --------------------------------------------------------------------


async def test_a_batched_completions_prompt_is_a_400_naming_the_limit(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    body = json.dumps({"model": MODEL, "prompt": ["a", "b"]}).encode()
    status, headers, answer = await post(http, stack.url("buffered") + "/v1/completions", body)
    assert_error(status, headers, answer, 400, "invalid-request")
    assert "send one prompt per request" in answer["error"]["message"]
