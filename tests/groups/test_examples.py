"""examples/custom_routing.py runs and makes the choice it explains (the hierarchical example's stack is
the end-to-end tests')."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_custom_routing_picks_least_prefill_where_the_cost_would_not(capsys):
    spec = importlib.util.spec_from_file_location("custom_routing", EXAMPLES / "custom_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0
    out = capsys.readouterr().out
    assert "least prefill work picks w0" in out and "tracked on w0 with 250/262 blocks cached" in out
