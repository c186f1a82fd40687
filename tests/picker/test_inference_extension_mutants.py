"""What `ResourceFile` says and when it reads, found by mutation testing (`benchmarks/mutation.py
picker/inference_extension.py`): the log lines an operator reads at start and on each change, the
once-a-second look from any clock, a second change after a threaded read, the rule of a generic
rewrite in the metrics, and wspt's new tokens in the queue entry."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from extproc.config.inference_extension import (
    InferenceExtensionConfig,
    Pool,
    RewriteRule,
    Target,
    read_resources,
)
from extproc.picker.inference_extension import (
    ANY_MODEL,
    MAX_FAIRNESS_ID,
    InferenceExtension,
    ResourceFile,
    pick_target,
    queue_entry,
)
from extproc.picker.metrics import PickMetrics

from ..config.test_inference_extension import objective, rewrite
from ..replica_helpers import until
from ..router.clock import FakeClock

LOGGER = "extproc.inference_extension"


def write(path: Path, text: str) -> InferenceExtensionConfig:
    path.write_text(text)
    return InferenceExtensionConfig(str(path), Pool("p"), read_resources(str(path), Pool("p")))


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_the_start_and_each_new_reading_say_what_is_in_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.yaml"
    text = "---\n".join(
        [
            *(objective(f"o{i:02}", i) for i in range(22)),
            objective("elsewhere", 1, pool="q"),
            rewrite("canary", "  - targets:\n    - modelRewrite: a\n", pool="p"),
        ]
    )
    text = text.replace("name: vllm-qwen3-32b", "name: p")
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock(100.0)
    file = ResourceFile.from_config(write(path, text), clock)
    assert file is not None
    shown = ", ".join(f"o{i:02}={i}" for i in range(20))
    assert lines(caplog) == [
        f"{path}, document 23: 'elsewhere' is for pool 'q' (group inference.networking.k8s.io): left out",
        f"inference resources read from {path}: 22 objectives ({shown}, and 2 more), "
        "1 model rewrites (canary)",
    ]
    caplog.clear()
    path.write_text(objective("solo", 3).replace("name: vllm-qwen3-32b", "name: p"))
    clock.advance(1.0)
    assert file.priority("solo") == 3  # from_config kept the pool: the new file is read for it
    assert lines(caplog) == [
        f"inference resources read again from {path}: 1 objectives (solo=3), 0 model rewrites (none)"
    ]
    caplog.clear()
    path.write_text("kind: [")
    clock.advance(1.0)
    assert file.priority("solo") == 3
    (warning,) = lines(caplog)
    assert warning.startswith(f"{path}: not YAML") and warning.endswith(
        "; the 1 objectives and 0 rewrite rules read before stay in use"
    )


def test_an_unchanged_file_is_not_read_again_whatever_the_clock(tmp_path: Path) -> None:
    config = write(tmp_path / "r.yaml", objective("a", 1).replace("name: vllm-qwen3-32b", "name: p"))
    clock = FakeClock(5_000.0)
    file = ResourceFile(config.path or "", config.pool, config.initial, clock=clock)
    for _ in range(3):
        clock.advance(0.4)
        file.priority("a")
    assert file.readings == 1
    Path(config.path or "").write_text(objective("a", 2).replace("name: vllm-qwen3-32b", "name: p"))
    clock.advance(0.1)  # 1.3 s after the start: looked at once, at 1.2 s (before the change)
    assert file.priority("a") == 1 and file.readings == 1
    clock.advance(1.0)
    assert file.priority("a") == 2 and file.readings == 2


async def test_after_a_threaded_read_the_next_change_is_read_too(tmp_path: Path) -> None:
    config = write(tmp_path / "r.yaml", objective("a", 1).replace("name: vllm-qwen3-32b", "name: p"))
    clock = FakeClock(0.0)
    file = ResourceFile(config.path or "", config.pool, config.initial, clock=clock)
    for priority, reading in ((2, 2), (3, 3)):
        Path(config.path or "").write_text(
            objective("a", priority).replace("name: vllm-qwen3-32b", "name: p")
        )
        clock.advance(1.0)
        file.priority("a")
        await until(lambda reading=reading: file.readings == reading, 5.0, f"reading {reading}")
        assert file.priority("a") == priority


def test_a_rule_for_every_model_counts_under_any_model_never_the_clients_name(tmp_path: Path) -> None:
    config = write(tmp_path / "r.yaml", rewrite("all", "  - targets:\n    - modelRewrite: a\n", pool="p"))
    metrics = PickMetrics()
    extension = InferenceExtension.from_config(config, metrics, random.Random(0), FakeClock(0.0))
    assert extension.model_for("some client's own text") == "a"
    assert dict(metrics.model_rewrites.values) == {("all", ANY_MODEL, "a"): 1}


def test_weighted_draws_land_on_each_target_in_proportion() -> None:
    rule = RewriteRule("r", frozenset(), (Target("a", 1), Target("z", 0), Target("b", 3)))
    rng = random.Random(7)
    drawn = [pick_target(rule, rng) for _ in range(4000)]
    assert set(drawn) == {"a", "b"} and 850 <= drawn.count("a") <= 1150  # 1/4: 1,000 expected


def test_the_queue_entry_carries_the_new_tokens_wspt_orders_by() -> None:
    assert queue_entry("r", 0.0, 321, {}, None).new_tokens == 321


@pytest.mark.parametrize(
    ("objectives", "rewrites", "expected"),
    [
        (0, 2, "0 objectives (none), 2 model rewrites (r00, r01)"),
        (20, 0, "20 objectives ({first_20}), 0 model rewrites (none)"),
        (21, 0, "21 objectives ({first_20}, and 1 more), 0 model rewrites (none)"),
        (0, 21, "0 objectives (none), 21 model rewrites ({rewrites_20})"),
    ],
)
def test_the_log_line_shows_twenty_names_of_each_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, objectives: int, rewrites: int, expected: str
) -> None:
    docs = [objective(f"o{i:02}", i) for i in range(objectives)]
    docs += [rewrite(f"r{i:02}", "  - targets:\n    - modelRewrite: a\n") for i in range(rewrites)]
    config = write(tmp_path / "r.yaml", "---\n".join(docs).replace("name: vllm-qwen3-32b", "name: p"))
    caplog.set_level(logging.INFO, logger=LOGGER)
    ResourceFile.from_config(config, FakeClock(0.0))
    first_20 = ", ".join(f"o{i:02}={i}" for i in range(20))
    rewrites_20 = ", ".join(f"r{i:02}" for i in range(20))
    path = tmp_path / "r.yaml"
    assert lines(caplog) == [
        f"inference resources read from {path}: "
        + expected.format(first_20=first_20, rewrites_20=rewrites_20)
    ]


def test_the_fairness_id_is_the_entrys_flow_cut_to_its_bound_and_none_is_the_shared_flow() -> None:
    assert queue_entry("r", 0.0, 1, {}, None, "tenant-a").flow == "tenant-a"
    assert queue_entry("r", 0.0, 1, {}, None, "t" * 5000).flow == "t" * MAX_FAIRNESS_ID
    assert queue_entry("r", 0.0, 1, {}, None, None).flow == ""
    assert queue_entry("r", 0.0, 1, {}, None).flow == queue_entry("r", 0.0, 1, {}, None, "").flow == ""
