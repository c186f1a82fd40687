"""The demo end to end (mock workers, the picker and Envoy as child processes, like `make demo`)."""

import argparse

from extproc.devstack.demo import run_modes


def test_the_demo_hit_rate_with_event_fed_routing_beats_round_robin(tmp_path):
    # 4 concurrent sessions over 3 workers: round robin cannot line sessions up with workers by chance
    args = argparse.Namespace(
        workers=3, sessions=8, turns=3, turn_tokens=300, system_prompts=3, system_prompt_tokens=1500,
        concurrency=4, max_tokens=4, speedup=20.0, seed=1, picker_log_level="info",
    )  # fmt: skip
    summaries = run_modes(["kv", "round-robin"], args, tmp_path)
    kv, rr = summaries["kv"]["total"], summaries["round-robin"]["total"]
    assert kv["errors"] == 0 and rr["errors"] == 0
    assert kv["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.05, summaries
    picker_log = (tmp_path / "kv" / "picker.log").read_text()
    assert "subscribed to ZMQ KV events of 3 worker endpoints" in picker_log
    for w in ("w0", "w1", "w2"):
        assert f"worker {w}: cache state predicted -> event-fed" in picker_log
