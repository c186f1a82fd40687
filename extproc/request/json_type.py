"""How a refusal names the JSON value it got where another kind was expected: "null", "a boolean",
"the number 3", "a string", "an array", "an object". Shared by every request parser's 400s."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float) or (isinstance(value, int) and abs(value) < 10**15):
        return f"the number {value!r}"
    if isinstance(value, int):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
