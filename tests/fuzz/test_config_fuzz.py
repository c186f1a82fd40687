"""Fuzz the picker's config loader with YAML documents (`--config`, `DYN_CONFIG`).

Promise (extproc/config/): `load_config` returns a `PickerConfig` or raises `ConfigError` naming
the problem, whatever the file holds. Documents use the real section and option names (taken from
the loader's own table, `FILE_SECTIONS`) with values valid or hostile; some are mutated or not YAML at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
from collections.abc import Iterator
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from extproc.config import FILE_SECTIONS, ConfigError, PickerConfig, add_serve_arguments, load_config
from tests.fuzz.gen import chance, floating, integer, json_value, mutate, pick, text
from tests.fuzz.harness import (
    DECODED,
    REJECTED,
    SHRINKING_SHARE,
    Check,
    Outcome,
    Target,
    fuzz_settings,
    session_fixture,
)


def _options(options: Any) -> tuple[tuple[str, Any], ...]:
    """(file key, default) of each option: the default is a value the loader must accept."""
    return tuple((f.lstrip("-"), opt.default) for opt in options for f in opt.flags)


SECTIONS = {section: _options(options) for section, options in FILE_SECTIONS.items()}
WORKER_KEYS = ("id", "endpoint", "model", "dp_ranks", "dp_size", "total_blocks", "max_num_batched_tokens",
               "kv_events", "kv-replay", "instance_id", "role", "device")  # fmt: skip
WORDS = ("true", "false", "on", "kv", "none", "timing", "fcfs", "cuda", "cpu", "prefill", "decode", "both",
         "127.0.0.1:8000", "tcp://127.0.0.1:5557", "m", "1e3", "-1", "0x10", ".inf", "nan")  # fmt: skip


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's, when PyYAML has it: 10x faster


def _dump(doc: Any, allow_unicode: bool = False) -> str:
    try:
        return yaml.dump(doc, Dumper=_DUMPER, allow_unicode=allow_unicode)
    except UnicodeEncodeError:  # a lone surrogate: libyaml cannot write it, PyYAML's own emitter escapes it
        return yaml.safe_dump(doc, allow_unicode=allow_unicode)


def _value(r: random.Random) -> Any:
    roll = r.random()
    if roll < 0.3:
        return pick(r, WORDS)
    if roll < 0.5:
        return r.randint(0, 100)
    if roll < 0.6:
        return r.random()
    if roll < 0.7:
        return chance(r, 0.5)
    if roll < 0.8:
        return pick(r, (integer, floating))(r)
    return _short(json_value(r, WORDS, depth=2))


def _short(value: Any) -> Any:
    """`value` with long strings cut: PyYAML's pure-Python reader takes milliseconds per 10 kB."""
    if isinstance(value, str):
        return value[:300]
    if isinstance(value, list):
        return [_short(v) for v in value]
    if isinstance(value, dict):
        return {_short(k): _short(v) for k, v in value.items()}
    return value


class _Document:
    """One config document: each value valid-looking or, at odds `hostility`, anything."""

    def __init__(self, r: random.Random, hostility: float) -> None:
        self.r = r
        self.hostility = hostility

    def value(self, good: Any) -> Any:
        return _value(self.r) if chance(self.r, self.hostility) else good

    def worker(self, i: int) -> Any:
        r = self.r
        worker: dict[str, Any] = {
            "id": self.value(f"w{i}"),
            "endpoint": self.value(f"127.0.0.{i + 1}:8000"),
            "model": self.value("m"),
        }
        if chance(r, 0.2):
            worker[pick(r, ("dp_size", "dp-size", "dp_ranks"))] = self.value(pick(r, (2, [0, 1], 1)))
        for key in WORKER_KEYS[3:]:
            if chance(r, self.hostility):
                worker[key] = _value(r)
        return self.value(worker)

    def group(self, i: int) -> Any:
        r = self.r
        group: dict[str, Any] = {"name": self.value(f"g{i}")}
        if chance(r, 0.5):
            group["local"] = self.value(True)
        else:
            group["address"] = self.value("127.0.0.1:9100")
        if chance(r, 0.3):
            group["weight"] = self.value(r.uniform(0.1, 3))
        return group

    def document(self) -> dict[str, Any]:
        r, doc = self.r, {}
        for section, options in SECTIONS.items():
            if options and chance(r, 0.5):
                chosen = [pick(r, options) for _ in range(r.randint(0, 3))]
                doc[section] = self.value(
                    {k.replace("-", pick(r, ("-", "_"))): self.value(d) for k, d in chosen}
                )
        if chance(r, 0.8):
            doc["workers"] = self.value([self.worker(i) for i in range(r.randint(0, 3))])
        if chance(r, 0.2):
            doc["models"] = [self.value({"name": "m", "tokenizer": None})]
        if chance(r, 0.15):
            doc["groups"] = self.value([self.group(i) for i in range(r.randint(0, 2))])
        if chance(r, self.hostility):
            doc[text(r)] = _value(r)
        return doc


def document(r: random.Random) -> dict[str, Any]:
    return _Document(r, pick(r, (0.0, 0.02, 0.1, 0.3))).document()


RAW = ("a: [", "\t- x", "&a [*a]", "!!python/object:os.system x", "? [a]\n: b", "workers: *x",
       "%YAML 9.9\n---", "- 1\n- 2", "'", "a: b: c", "x: &a {y: *a}", "---\n...\n---", "\x00", "\ufeff",
       "a: !!binary zz")  # fmt: skip


def generate(r: random.Random) -> str:
    roll = r.random()
    if roll < 0.75:
        return _dump(document(r), allow_unicode=chance(r, 0.5))
    if roll < 0.9:
        data = mutate(
            r,
            _dump(document(r)).encode("utf-8", "surrogatepass"),
            (b":", b"-", b"[", b"{", b"&a", b"*a", b"!", b"\t", b"\n"),
        )
        return data.decode("utf-8", "replace")
    return "".join(pick(r, RAW) for _ in range(r.randint(1, 3)))


@contextlib.contextmanager
def session() -> Iterator[Check]:
    memory = "/dev/shm" if os.path.isdir("/dev/shm") else None  # a file per input: keep it off the disk
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="extproc-fuzz-", dir=memory)
    os.close(fd)
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--config", path])

    def check(text: str) -> Outcome:
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        try:
            config = load_config(args=args, environ={})
        except ConfigError as exc:
            assert str(exc)
            return REJECTED
        assert isinstance(config, PickerConfig)
        ids = [w.id for w in config.workers]
        assert len(set(ids)) == len(ids)
        return DECODED

    try:
        yield check
    finally:
        os.unlink(path)


TARGET = Target("config_yaml", generate, session, lambda text: repr(text)[:2000])
check_target = session_fixture(TARGET)


@fuzz_settings(0.5)
@given(seed=st.integers(min_value=0))
def test_config_loads_or_raises_config_error(check_target: Check, seed: int) -> None:
    check_target(TARGET.generate(random.Random(seed)))


@fuzz_settings(SHRINKING_SHARE / 2)
@given(st.randoms(use_true_random=False))
def test_config_loads_or_raises_config_error_shrinking(check_target: Check, r: random.Random) -> None:
    check_target(TARGET.generate(r))


def test_generated_documents_reach_both_outcomes(check_target: Check) -> None:
    outcomes = [next(iter(check_target(generate(random.Random(i))))) for i in range(100)]
    assert 0.1 < outcomes.count("decoded") / len(outcomes) < 0.9
