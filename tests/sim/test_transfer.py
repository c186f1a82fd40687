"""One KV-transfer model for the whole simulator: the mock worker's decode side and the disaggregated
replay both time a transfer with `KvTransferModel.duration_ms` and take the same flags.

Each path is given a spy model whose durations no `base + per_block * blocks` formula gives, so a
path that computed the time itself (or kept a model of its own) fails here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

import pytest

from extproc.sim.disagg import DisaggWorkerConfig
from extproc.sim.mock_worker import add_mock_worker_arguments, config_from_args
from extproc.sim.replay_cli import add_replay_arguments, disagg_setup
from extproc.sim.replay_disagg import DisaggSetup
from extproc.sim.transfer import (
    DEFAULT_KV_TRANSFER_BASE_MS,
    DEFAULT_KV_TRANSFER_MS_PER_BLOCK,
    KvTransferModel,
)

from .test_disagg_worker import BS, HEADER, PROMPT, endpoint, metric, serving, worker_config
from .test_replay_disagg import disagg, long_prompt


@dataclass(frozen=True)
class SpyTransfer(KvTransferModel):
    """Records every transfer it times; its durations are quadratic in the blocks."""

    calls: list[int] = field(default_factory=list, compare=False)

    def duration_ms(self, blocks: int) -> float:
        self.calls.append(blocks)
        return 250.0 + 3.0 * blocks * blocks


def test_the_model_is_a_fixed_cost_plus_a_cost_per_block_and_refuses_negative_times():
    assert KvTransferModel() == KvTransferModel(2.0, 0.2)
    assert (DEFAULT_KV_TRANSFER_BASE_MS, DEFAULT_KV_TRANSFER_MS_PER_BLOCK) == (2.0, 0.2)
    assert KvTransferModel().duration_ms(0) == 2.0
    assert KvTransferModel(5.0, 1.5).duration_ms(4) == pytest.approx(11.0)
    for bad in ({"base_ms": -1.0}, {"ms_per_block": -0.1}, {"ms_per_block": float("nan")}):
        with pytest.raises(ValueError, match="KV transfer"):
            KvTransferModel(**bad)
    with pytest.raises(ValueError, match="at least 0 blocks"):
        KvTransferModel().duration_ms(-1)


def test_the_mock_worker_and_the_replay_default_to_the_same_model():
    assert DisaggWorkerConfig().kv_transfer == KvTransferModel()
    assert DisaggSetup(1).kv_transfer == KvTransferModel()


@pytest.mark.parametrize(
    "argv",
    [[], ["--kv-transfer-base-ms", "7", "--kv-transfer-ms-per-block", "0.75"]],
    ids=["defaults", "flags"],
)
def test_both_command_lines_take_the_same_flags_into_the_same_model(argv):
    expected = KvTransferModel(7.0, 0.75) if argv else KvTransferModel()
    worker = argparse.ArgumentParser()
    add_mock_worker_arguments(worker)
    assert config_from_args(worker.parse_args(argv)).disagg.kv_transfer == expected
    replay = argparse.ArgumentParser()
    add_replay_arguments(replay)
    setup = disagg_setup(replay.parse_args(["trace.jsonl", "--disagg", "1:2", *argv]), {})
    assert setup is not None and setup.kv_transfer == expected
    negative = ["--kv-transfer-base-ms=-1"]
    with pytest.raises(ValueError, match="--kv-transfer-base-ms"):
        config_from_args(worker.parse_args(negative))
    with pytest.raises(ValueError, match="--kv-transfer-base-ms"):
        disagg_setup(replay.parse_args(["trace.jsonl", "--disagg", "1:2", *negative]), {})


def test_the_replay_times_its_transfers_with_the_model(tmp_path):
    # one 100-token prompt sent to the prefill worker: its 6 full blocks up to the cached-prefix cap move
    spy = SpyTransfer()
    run = disagg(tmp_path, [(0, 100, 5, long_prompt(0, 7))], kv_transfer=spy)
    (record,) = run.run().records
    assert record.remote_prefill
    assert spy.calls == [6]
    assert record.transfer_ms == 250.0 + 3.0 * 36


async def test_the_mock_worker_times_its_transfers_with_the_model():
    spy = SpyTransfer()
    decode_config = worker_config("d", "decode", speedup=100.0)
    decode_config = replace(decode_config, disagg=replace(decode_config.disagg, kv_transfer=spy))
    async with serving(worker_config("p", "prefill"), decode_config) as (prefill, decode):
        body = {"prompt": PROMPT, "max_tokens": 2}
        resp = await decode.post("/v1/completions", json=body, headers={HEADER: endpoint(prefill)})
        assert resp.status == 200 and resp.headers["x-prefill-source"] == "remote"
        received = (len(PROMPT) - 1) // BS
        assert spy.calls == [received]
        assert await metric(decode, "extproc_mock_kv_transfer_blocks_total") == received
        # the worker waited the model's time on its simulated clock
        transfer_s = await metric(decode, "extproc_mock_kv_transfer_simulated_seconds_sum")
        assert transfer_s >= (250.0 + 3.0 * received * received) / 1000.0 * (1 - 1e-6)
