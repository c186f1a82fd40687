"""A multipart form's `model` field, read as the engines read it (`extproc.request.form`).

vLLM 0.33 and SGLang 0.5.23 read an audio upload's form with FastAPI's `Form()`, that is Starlette's
`MultiPartParser` on python-multipart. The forms here come from the real clients (the `openai`
package's encoder, `curl -F`) and from Hypothesis, and each is read by Starlette's parser itself:
wherever Starlette takes the form, the picker reads the same first `model` field, whatever the
chunks the body arrives in.
"""

from __future__ import annotations

import asyncio
import subprocess

import httpx2
import openai
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartParser

from extproc.request.form import MAX_MODEL_BYTES, FormModel, form_model, is_form

MODEL = "openai/whisper-large-v3"
AUDIO = bytes(range(256)) * 64  # 16 KiB of every byte value, the delimiter's bytes among them


class _Refused(Exception):
    pass


async def starlette_model(content_type: str, chunks: list[bytes]) -> str | None:
    """The first text field named `model` as Starlette's form parser reads the body; `_Refused` when
    it refuses the form (the engine's 400)."""

    async def stream():
        for chunk in chunks:
            yield chunk

    parser = MultiPartParser(Headers({"content-type": content_type}), stream())
    try:
        form = await parser.parse()
    except Exception as exc:
        raise _Refused from exc
    finally:  # every file it opened, those of parts a truncated form never ended too
        for file in parser._files_to_close_on_error:
            file.close()
    values = [v for k, v in form.multi_items() if k == "model" and not isinstance(v, UploadFile)]
    return values[0] if values else None


def fed(content_type: str, chunks: list[bytes]) -> tuple[str | None, int | None]:
    """What `FormModel` reads from `chunks`, and the index of the chunk it settled on (None: the
    body ended first)."""
    form = FormModel(content_type)
    for index, chunk in enumerate(chunks):
        if form.feed(chunk):
            return form.model, index
    return form.end(), None


def openai_upload(fields: dict[str, object], audio: bytes = AUDIO) -> tuple[str, bytes]:
    """The content type and body the `openai` client sends for a transcription."""
    sent: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json={"text": "hi"})

    client = openai.OpenAI(
        api_key="x",
        base_url="http://127.0.0.1:9/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    client.audio.transcriptions.create(file=("a.wav", audio, "audio/wav"), **fields)  # type: ignore[call-overload]
    (request,) = sent
    return request.headers["content-type"], request.read()


def test_the_openai_clients_upload_is_read_from_its_first_chunk() -> None:
    content_type, body = openai_upload({"model": MODEL, "language": "en"})
    assert body.index(b'name="model"') < body.index(b'name="file"')  # fields before files
    chunks = [body[i : i + 512] for i in range(0, len(body), 512)]
    assert fed(content_type, chunks) == (MODEL, 0)
    assert form_model(body, content_type) == MODEL
    assert asyncio.run(starlette_model(content_type, chunks)) == MODEL


async def test_curl_sends_the_file_first_when_told_so_and_the_model_is_read_after_it(tmp_path) -> None:
    """`curl -F` keeps the order of its arguments: the model comes after the file's bytes."""
    received: list[tuple[str, bytes]] = []

    async def capture(request: web.Request) -> web.Response:
        received.append((request.headers["content-type"], await request.read()))
        return web.json_response({"text": "hi"})

    app = web.Application()
    app.router.add_post("/v1/audio/transcriptions", capture)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        audio = tmp_path / "a.wav"
        audio.write_bytes(AUDIO)
        args = ["curl", "-sf", "-F", f"file=@{audio}", "-F", f"model={MODEL}", "-F", "language=en"]
        done = await asyncio.to_thread(
            subprocess.run, [*args, f"http://127.0.0.1:{port}/v1/audio/transcriptions"], timeout=30
        )
        assert done.returncode == 0
    finally:
        await runner.cleanup()
    ((content_type, body),) = received
    assert body.index(b'name="file"') < body.index(b'name="model"')
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    model, settled_at = fed(content_type, chunks)
    assert model == MODEL and settled_at == len(AUDIO) // 4096  # read when its part ends, after the file
    assert await starlette_model(content_type, chunks) == MODEL


def test_a_large_upload_is_read_from_its_first_bytes_and_its_file_is_never_read() -> None:
    content_type, body = openai_upload({"model": MODEL}, audio=b"\0" * (20 << 20))
    form = FormModel(content_type)
    assert form.feed(body[:65536]) and form.model == MODEL
    assert form.feed(b"not a form at all")  # later chunks are not read


@pytest.mark.parametrize(
    ("content_type", "form"),
    [
        ("multipart/form-data; boundary=abc", True),
        ('Multipart/Form-Data; boundary="abc"; charset=latin-1', True),
        ("multipart/form-data", False),  # no boundary: Starlette refuses it
        ('multipart/form-data; boundary=""', False),
        ("multipart/mixed; boundary=abc", False),
        ("application/x-www-form-urlencoded", False),  # cannot carry the file these endpoints need
        ("application/json", False),
        ("", False),
    ],
)
def test_only_a_multipart_form_with_a_boundary_is_a_form(content_type, form) -> None:
    assert is_form(content_type) is form
    if not form:
        assert (
            form_model(
                b"--abc\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--abc--", content_type
            )
            is None
        )


def form(parts: list[bytes], boundary: bytes = b"xYz") -> bytes:
    return (
        b"".join(b"--" + boundary + b"\r\n" + part + b"\r\n" for part in parts) + b"--" + boundary + b"--\r\n"
    )


def field(name: bytes, value: bytes, extra: bytes = b"") -> bytes:
    return b'Content-Disposition: form-data; name="' + name + b'"' + extra + b"\r\n\r\n" + value


CT = "multipart/form-data; boundary=xYz"


@pytest.mark.parametrize(
    ("parts", "content_type", "model"),
    [
        ([field(b"model", b"m1"), field(b"model", b"m2")], CT, "m1"),  # the first decides (FastAPI: the last)
        (
            [field(b"model", b"a.wav", b'; filename="a.wav"'), field(b"model", b"m")],
            CT,
            "m",
        ),  # a file is not it
        ([field(b"model", b"a", b'; filename="a.wav"')], CT, None),
        ([field(b"Model", b"m")], CT, None),  # names are case-sensitive
        ([field(b"model", b"")], CT, None),  # empty: names no model
        ([b"Content-Disposition: form-data; name=model\r\n\r\nm"], CT, "m"),  # unquoted
        ([b'content-disposition: form-data; name="model"\r\nContent-Type: text/plain\r\n\r\nm'], CT, "m"),
        ([field(b"model", "caf\u00e9".encode("latin-1"))], CT + "; charset=latin-1", "caf\u00e9"),
        ([field(b"model", b"caf\xe9")], CT, "caf\u00e9"),  # not UTF-8: Latin-1, as Starlette
        ([field(b"model", "caf\u00e9".encode())], CT + "; charset=bogus", "caf\u00c3\u00a9"),
        ([field(b"model", b"m" * MAX_MODEL_BYTES)], CT, "m" * MAX_MODEL_BYTES),
        ([field(b"model", b"m" * (MAX_MODEL_BYTES + 1))], CT, None),
        ([b"Content-Disposition: form-data\r\n\r\nm", field(b"model", b"m")], CT, None),  # no name: refused
        ([field(b"language", b"en")], CT, None),
    ],
)
def test_which_field_is_the_model(parts, content_type, model) -> None:
    body = form(parts)
    assert form_model(body, content_type) == model
    assert fed(content_type, [body[i : i + 3] for i in range(0, len(body), 3)])[0] == model


@pytest.mark.parametrize(
    "body",
    [b"", b"garbage", b"--other\r\n" + field(b"model", b"m"), form([field(b"model", b"m")])[:-30]],
)
def test_what_is_not_a_readable_form_names_no_model(body) -> None:
    assert form_model(body, CT) is None


def test_a_boundary_longer_than_the_parser_takes_names_no_model() -> None:
    """python-multipart refuses a boundary over 256 bytes (0.0.34): Starlette's 400, and no model here."""
    boundary = b"b" * 257
    content_type = f"multipart/form-data; boundary={boundary.decode()}"
    body = form([field(b"model", b"m")], boundary)
    try:
        expected = asyncio.run(starlette_model(content_type, [body]))
    except _Refused:
        expected = None
    assert form_model(body, content_type) == expected


def test_the_form_settles_at_its_end_without_the_field() -> None:
    body = form([field(b"language", b"en")])
    assert fed(CT, [body, b"epilogue"]) == (None, 0)


_names = st.sampled_from([b"model", b"model", b"language", b"file", b"Model", b"prompt", b"mo del"])
_values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"", b"--xYz", b"\r\n--xY", b"m" * (MAX_MODEL_BYTES + 1)]),
)
_part = st.tuples(_names, _values, st.booleans(), st.sampled_from([b'"', b""]))
_charset = st.sampled_from(["", "; charset=utf-8", "; charset=latin-1", "; charset=bogus"])


def _encode(parts: list[tuple[bytes, bytes, bool, bytes]]) -> bytes:
    encoded = []
    for name, value, is_file, quote in parts:
        quote = quote if b" " not in name else b'"'
        disposition = b"Content-Disposition: form-data; name=" + quote + name + quote
        if is_file:
            disposition += b'; filename="a.wav"\r\nContent-Type: audio/wav'
        encoded.append(disposition + b"\r\n\r\n" + value)
    return form(encoded)


def _chunks(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a] or [b""]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_part, max_size=5), charset=_charset, cuts=st.lists(st.integers(0, 400), max_size=6))
def test_the_picker_reads_the_model_starlette_reads(parts, charset, cuts) -> None:
    content_type = CT + charset
    chunks = _chunks(_encode(parts), cuts)
    try:
        expected = asyncio.run(starlette_model(content_type, chunks))
    except _Refused:
        return  # the engine answers its 400; whatever the picker routed on, it goes nowhere else
    if expected is not None and (expected == "" or len(expected.encode(_codec(charset))) > MAX_MODEL_BYTES):
        expected = None  # beyond the picker's bound, or empty: no model
    assert fed(content_type, chunks)[0] == expected


def _codec(charset: str) -> str:
    return {"; charset=latin-1": "latin-1", "; charset=bogus": "latin-1"}.get(charset, "utf-8")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(_part, min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=3)), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=4),
)
def test_a_damaged_form_never_names_a_model_starlette_would_not(parts, edits, cuts) -> None:
    body = bytearray(_encode(parts))
    for at, replacement in edits:
        at = min(at, len(body))
        body[at : at + len(replacement)] = replacement
    chunks = _chunks(bytes(body), cuts)
    model = fed(CT, chunks)[0]
    if model is None:
        return
    try:
        expected = asyncio.run(starlette_model(CT, chunks))
    except _Refused:
        return  # the engine refuses the whole form (a 400): routing on its first field steers nothing
    assert model == expected


def test_a_part_without_a_disposition_names_no_model() -> None:
    """Starlette refuses a part without a name (here, without any Content-Disposition)."""
    no_disposition = b"Content-Type: text/plain\r\n\r\nm"
    for parts in (
        [no_disposition, field(b"model", b"m")],
        [field(b"language", b"en"), no_disposition, field(b"model", b"m")],  # not the part before's
    ):
        body = form(parts)
        assert form_model(body, CT) is None
        with pytest.raises(_Refused):
            asyncio.run(starlette_model(CT, [body]))


@pytest.mark.parametrize(
    "extra",
    [
        b"\r\nX-Pad: " + b"p" * 4000,  # a long header line, within the parser's bound
        b"".join(b"\r\nX-%d: v" % i for i in range(7)),  # eight header lines
        b"\r\nX-Pad: " + b"p" * 5000,  # a header line over the parser's bound: refused
        b"".join(b"\r\nX-%d: v" % i for i in range(8)),  # nine header lines: refused
    ],
)
def test_a_parts_headers_are_read_within_the_parsers_bounds_as_starlette_reads_them(extra) -> None:
    body = form([field(b"language", b"en", extra), field(b"model", b"m", extra)])
    try:
        expected = asyncio.run(starlette_model(CT, [body]))
    except _Refused:
        expected = None
    assert form_model(body, CT) == expected
    assert expected == ("m" if len(extra) < 4100 and extra.count(b"\r\n") < 8 else None)


def test_what_a_form_model_says_before_and_after() -> None:
    with pytest.raises(ValueError, match=r"^not a multipart form: 'application/json'$"):
        FormModel("application/json")
    form_ = FormModel(CT)
    assert form_.settled is False and form_.model is None
    assert form_.feed(b"--xYz\r\n") is False
    assert form_.end() is None and form_.settled is True
