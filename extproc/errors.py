"""Errors the picker raises at its edges, named by situation. Only `epp.py` maps them to HTTP.

    PickerError
    ├── RequestInvalid          the body cannot be routed: not JSON, wrong types, no model (400)
    ├── BodyTooLarge            the body is over the configured limit (413)
    ├── PromptTooLong           the tokenized prompt is over --max-prompt-tokens (413)
    ├── UnknownModel            no worker serves the requested model (404, as OpenAI answers)
    ├── TokenizerUnavailable    the tokenizer backend failed; callers fall back to load-only routing
    ├── NoEligibleWorker        no worker may take the request (subset hint, all down) (503)
    ├── TooManyStreams          --max-concurrent-streams ext_proc streams are already open (429)
    └── ShuttingDown            the picker is stopping: a body still waiting for its parser (503)

Router-core errors (all workers busy, queue full, ...) live in `extproc/router/errors.py`.
"""

from __future__ import annotations


class PickerError(Exception):
    """Base class of the picker's own errors; `message` is safe to show to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestInvalid(PickerError):
    """The request body cannot be parsed or lacks a field routing needs."""


class BodyTooLarge(PickerError):
    """The request body is larger than the configured limit."""

    def __init__(self, size_bytes: int, limit_bytes: int, hint: str = "") -> None:
        """`hint`: what was awaited when the limit was passed, and what to do (ends the message)."""
        message = f"request body of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes"
        super().__init__(f"{message} {hint}" if hint else message)
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class PromptTooLong(PickerError):
    """The tokenized prompt has more tokens than the configured limit."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"prompt of {tokens} tokens exceeds the limit of {limit} tokens")
        self.tokens = tokens
        self.limit = limit


class UnknownModel(PickerError):
    """No configured worker serves the requested model."""

    SHOWN = 20  # known names in the message; the rest are counted (discovered LoRA adapters can be many)

    def __init__(self, model: str, known: list[str]) -> None:
        names = sorted(known)
        shown = ", ".join(names[: self.SHOWN]) or "none"
        more = f" and {len(names) - self.SHOWN} more" if len(names) > self.SHOWN else ""
        super().__init__(f"model {model!r} is not served here; known models: {shown}{more}")
        self.model = model
        self.known = known


class TokenizerUnavailable(PickerError):
    """The tokenizer backend could not tokenize the request (timeout, engine down, bad template)."""


class NoEligibleWorker(PickerError):
    """No worker may take the request (empty subset hint, conformance filter, none configured)."""


class TooManyStreams(PickerError):
    """The picker already serves its limit of concurrent ext_proc streams (one per HTTP request)."""

    def __init__(self, open_streams: int, limit: int) -> None:
        super().__init__(f"the endpoint picker is at its limit of {limit} concurrent requests; retry later")
        self.open_streams = open_streams
        self.limit = limit


class ShuttingDown(PickerError):
    """The picker is stopping: what a request still needed (a body parse worker) is closed."""
