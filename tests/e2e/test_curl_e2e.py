"""`curl` in front of the picker, through a real Envoy 1.40 of each variant.

curl is the client people paste from every serving guide, and it speaks differently from the Python
clients of the other tests: it waits for `100 Continue` before sending a body over 1 MiB (`Expect:
100-continue`), streams a body of unknown length with chunked encoding, and speaks HTTP/2 over
cleartext with prior knowledge. Each request is answered by the picker (an error) or streamed from
the worker the picker chose (mock workers, `extproc mock-worker`, child processes, which name
themselves in `x-worker-id`), and the picker is idle once curl is done. The curl binary of the host
runs (Debian's curl 7.88 here); the test fails, never skips, without one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from extproc.config import ModelConfig, PickerConfig, WorkerConfig
from extproc.devstack.envoy_config import VARIANTS, Variant
from extproc.devstack.stack import MODEL, WorkerProcess, start_workers
from extproc.epp import answers as epp
from extproc.router import RouterConfig
from extproc.runtime.server import RunningPicker

from ..replica_helpers import until
from .harness import behind_envoy

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT_LIMIT = 200_000  # --max-prompt-tokens: a 2 MiB prompt is over it, a short one far under
CURL_TIMEOUT_S = 30.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    verbose: str  # curl's -v trace (stderr): what it sent and got, Expect and 100 Continue included


@pytest.fixture(scope="module")
def curl() -> str:
    found = shutil.which("curl")
    if found is None:
        pytest.fail("these tests run the host's curl binary, and none is on PATH (apt-get install curl)")
    return found


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("curl-e2e")


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = start_workers(2, log_dir, speedup=4.0, kv_events=False)
    yield started
    for w in started:
        w.process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=VARIANTS)
async def stack(
    request: pytest.FixtureRequest, workers: list[WorkerProcess], log_dir: Path
) -> AsyncIterator[tuple[RunningPicker, str]]:
    variant: Variant = request.param
    config = PickerConfig(
        router=RouterConfig(block_size=16, use_kv_events=False),
        workers=tuple(WorkerConfig(w.worker_id, w.endpoint, MODEL) for w in workers),
        models=(ModelConfig(MODEL),),
        max_prompt_tokens=PROMPT_LIMIT,
        port=0,
        health_port=0,
        admin_port=0,
    )
    endpoints = [w.endpoint for w in workers]
    async with behind_envoy(config, log_dir, variant, workers=endpoints) as (picker, envoy):
        yield picker, envoy.url


async def run_curl(curl: str, *args: str, body: bytes | None = None) -> Answer:
    """curl with `args`, `body` on its stdin; the answer's status, headers (of the last response:
    not the 100 Continue) and body."""

    def call() -> subprocess.CompletedProcess[bytes]:
        argv = [curl, "-sS", "-v", "--max-time", str(CURL_TIMEOUT_S), "-D", "-", *args]
        return subprocess.run(argv, input=body, capture_output=True, timeout=CURL_TIMEOUT_S + 5)

    done = await asyncio.get_running_loop().run_in_executor(None, call)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    head, _, rest = done.stdout.partition(b"\r\n\r\n")
    while head.split(b" ", 2)[1:2] == [b"100"]:  # an interim 100 Continue comes first
        head, _, rest = rest.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return Answer(int(status_line.split()[1]), headers, rest, done.stderr.decode(errors="replace"))


def chat(text: str, *, stream: bool = True) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 6, "stream": stream}
    ).encode()


def events(body: bytes) -> list[str]:
    return [line.removeprefix("data: ") for line in body.decode().splitlines() if line.startswith("data: ")]


def assert_streamed_from_a_worker(answer: Answer, workers: list[WorkerProcess]) -> None:
    assert answer.status == 200, answer.body
    assert answer.headers["x-worker-id"] in {w.worker_id for w in workers}
    sent = events(answer.body)
    assert sent[-1] == "[DONE]"
    chunks = [json.loads(e) for e in sent[:-1]]
    assert chunks and all(c["model"] == MODEL for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


JSON = ("-H", "content-type: application/json")


async def test_a_streamed_chat_completion_arrives_event_by_event(curl, stack, workers) -> None:
    picker, url = stack
    answer = await run_curl(curl, "-N", *JSON, "--data-binary", "@-", f"{url}/v1/chat/completions",
                            body=chat("tell me about prefix caches"))  # fmt: skip
    assert_streamed_from_a_worker(answer, workers)
    await until(picker.picker.is_idle, 5.0, "the picker freed the request")


async def test_a_body_sent_chunked_is_routed_on_the_whole_body(curl, stack, workers) -> None:
    picker, url = stack
    answer = await run_curl(curl, "-N", *JSON, "-H", "transfer-encoding: chunked", "--data-binary", "@-",
                            f"{url}/v1/chat/completions", body=chat("chunked " * 3000))  # fmt: skip
    assert "transfer-encoding: chunked" in answer.verbose.lower()  # curl sent it so
    assert_streamed_from_a_worker(answer, workers)
    await until(picker.picker.is_idle, 5.0, "the picker freed the request")


async def test_http2_with_prior_knowledge_streams_too(curl, stack, workers) -> None:
    picker, url = stack
    answer = await run_curl(curl, "-N", "--http2-prior-knowledge", *JSON, "--data-binary", "@-",
                            f"{url}/v1/chat/completions", body=chat("over h2c"))  # fmt: skip
    assert "< http/2 200" in answer.verbose.lower()
    assert_streamed_from_a_worker(answer, workers)
    await until(picker.picker.is_idle, 5.0, "the picker freed the request")


async def test_a_body_over_1_mib_waits_for_100_continue_and_gets_the_pickers_answer(
    curl, stack, workers, tmp_path: Path
) -> None:
    """curl asks `Expect: 100-continue` before a 2 MiB body; Envoy says continue, the picker reads
    the whole body and refuses the prompt (over --max-prompt-tokens) before any worker sees it."""
    picker, url = stack
    body = tmp_path / "long.json"
    body.write_bytes(chat("many words " * (2 * 1024 * 1024 // 11), stream=False))
    answer = await run_curl(curl, *JSON, "--data-binary", f"@{body}", f"{url}/v1/chat/completions")
    assert "expect: 100-continue" in answer.verbose.lower()
    assert answer.status == 413, answer.body
    assert answer.headers[epp.DROPPED_REASON_HEADER] == "prompt-too-long"
    assert "x-worker-id" not in answer.headers
    error = json.loads(answer.body)["error"]
    assert error["code"] == 413 and str(PROMPT_LIMIT) in error["message"].replace(",", "")
    # a short prompt in a body over 1 MiB goes on to a worker, whose own body limit (the mock
    # worker's 1 MiB, aiohttp's default) then answers
    short = tmp_path / "padded.json"
    padded = json.loads(chat("a short prompt"))
    padded["user"] = "x" * (1024 * 1024 + 1)  # a field the prompt does not count
    short.write_bytes(json.dumps(padded).encode())
    answer = await run_curl(curl, *JSON, "--data-binary", f"@{short}", f"{url}/v1/chat/completions")
    assert "expect: 100-continue" in answer.verbose.lower()
    assert answer.status == 413 and answer.headers["x-worker-id"] in {w.worker_id for w in workers}
    assert answer.body.startswith(b"Maximum request body size")
    await until(picker.picker.is_idle, 5.0, "the picker freed both requests")
