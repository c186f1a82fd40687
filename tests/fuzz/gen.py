"""Seeded generators of hostile input, shared by the CI fuzz tests and `benchmarks/fuzz.py`.

Every generator is a plain function of a `random.Random`: the benchmark seeds one per input (fast,
reproducible from the target name, seed and input index) and the tests pass hypothesis's
`st.randoms(use_true_random=False)`, so hypothesis drives, replays and shrinks the same choices.
Values lean towards the edges that break decoders: integer and float limits, empty and huge
containers, wrong types, lone surrogates, invalid UTF-8, deep nesting.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

INTERESTING_INTS: tuple[int, ...] = (
    0, 1, -1, 2, 3, 15, 16, 17, 64, 255, 256, 4096, 65535, 65536,
    2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32, 2**53, 2**53 + 1,
    2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), 10**20, -(10**20), 10**400,
)  # fmt: skip
INTERESTING_FLOATS: tuple[float, ...] = (
    0.0, -0.0, 0.5, 1.0, -1.0, 1.5, 1e-300, 5e-324, 1e308, -1e308,
    float("inf"), float("-inf"), float("nan"), 2.0**53, 2.0**64,
)  # fmt: skip
_CHARS = (
    "abcxyz019 _-.:/\\\"'{}[],\n\t\x00\x7f"
    "\u00e9\u00df\u4e2d\u0301\u200b\u2028\u202e\ufeff\uffff\U0001f600\U0010ffff"
)
SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
BYTE_TOKENS: tuple[bytes, ...] = (
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b":",
    b",",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"null",
    b"true",
    b"NaN",
    b"Infinity",
    b"-",
    b"0",
    b"1e999",
    b"9" * 30,
    b"\x00",
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b" ",
    b"\n",
    b"\xc0",
    b"\xc1",
    b"\xc2",
    b"\xc3",
    b"\xcc",
    b"\xcd",
    b"\xce",
    b"\xcf",
    b"\xd0",
    b"\xd3",
    b"\xd9",
    b"\xdc",
    b"\xdd",
    b"\xde",
    b"\xdf",
    b"\x90",
    b"\x9f",
    b"\xa0",
    b"\xbf",
    b"\xc4",
    b"\xd4",
    b"\xc7",
)  # fmt: skip  (JSON tokens, invalid UTF-8, msgpack type bytes: nil, bool, ints, str, bin, array, map, ext)


def chance(r: random.Random, p: float) -> bool:
    return r.random() < p


def pick(r: random.Random, options: Sequence[Any]) -> Any:
    return options[r.randrange(len(options))]


def one_of(r: random.Random, *makers: Callable[[random.Random], Any]) -> Any:
    return pick(r, makers)(r)


def integer(r: random.Random) -> int:
    """An integer: a limit, a small one, or a random one of up to 70 bits, either sign."""
    roll = r.random()
    if roll < 0.4:
        return pick(r, INTERESTING_INTS)
    if roll < 0.8:
        return r.randint(-3, 300)
    value = r.getrandbits(r.randint(1, 70))
    return -value if chance(r, 0.3) else value


def small_count(r: random.Random, high: int = 4) -> int:
    """A container length, mostly small, sometimes zero."""
    return r.randint(0, high)


def floating(r: random.Random) -> float:
    if chance(r, 0.6):
        return pick(r, INTERESTING_FLOATS)
    return r.uniform(-1e6, 1e6)


def text(r: random.Random, words: Sequence[str] = (), *, surrogates: bool = True) -> str:
    """A short string: one of `words` (the schema's vocabulary), or random characters."""
    roll = r.random()
    if words and roll < 0.4:
        return pick(r, words)
    if roll < 0.5:
        return ""
    if roll < 0.53:
        return "x" * r.choice((255, 4096, 70000))
    chars = [pick(r, _CHARS) for _ in range(r.randint(1, 8))]
    if surrogates and chance(r, 0.05):
        chars.insert(r.randint(0, len(chars)), pick(r, SURROGATES))
    return "".join(chars)


def scalar(r: random.Random, words: Sequence[str] = ()) -> Any:
    roll = r.random()
    if roll < 0.1:
        return None
    if roll < 0.2:
        return chance(r, 0.5)
    if roll < 0.5:
        return integer(r)
    if roll < 0.6:
        return floating(r)
    return text(r, words)


def json_value(r: random.Random, words: Sequence[str] = (), depth: int = 3) -> Any:
    """Any JSON-ish value: scalars, lists and objects keyed by `words` or random text."""
    roll = r.random()
    if depth <= 0 or roll < 0.55:
        return scalar(r, words)
    if roll < 0.75:
        return [json_value(r, words, depth - 1) for _ in range(small_count(r))]
    return {text(r, words): json_value(r, words, depth - 1) for _ in range(small_count(r))}


def deep(r: random.Random) -> Any:
    """A value nested past any sane depth (lists or objects)."""
    value: Any = scalar(r)
    as_list = chance(r, 0.5)
    for _ in range(r.choice((50, 900, 3000))):
        value = [value] if as_list else {"a": value}
    return value


def msgpack_value(r: random.Random, words: Sequence[str] = (), depth: int = 3) -> Any:
    """Any msgpack-ish value: JSON-ish plus bytes and maps keyed by non-strings."""
    roll = r.random()
    if roll < 0.1:
        return r.randbytes(r.choice((0, 1, 8, 32)))
    if depth > 0 and roll < 0.15:
        return {scalar(r): msgpack_value(r, words, depth - 1) for _ in range(small_count(r, 3))}
    if depth > 0 and roll < 0.3:
        return [msgpack_value(r, words, depth - 1) for _ in range(small_count(r))]
    return json_value(r, words, depth)


def fit_msgpack(value: Any) -> Any:
    """`value` with its integers clamped into msgpack's range [-2**63, 2**64)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return min(max(value, -(2**63)), 2**64 - 1)
    if isinstance(value, list | tuple):
        return [fit_msgpack(v) for v in value]
    if isinstance(value, dict):
        return {fit_msgpack(k): fit_msgpack(v) for k, v in value.items()}
    return value


def pack(value: Any) -> bytes:
    """msgpack bytes of `value`; lone surrogates go out as the invalid UTF-8 they encode to."""
    import msgpack

    try:
        return msgpack.packb(fit_msgpack(value), use_bin_type=True, unicode_errors="surrogatepass")
    except ValueError:  # nested past msgpack's packing limit: the same depth, written by hand
        return deep_msgpack(1000)


def deep_msgpack(depth: int) -> bytes:
    """`depth` nested one-element arrays around nil, as msgpack bytes."""
    return b"\x91" * depth + b"\xc0"


def json_bytes(r: random.Random, value: Any) -> bytes:
    """`value` as JSON bytes, sometimes ASCII-escaped, with NaN/Infinity tokens and surrogates as sent."""
    try:
        raw = json.dumps(value, ensure_ascii=chance(r, 0.5))
    except RecursionError:  # nested deeper than json.dumps goes: write the nesting by hand
        raw = "[" * 3000 + "]" * 3000
    return raw.encode("utf-8", "surrogatepass")


def mutate(r: random.Random, data: bytes, tokens: Sequence[bytes] = BYTE_TOKENS) -> bytes:
    """`data` after 1-4 random byte-level edits (flip, insert, delete, duplicate, truncate, splice)."""
    out = bytearray(data)
    for _ in range(r.randint(1, 4)):
        op = r.randrange(7)
        at = r.randint(0, len(out))
        if op == 0 and out:
            at = min(at, len(out) - 1)
            out[at] ^= 1 << r.randrange(8)
        elif op == 1:
            out[at:at] = pick(r, tokens)
        elif op == 2:
            del out[at : at + r.randint(1, 16)]
        elif op == 3:
            end = min(len(out), at + r.randint(1, 32))
            out[at:at] = out[at:end] * r.randint(1, 3)
        elif op == 4:
            del out[at:]
        elif op == 5:
            out[at:at] = r.randbytes(r.randint(1, 8))
        elif out:
            at = min(at, len(out) - 1)
            out[at] = pick(r, (0, 0x7F, 0x80, 0xC0, 0xFF))
    return bytes(out)
