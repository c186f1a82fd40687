"""`--tokenizer-cache-bytes` reaches each model's local tokenizer; 0 turns piecewise encoding off."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extproc.config import ConfigError, load_config
from extproc.picker.pipeline import EndpointPicker
from extproc.request.token_cache import DEFAULT_PIECE_CACHE_BYTES
from extproc.request.tokenizer import HfTokenizer
from tests.tokenizer_files import write_tokenizer_dir


def _picker(tmp_path: Path, *flags: str) -> EndpointPicker:
    tok_dir = write_tokenizer_dir(tmp_path / "tok")
    config_file = tmp_path / "picker.yaml"
    config_file.write_text(
        'workers:\n  - {id: w0, endpoint: "127.0.0.1:8000", model: m}\n'
        f"models:\n  - {{name: m, tokenizer: {tok_dir}}}\n",
        encoding="utf-8",
    )
    return EndpointPicker(
        load_config(["--config", str(config_file), "--no-router-kv-events", *flags], environ={})
    )


@pytest.mark.parametrize(
    "flags, capacity", [((), DEFAULT_PIECE_CACHE_BYTES), (("--tokenizer-cache-bytes", "4096"), 4096)]
)
def test_the_bound_reaches_the_models_tokenizer(tmp_path: Path, flags: tuple[str, ...], capacity: int):
    picker = _picker(tmp_path, *flags)
    try:
        stats = picker.pools["m"].tokenizer.piece_cache_stats()
        assert stats is not None and stats.capacity_bytes == capacity
    finally:
        asyncio.run(picker.close())


def test_zero_encodes_whole_prompts(tmp_path: Path):
    picker = _picker(tmp_path, "--tokenizer-cache-bytes", "0")
    try:
        tokenizer = picker.pools["m"].tokenizer
        assert tokenizer.piece_cache_stats() is None
        assert isinstance(tokenizer.backend, HfTokenizer) and tokenizer.backend.pieces is None
    finally:
        asyncio.run(picker.close())


def test_a_negative_bound_is_refused_at_start():
    with pytest.raises(ConfigError, match="tokenizer-cache-bytes"):
        load_config(["--tokenizer-cache-bytes", "-1"], environ={})
