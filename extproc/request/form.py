"""The `model` field of a multipart/form-data body, read as vLLM and SGLang read it.

Both engines take an audio upload (`POST /v1/audio/transcriptions`, and vLLM's
`/v1/audio/translations`) as a multipart form (RFC 7578) through FastAPI's `Form()`: Starlette
parses it with python-multipart, and the form's `model` field names the model, next to a file of up
to 25 MB (vLLM's `VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`). A picker serving several models needs that one
field to know where such a request belongs; it needs nothing of the file.

The form is read with the engines' own parser, python-multipart, and the field's name and value
are decoded as Starlette decodes them (the content type's `charset`, UTF-8 by default; bytes that
do not decode are taken as Latin-1), so the name routed on is the name the engine reads.

Decisions:
- The first `model` field that is not a file decides, and reading stops there. The OpenAI clients
  (httpx's encoder) send every field before the files, so an upload's model is known from its first
  few hundred bytes, and the servicer routes it then and lets the file stream on (`FormModel`);
  `curl -F` keeps the order it is given. FastAPI reads the last of a repeated field: a form naming
  two models goes to the first one's workers, which serve it or answer 404.
- A form the parser refuses (its bounds included: at most 8 header lines a part, of at most 4,224
  bytes each, in python-multipart 0.0.34), a value over `MAX_MODEL_BYTES` and a form without the
  field give no model: the request is routed as one that
  names none, and the engine answers it as it would (a 400 for a bad form, its default model when
  the field is absent: both engines allow that).
- Only `multipart/form-data` with a boundary is a form here. A urlencoded body cannot carry the file
  these endpoints require.
"""

from __future__ import annotations

import codecs
import logging
from typing import TYPE_CHECKING

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

__all__ = ["MAX_MODEL_BYTES", "FormModel", "form_model", "is_form"]

FIELD = "model"
MAX_MODEL_BYTES = 1024  # a model name (Hugging Face ids are at most 96 characters)
# python-multipart logs each malformed form it meets as a warning: a client's mistake, answered by the
# engine, not the picker's. Its parsers log here, to nothing.
_PARSER_LOG = logging.Logger("extproc.request.form.parser", logging.CRITICAL + 1)


def _form_params(content_type: str) -> tuple[bytes, str] | None:
    """A form's boundary and charset, or None when `content_type` is not a multipart form."""
    if not content_type:
        return None
    media, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if media != b"multipart/form-data" or not boundary:
        return None
    charset = params.get(b"charset", b"utf-8").decode("latin-1")
    try:
        charset = codecs.lookup(charset).name
    except LookupError:  # Starlette's fallback
        charset = "latin-1"
    return boundary, charset


def is_form(content_type: str) -> bool:
    """Whether a body of `content_type` is a multipart form (with its boundary)."""
    return _form_params(content_type) is not None


def _decode(raw: bytes, charset: str) -> str:
    try:
        return raw.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return raw.decode("latin-1")


class FormModel:
    """Reads a form's `model` field from its body as the body arrives.

    `feed` each chunk in order; it returns True once the answer is known (`settled`): the field was
    read (`model`), the form ended or failed without it (`model` None). Chunks fed after that are
    not read. Memory is bounded: one header line (the parser's bound) and the field's value, never
    the file.
    """

    def __init__(self, content_type: str) -> None:
        params = _form_params(content_type)
        if params is None:
            raise ValueError(f"not a multipart form: {content_type!r}")
        boundary, self._charset = params
        self.model: str | None = None
        self.settled = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._value: bytearray | None = None  # the field's bytes while its part is read
        callbacks: MultipartCallbacks = {
            "on_part_begin": self._on_part_begin,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_end": self._on_end,
        }
        try:
            self._parser = MultipartParser(boundary, callbacks)
            self._parser.logger = _PARSER_LOG
        except FormParserError:  # a boundary longer than the parser takes: the engine refuses the form
            self.settled = True

    def feed(self, data: bytes) -> bool:
        """Read the next chunk of the body; True once the model is known (or known to be absent)."""
        if not self.settled:
            try:
                self._parser.write(data)
            except (_Settled, FormParserError):  # read, or no model to read: the rest is not parsed
                self.settled = True
        return self.settled

    def end(self) -> str | None:
        """The body ended: the model, or None when the form named none."""
        self.settled = True
        return self.model

    def _on_part_begin(self) -> None:
        self._disposition = b""

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]  # bounded by the parser (a header line's length)

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":  # the last one counts, as Starlette's
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition.decode("latin-1"))
        name = options.get(b"name")
        if name is None:  # Starlette refuses the form
            raise _Settled
        is_field = b"filename" not in options and _decode(name, self._charset) == FIELD
        self._value = bytearray() if is_field else None

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._value is not None:
            if len(self._value) + end - start > MAX_MODEL_BYTES:
                raise _Settled
            self._value += data[start:end]

    def _on_part_end(self) -> None:
        if self._value is not None:
            self.model = _decode(bytes(self._value), self._charset) or None  # "" names no model
            raise _Settled

    def _on_end(self) -> None:
        raise _Settled  # the form's last part ended without the field


class _Settled(Exception):
    """Stops the parser: the field was read, or the form cannot name a model (a bound passed, or
    Starlette would refuse it)."""


def form_model(body: bytes, content_type: str) -> str | None:
    """The `model` field of a whole multipart form body (None: not a form, or none readable)."""
    if not is_form(content_type):
        return None
    form = FormModel(content_type)
    form.feed(body)
    return form.end()
