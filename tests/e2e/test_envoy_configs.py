"""The Envoy configs in extproc/devstack/envoy/ with a real Envoy 1.40, the no-op picker and two echo workers.

Checks the protocol facts the configs rely on (REFERENCE 2): the picker's choice is where the
request goes, bodies pass byte-identical in BUFFERED and FULL_DUPLEX_STREAMED, SSE passes chunk by
chunk, a client cannot choose the worker, buffered/duplex fail closed and failopen fails open.
All servers share one event loop per module; Envoys start once per module.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from extproc.devstack.envoy_config import PickerHealth, PickerTls, Variant, render_envoy_config
from extproc.devstack.procs import find_envoy, reserve_port
from extproc.epp.answers import owned_headers
from extproc.errors import RequestInvalid
from extproc.request.parse import normalize_path

from .harness import (
    EchoWorker,
    EnvoyUnderTest,
    InProcessPicker,
    start_echo_worker_process,
    start_echo_workers,
    start_envoy,
    start_envoy_variant,
    start_noop_picker,
    start_noop_picker_process,
    start_stalled_picker,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

DESTINATION = "x-gateway-destination-endpoint"
DROPPED_REASON = "x-gateway-request-dropped-reason"
MiB = 1024 * 1024
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=20)
LIVE_VARIANTS: list[Variant] = ["buffered", "duplex", "failopen"]
STALL_TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envoy-logs")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers() -> AsyncIterator[list[EchoWorker]]:
    started = await start_echo_workers(2)
    yield started
    for worker in started:
        await worker.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def picker(workers: list[EchoWorker]) -> AsyncIterator[InProcessPicker]:
    started = await start_noop_picker([w.address for w in workers])
    yield started
    await started.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stalled_picker() -> AsyncIterator[InProcessPicker]:
    started = await start_stalled_picker()
    yield started
    await started.stop(grace_s=0)


@pytest.fixture(scope="module")
def envoys(
    picker: InProcessPicker, stalled_picker: InProcessPicker, workers: list[EchoWorker], log_dir: Path
) -> Iterator[dict[str, EnvoyUnderTest]]:
    """One Envoy per variant with the live picker, "<variant>-down" ones whose picker port is dead,
    and "<variant>-stalled" ones (buffered, failopen) whose picker never answers."""
    find_envoy()  # fails with the install hint before anything starts
    addresses = [w.address for w in workers]
    dead = reserve_port()  # held while the Envoys run: nothing listens there, nobody else can
    dead_picker = dead.address
    started: dict[str, EnvoyUnderTest] = {}
    try:
        for variant in LIVE_VARIANTS:
            started[variant] = start_envoy_variant(
                variant, picker_address=picker.address, workers=addresses, log_dir=log_dir
            )
            started[f"{variant}-down"] = start_envoy_variant(
                variant, picker_address=dead_picker, workers=addresses, log_dir=log_dir
            )
        for variant in ("buffered", "failopen"):
            started[f"{variant}-stalled"] = start_envoy_variant(
                variant,
                picker_address=stalled_picker.address,
                workers=addresses,
                log_dir=log_dir,
                message_timeout_ms=STALL_TIMEOUT_MS,
            )
        yield started
    finally:
        for envoy in started.values():
            envoy.stop()
        dead.release()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        yield session


@pytest.fixture
def fresh_picker(picker: InProcessPicker) -> InProcessPicker:
    """The shared picker with its records cleared, so a test sees only its own requests."""
    picker.servicer.seen_request_headers.clear()
    picker.servicer.picks.clear()
    return picker


async def post_echo(
    client: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    # A BytesIO: aiohttp warns (ResourceWarning, an error here) about large raw bytes bodies.
    async with client.post(url, data=io.BytesIO(body), headers=headers) as response:
        text = await response.text()
        assert response.status == 200, f"{response.status}: {text[:300]}"
        echoed: dict[str, Any] = json.loads(text)
        return echoed


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_requests_go_where_the_picker_chose_alternating(
    variant: Variant,
    envoys: dict[str, EnvoyUnderTest],
    fresh_picker: InProcessPicker,
    workers: list[EchoWorker],
    client: aiohttp.ClientSession,
) -> None:
    served = []
    for index in range(4):
        echoed = await post_echo(client, envoys[variant].url + "/v1/chat/completions", b'{"i": %d}' % index)
        assert echoed["headers"][DESTINATION] == echoed["worker"]
        served.append(echoed["worker"])
    assert served == list(fresh_picker.servicer.picks)
    assert set(served) == {w.address for w in workers}
    assert all(a != b for a, b in itertools.pairwise(served))


@pytest.mark.parametrize(
    ("variant", "size"), [("buffered", 2 * MiB), ("duplex", 3 * MiB), ("failopen", 2 * MiB)]
)
async def test_large_body_arrives_byte_identical(
    variant: Variant,
    size: int,
    envoys: dict[str, EnvoyUnderTest],
    fresh_picker: InProcessPicker,
    client: aiohttp.ClientSession,
) -> None:
    body = os.urandom(size)
    echoed = await post_echo(client, envoys[variant].url + "/v1/completions", body)
    assert echoed["body_len"] == size
    assert echoed["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert echoed["worker"] == fresh_picker.servicer.picks[-1]
    if variant == "duplex":
        # The picker streams the body back: the upstream sees chunked encoding (REFERENCE 2).
        assert echoed["headers"].get("transfer-encoding") == "chunked"
    else:
        assert echoed["headers"].get("content-length") == str(size)


def assert_envoy_answer(status: int, headers: Any, text: str, expected: int, reason: str) -> dict[str, Any]:
    """Envoy's own answer in the picker's shape (envoy/local_replies.yaml): OpenAI-style JSON and the
    dropped reason."""
    assert status == expected, text
    assert headers["content-type"] == "application/json"
    assert headers[DROPPED_REASON] == reason
    error: dict[str, Any] = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == expected and error["param"] is None and error["message"]
    return error


@pytest.mark.parametrize("variant", ["buffered", "failopen"])
async def test_buffered_body_over_the_limit_gets_413(
    variant: Variant, envoys: dict[str, EnvoyUnderTest], client: aiohttp.ClientSession
) -> None:
    async with client.post(
        envoys[variant].url + "/v1/completions", data=io.BytesIO(os.urandom(5 * MiB))
    ) as response:
        error = assert_envoy_answer(
            response.status, response.headers, await response.text(), 413, "body-too-large"
        )
    assert error["type"] == "BadRequestError" and f"limit of {4 * MiB} bytes" in error["message"]


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_get_without_body(
    variant: Variant,
    envoys: dict[str, EnvoyUnderTest],
    fresh_picker: InProcessPicker,
    client: aiohttp.ClientSession,
) -> None:
    async with client.get(envoys[variant].url + "/v1/models") as response:
        assert response.status == 200
        echoed = await response.json()
    assert echoed["method"] == "GET"
    assert echoed["body_len"] == 0
    assert echoed["worker"] == echoed["headers"][DESTINATION] == fresh_picker.servicer.picks[-1]


async def read_sse_event(stream: aiohttp.StreamReader) -> str:
    """The data of the next server-sent event."""
    data = []
    while True:
        line = await stream.readline()
        if not line:
            raise EOFError("stream ended inside an event")
        if line in (b"\n", b"\r\n"):
            return "".join(data)
        if line.startswith(b"data: "):
            data.append(line[6:].decode().rstrip("\r\n"))


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_sse_passes_chunk_by_chunk(
    variant: Variant,
    envoys: dict[str, EnvoyUnderTest],
    workers: list[EchoWorker],
    client: aiohttp.ClientSession,
) -> None:
    # The worker sends event i+1 only after the client has received event i: if Envoy or the
    # picker held the response back, the first read would time out.
    key = uuid.uuid4().hex
    count = 4
    async with client.get(envoys[variant].url + f"/sse?n={count}&key={key}") as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        served = None
        for index in range(count):
            event = json.loads(await asyncio.wait_for(read_sse_event(response.content), 5.0))
            assert event["index"] == index
            served = served or event["worker"]
            assert event["worker"] == served
            for worker in workers:
                if worker.address == served:
                    worker.release(key)
        assert await asyncio.wait_for(read_sse_event(response.content), 5.0) == "[DONE]"


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_client_destination_header_neither_routes_nor_reaches_the_picker(
    variant: Variant,
    envoys: dict[str, EnvoyUnderTest],
    fresh_picker: InProcessPicker,
    workers: list[EchoWorker],
    client: aiohttp.ClientSession,
) -> None:
    worker_b = workers[1].address
    forged = [worker_b, worker_b, "127.0.0.1:1"]  # the last one would fail if it were honoured
    served = []
    for value in forged:
        echoed = await post_echo(
            client, envoys[variant].url + "/v1/completions", b"{}", headers={DESTINATION: value}
        )
        assert echoed["headers"][DESTINATION] == echoed["worker"]
        served.append(echoed["worker"])
    assert served == list(fresh_picker.servicer.picks)
    assert workers[0].address in served  # the picker chose A at least once despite the client's B
    seen = list(fresh_picker.servicer.seen_request_headers)
    assert len(seen) == len(forged)
    assert all(DESTINATION not in headers for headers in seen)


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_headers_the_picker_owns_are_stripped_before_the_picker_runs(
    variant: Variant,
    envoys: dict[str, EnvoyUnderTest],
    fresh_picker: InProcessPicker,
    client: aiohttp.ClientSession,
) -> None:
    """The no-op picker removes nothing: what it and the worker see is Envoy's doing alone."""
    forged = {name: "10.9.9.9:80" for name in owned_headers()}
    for path in ("/v1/chat/completions", "/v1/models"):
        echoed = await post_echo(client, envoys[variant].url + path, b"{}", headers=forged)
        assert set(echoed["headers"]) & set(forged) == {DESTINATION}
        assert echoed["headers"][DESTINATION] == echoed["worker"]
    seen = list(fresh_picker.servicer.seen_request_headers)
    assert len(seen) == 2 and not any(set(headers) & set(forged) for headers in seen)


# raw :path as a client sends it -> what the picker decides on (None: Envoy and the picker answer 400)
PATHS = {
    "/v1/chat/%63ompletions": "/v1/chat/completions",
    "/v1/chat/%63%6F%6d%70letions?q=%63": "/v1/chat/completions?q=%63",
    "//v1///completions?a//b": "/v1/completions?a//b",
    "/v1/x/../chat/completions": "/v1/chat/completions",
    "/v1/chat/%2e%2E/completions": "/v1/completions",
    "/../v1/completions": "/v1/completions",
    "/v1\\chat\\completions": "/v1/chat/completions",
    "/a;b/../v1/models": "/v1/models",
    "/v1/chat/completions/.": "/v1/chat/completions/",
    "/v1/%7e%41%5a%20%3f%25": "/v1/~AZ%20%3f%25",
    "/a%252Fb": "/a%252Fb",
    # a `%` that starts no escape stays, unless the decoding puts two hex digits after it
    "/%%32%65/v1/./com%70%6c%65%74ions": "/%252e/v1/completions",
    "/v1/%2%65/x": "/v1/%252e/x",
    "/v1/%4%31": "/v1/%2541",
    "/%41/%%32%65/x": "/A/%252e/x",
    "/v1/%%41": "/v1/%A",
    "/v1/%%2e%2e/x": "/v1/%../x",
    "/v1/100%": "/v1/100%",
    "/v1/%zz/%4x/%g1/%": "/v1/%zz/%4x/%g1/%",
    "/v1%2Fchat%2Fcompletions": None,
    "/v1/chat%2fcompletions": None,
    "/v1%5Ccompletions": None,
    "/v1/%00": None,
    "/v1/models#x": None,
}


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_envoy_and_the_picker_normalise_paths_alike(
    variant: Variant, envoys: dict[str, EnvoyUnderTest], fresh_picker: InProcessPicker
) -> None:
    """Envoy's normalize_path + merge_slashes + REJECT_REQUEST for escaped slashes, and the picker's
    normalize_path: the :path the picker is given is the one it would decide on by itself."""
    for raw, expected in PATHS.items():
        status = await raw_get(envoys[variant].listen_port, raw)
        if expected is None:
            assert status == 400, raw
            with pytest.raises(RequestInvalid):
                normalize_path(raw)
            continue
        assert status == 200, raw
        forwarded = fresh_picker.servicer.seen_request_headers[-1][":path"]
        assert forwarded == expected == normalize_path(raw), raw
    assert len(fresh_picker.servicer.seen_request_headers) == sum(v is not None for v in PATHS.values())


async def raw_get(port: int, path: str) -> int:
    """GET `path` byte for byte (HTTP clients normalise paths themselves); the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode("latin-1"))
        status_line = await asyncio.wait_for(reader.readline(), 10)
        await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


@pytest.mark.parametrize("variant", ["buffered", "duplex"])
async def test_picker_down_fails_closed_with_503(
    variant: Variant, envoys: dict[str, EnvoyUnderTest], client: aiohttp.ClientSession
) -> None:
    url = envoys[f"{variant}-down"].url
    async with client.post(url + "/v1/completions", data=b'{"model": "m"}') as response:
        # status_on_error; Envoy's default would be 500
        assert_envoy_answer(
            response.status, response.headers, await response.text(), 503, "picker-unavailable"
        )
        assert response.headers["retry-after"] == "1"
    async with client.get(url + "/v1/models") as response:
        assert_envoy_answer(
            response.status, response.headers, await response.text(), 503, "picker-unavailable"
        )


@pytest.mark.parametrize(("variant", "expected_status"), [("buffered", 504), ("failopen", 200)])
async def test_hung_picker_times_out_after_message_timeout(
    variant: Variant, expected_status: int, envoys: dict[str, EnvoyUnderTest], client: aiohttp.ClientSession
) -> None:
    # message_timeout bounds each answer: buffered fails with 504, failopen skips the picker.
    # (FULL_DUPLEX_STREAMED arms no such timer in Envoy 1.40: see extproc/devstack/envoy/README.md.)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with client.post(envoys[f"{variant}-stalled"].url + "/v1/completions", data=b"{}") as response:
        assert response.status == expected_status
        if expected_status == 504:
            assert_envoy_answer(
                response.status, response.headers, await response.text(), 504, "picker-timeout"
            )
    assert STALL_TIMEOUT_MS / 1000 * 0.9 <= loop.time() - started < 5.0


async def test_envoys_other_errors_take_the_pickers_shape_and_its_redirects_pass_as_they_are(
    workers: list[EchoWorker], client: aiohttp.ClientSession, log_dir: Path
) -> None:
    """What local_replies.yaml's last mapper catches: an error Envoy answers itself for a reason no
    other mapper names (here a route's direct 418), while a redirect it answers (a route's redirect,
    as UNESCAPE_AND_REDIRECT's for an encoded slash) stays a plain redirect. Behind the failopen
    variant with no picker, so the request reaches those routes."""
    dead = reserve_port()  # held while Envoy runs: nothing listens there
    config = render_envoy_config(
        "failopen", picker_address=dead.address, workers=[w.address for w in workers]
    )
    routes = (
        '              - match: { prefix: "/teapot" }\n'
        '                direct_response: { status: 418, body: { inline_string: "short and stout" } }\n'
        '              - match: { prefix: "/moved" }\n'
        '                redirect: { path_redirect: "/v1/models" }\n'
    )
    assert config.count("              routes:\n") == 1  # the template's one route list, as expected
    envoy = start_envoy(
        config.replace("              routes:\n", "              routes:\n" + routes),
        log_path=log_dir / "envoy-local-replies.log",
    )
    try:
        async with client.get(envoy.url + "/teapot") as response:
            error = assert_envoy_answer(
                response.status, response.headers, await response.text(), 418, "gateway-rejected"
            )
            assert error["message"] == "short and stout"
        async with client.get(envoy.url + "/moved", allow_redirects=False) as response:
            assert response.status == 301 and response.headers["location"].endswith("/v1/models")
            assert DROPPED_REASON not in response.headers and await response.read() == b""
    finally:
        envoy.stop()
        dead.release()


async def test_failopen_serves_round_robin_without_a_picker(
    envoys: dict[str, EnvoyUnderTest], workers: list[EchoWorker], client: aiohttp.ClientSession
) -> None:
    url = envoys["failopen-down"].url
    served = []
    for _ in range(4):
        echoed = await post_echo(client, url + "/v1/completions", b'{"model": "m"}')
        assert DESTINATION not in echoed["headers"]
        served.append(echoed["worker"])
    async with client.get(url + "/v1/models") as response:
        assert response.status == 200
    assert set(served) == {w.address for w in workers}


async def test_picker_and_worker_as_child_processes(log_dir: Path, client: aiohttp.ClientSession) -> None:
    """The no-op picker's and the echo worker's command lines, behind the default (buffered) config;
    each binds port 0 and reports its port (--ports-file)."""
    with start_echo_worker_process(log_path=log_dir / "worker.log") as worker:
        worker_address = f"127.0.0.1:{worker.ports()['port']}"
        with start_noop_picker_process([worker_address], log_path=log_dir / "picker.log") as picker:
            picker_address = f"127.0.0.1:{picker.ports()['port']}"
            envoy = start_envoy_variant(
                "buffered", picker_address=picker_address, workers=[], log_dir=log_dir
            )
            try:
                for _ in range(2):
                    echoed = await post_echo(client, envoy.url + "/v1/completions", b"x" * 1000)
                    assert echoed["worker"] == echoed["headers"][DESTINATION] == worker_address
            finally:
                envoy.stop()
            # SIGTERM is a clean shutdown for both.
            assert picker.stop(grace_s=5.0) == 0, picker.log_tail()
        assert worker.stop(grace_s=5.0) == 0, worker.log_tail()


async def test_rendered_configs_pass_envoy_validation(tmp_path: Path) -> None:
    """Every variant, with and without TLS to the picker, passes `envoy --mode validate`."""
    envoy = find_envoy()
    for variant in LIVE_VARIANTS:
        for picker_tls in (False, True):
            config = render_envoy_config(
                variant,
                listen_port=10000,
                admin_port=10001,
                picker_address="127.0.0.1:9002",
                workers=["127.0.0.1:8001", "[::1]:8002"],
                picker_tls=picker_tls,
            )
            path = tmp_path / f"{variant}-{picker_tls}.yaml"
            path.write_text(config)
            result = subprocess.run(
                [envoy, "--mode", "validate", "--disable-hot-restart", "-c", str(path)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert result.returncode == 0, f"{variant} tls={picker_tls}: {result.stdout}{result.stderr}"


async def test_failopen_with_several_models_passes_envoy_validation(tmp_path: Path) -> None:
    """failopen with workers per model (IPv6, a worker serving two models, a model name needing
    quotes) passes `envoy --mode validate`; test_failopen_models_e2e.py runs it."""
    config = render_envoy_config(
        "failopen",
        picker_address="127.0.0.1:9002",
        workers={
            "org/chat: 8B": ["127.0.0.1:8001", "[::1]:8002"],
            'embed"er': ["[::1]:8002", "127.0.0.1:8003"],
        },
    )
    parsed = yaml.safe_load(config)
    hosts = parsed["static_resources"]["clusters"][1]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [h["metadata"]["filter_metadata"]["envoy.lb"]["model"] for h in hosts] == [
        "org/chat: 8B",
        ["org/chat: 8B", 'embed"er'],
        'embed"er',
    ]
    path = tmp_path / "failopen-models.yaml"
    path.write_text(config)
    result = subprocess.run(
        [find_envoy(), "--mode", "validate", "--disable-hot-restart", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_one_model_renders_as_before(variant: Variant) -> None:
    """With one model nothing changes: workers named per model give the config of the plain list
    (failopen: round robin over every worker, no json_to_metadata filter, no host metadata)."""
    workers = ["127.0.0.1:8001", "127.0.0.1:8002"]
    plain = render_envoy_config(variant, picker_address="127.0.0.1:9002", workers=workers)
    named = render_envoy_config(variant, picker_address="127.0.0.1:9002", workers={"m": workers})
    assert yaml.safe_load(plain) == yaml.safe_load(named)
    assert (
        "json_to_metadata.v3" not in plain and "subset.v3" not in plain and "metadata: {filter" not in plain
    )


@pytest.mark.parametrize(
    "workers",
    [{"m": []}, {"": ["127.0.0.1:8001"]}, {"m": "127.0.0.1:8001"}, "127.0.0.1:8001", {"m": ["nohost"]}],
)
async def test_bad_workers_are_refused(workers: Any) -> None:
    with pytest.raises(ValueError):
        render_envoy_config("failopen", picker_address="127.0.0.1:9002", workers=workers)


async def test_the_cli_takes_workers_per_model(capsys: pytest.CaptureFixture[str]) -> None:
    from extproc.cli import main

    assert main(["envoy-config", "--variant", "failopen", "--workers", "a=127.0.0.1:1,127.0.0.1:2",
                 "--workers", "b=127.0.0.1:3"]) == 0  # fmt: skip
    hosts = yaml.safe_load(capsys.readouterr().out)["static_resources"]["clusters"][1]["load_assignment"]
    models = [
        h["metadata"]["filter_metadata"]["envoy.lb"]["model"] for h in hosts["endpoints"][0]["lb_endpoints"]
    ]
    assert models == ["a", "a", "b"]
    assert main(["envoy-config", "--variant", "failopen", "--workers", "127.0.0.1:1,127.0.0.1:2"]) == 0
    assert "json_to_metadata.v3" not in capsys.readouterr().out
    assert (
        main(
            [
                "envoy-config",
                "--variant",
                "failopen",
                "--workers",
                "127.0.0.1:1",
                "--workers",
                "b=127.0.0.1:3",
            ]
        )
        == 2
    )
    assert "name the model of every list" in capsys.readouterr().err


def _validate(config: str, path: Path) -> None:
    path.write_text(config)
    result = subprocess.run(
        [find_envoy(), "--mode", "validate", "--disable-hot-restart", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", LIVE_VARIANTS)
async def test_several_picker_replicas_are_health_checked_ejected_and_retried(
    variant: Variant, tmp_path: Path
) -> None:
    """Every variant lists the replicas with their health ports, health-checks them over plaintext
    (also when ext_proc is TLS), ejects one after consecutive gateway failures and retries an
    unanswered ext_proc stream on another; test_picker_replicas_e2e.py runs it under faults."""
    from ..certs import TestCa

    ca = TestCa(tmp_path / "ca")
    pickers = ["127.0.0.1:9002", "127.0.0.2:9002", "[::1]:9012"]
    for tls in (False, PickerTls(ca_file=ca.ca_file, server_name="picker.internal")):
        config = render_envoy_config(
            variant,
            picker_address=pickers,
            picker_health_port=[9003, 9003, 9013],
            picker_health=PickerHealth(interval_ms=500, unhealthy_threshold=3, retries=1),
            workers=["127.0.0.1:8001"],
            picker_tls=tls,
        )
        _validate(config, tmp_path / f"{variant}-{bool(tls)}.yaml")
        parsed = yaml.safe_load(config)
        cluster = parsed["static_resources"]["clusters"][0]
        assert cluster["name"] == "endpoint_picker"
        hosts = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert [
            (
                h["endpoint"]["address"]["socket_address"]["address"],
                h["endpoint"]["health_check_config"]["port_value"],
            )
            for h in hosts
        ] == [("127.0.0.1", 9003), ("127.0.0.2", 9003), ("::1", 9013)]
        (check,) = cluster["health_checks"]
        assert check["grpc_health_check"]["service_name"] == "envoy.service.ext_proc.v3.ExternalProcessor"
        assert (check["interval"], check["unhealthy_threshold"], check["healthy_threshold"]) == (
            "0.500s",
            3,
            1,
        )
        (plaintext,) = cluster["transport_socket_matches"]
        assert plaintext["match"] == check["transport_socket_match_criteria"]
        assert plaintext["transport_socket"]["name"] == "envoy.transport_sockets.raw_buffer"
        assert ("transport_socket" in cluster) == bool(tls)
        assert cluster["outlier_detection"]["consecutive_gateway_failure"] == 2
        assert cluster["common_lb_config"]["healthy_panic_threshold"]["value"] == 1
        http_filters = parsed["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        (ext_proc,) = [
            f
            for f in http_filters["typed_config"]["http_filters"]
            if f["name"] == "envoy.filters.http.ext_proc"
        ]
        retry = ext_proc["typed_config"]["grpc_service"]["retry_policy"]
        assert retry["num_retries"] == 1 and "connect-failure" in retry["retry_on"]


@pytest.mark.parametrize(
    ("render", "message"),
    [
        ({"picker_address": []}, "at least one picker"),
        ({"picker_address": ["127.0.0.1:9002", "127.0.0.1:9002"]}, "twice"),
        (
            {"picker_address": ["127.0.0.1:9002", "127.0.0.1:9012"], "picker_health_port": [9003]},
            "one per picker",
        ),
        ({"picker_address": "127.0.0.1:9002", "picker_health_port": 0}, "not a TCP port"),
        (
            {"picker_address": ["10.0.0.1:9002", "10.0.0.2:9002"], "picker_tls": PickerTls(ca_file="ca.pem")},
            "need a server_name",
        ),
    ],
)
async def test_bad_picker_lists_are_refused(render: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_envoy_config("buffered", **render)


async def test_bad_picker_health_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_ms=0 must be at least 1"):
        PickerHealth(interval_ms=0)
    with pytest.raises(ValueError, match="retries=-1"):
        PickerHealth(retries=-1)


async def test_the_cli_takes_picker_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    from extproc.cli import main

    argv = ["envoy-config", "--picker", "127.0.0.1:1,127.0.0.1:2", "--picker", "127.0.0.1:3",
            "--picker-health-port", "4,5,6", "--picker-health-interval-ms", "250",
            "--picker-unhealthy-threshold", "3", "--picker-healthy-threshold", "2"]  # fmt: skip
    assert main(argv) == 0
    cluster = yaml.safe_load(capsys.readouterr().out)["static_resources"]["clusters"][0]
    hosts = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    endpoints = [h["endpoint"] for h in hosts]
    assert [(e["address"]["socket_address"]["port_value"], e["health_check_config"]["port_value"])
            for e in endpoints] == [(1, 4), (2, 5), (3, 6)]  # fmt: skip
    (check,) = cluster["health_checks"]
    assert (check["interval"], check["unhealthy_threshold"], check["healthy_threshold"]) == ("0.250s", 3, 2)
    assert main(["envoy-config"]) == 0  # one picker on 127.0.0.1:9002, health on 9003
    hosts = yaml.safe_load(capsys.readouterr().out)["static_resources"]["clusters"][0]["load_assignment"]
    (host,) = hosts["endpoints"][0]["lb_endpoints"]
    assert host["endpoint"]["address"]["socket_address"]["port_value"] == 9002
    assert host["endpoint"]["health_check_config"]["port_value"] == 9003
    assert main(["envoy-config", "--picker", "127.0.0.1:1,127.0.0.1:2", "--picker-health-port", "4,5"]) == 0
    capsys.readouterr()
    assert main(["envoy-config", "--picker", "127.0.0.1:1,127.0.0.1:2", "--picker-health-port", "4,5,6"]) == 2
    assert "one per picker" in capsys.readouterr().err
    assert main(["envoy-config", "--picker-health-interval-ms", "0"]) == 2
    assert "interval_ms=0" in capsys.readouterr().err
