"""LocalGroup over a real picker's pools: probes change nothing, commits pin or re-decide."""

from __future__ import annotations

import pytest

from extproc.config import WorkerConfig
from extproc.errors import NoEligibleWorker, UnknownModel
from extproc.groups import GroupRequest
from extproc.picker.local_group import LocalGroup
from extproc.picker.pipeline import DP_RANK_HEADER, EndpointPicker
from extproc.router import AllWorkersBusy, NoWorkers, Worker
from tests.groups.builders import MODEL, group_config, loads, local_group, prompt, request


def routers(n_workers: int = 2, **kwargs) -> LocalGroup:
    return local_group("w", n_workers, **kwargs)


def test_a_probe_changes_no_state():
    group = routers(3)
    warm = group.commit_now(request(prompt(1)), "warm", None)
    group.first_token(warm.request_id)
    before = (loads(group, prompt(1)), loads(group, prompt(2)))
    for _ in range(20):
        group.probe_now(request(prompt(1)))
        group.probe_now(request(prompt(2)))
    assert (loads(group, prompt(1)), loads(group, prompt(2))) == before
    assert len(group.pools[MODEL].router.sequences) == 1


def test_a_probe_reports_choice_overlap_cost_and_the_group_load():
    group = routers(2)
    first = group.commit_now(request(prompt(1)), "r1", None)
    group.first_token("r1")
    probe = group.probe_now(request(prompt(1) + prompt(2)))
    assert probe.choice.worker == first.choice.worker  # it holds the first half of the prompt
    assert (probe.choice.overlap_blocks, probe.choice.request_blocks) == (10, 20)
    assert probe.choice.endpoint == group.pools[MODEL].endpoint_of(first.choice.worker)
    assert probe.choice.cost > 0 and probe.block_size == 16
    assert (probe.load.workers, probe.load.active_requests) == (2, 1)
    assert probe.load.active_decode_blocks == 10 and probe.load.active_prefill_tokens == 0


def test_commit_tracks_the_request_on_the_probed_worker():
    group = routers(4)
    probe = group.probe_now(request(prompt(1)))
    decision = group.commit_now(request(prompt(1)), "r1", probe.choice.worker)
    assert decision.choice.worker == probe.choice.worker and not decision.redecided
    router = group.pools[MODEL].router
    assert router.sequences.worker_of("r1") == probe.choice.worker
    assert group.finish("r1") and not group.finish("r1")
    assert router.is_idle()


def test_commit_redecides_when_the_probed_worker_left():
    picker = EndpointPicker(group_config("w", 2))
    group = picker.local
    probe = group.probe_now(request(prompt(1)))
    gone = str(probe.choice.worker.worker_id)
    picker.set_workers(MODEL, [w for w in picker.config.workers if w.id != gone])
    decision = group.commit_now(request(prompt(1)), "r1", probe.choice.worker)
    assert decision.redecided and str(decision.choice.worker.worker_id) != gone


def test_commit_redecides_when_the_probed_worker_is_busy():
    group = routers(
        2, active_prefill_tokens_threshold=100
    )  # busy with more than 100 prompt tokens to prefill
    probe = group.probe_now(request(prompt(1)))
    filler = group.commit_now(
        request(prompt(9)), "filler", probe.choice.worker
    )  # 160 tokens land there meanwhile
    assert filler.choice.worker == probe.choice.worker
    decision = group.commit_now(request(prompt(1)), "r1", probe.choice.worker)
    assert decision.redecided and decision.choice.worker != probe.choice.worker


def test_a_reused_request_id_is_extended():
    group = routers(2)
    first = group.commit_now(request(prompt(1)), "same", None)
    second = group.commit_now(request(prompt(2)), "same", None)
    assert first.request_id == "same" and second.request_id.startswith("same@")
    assert group.finish(second.request_id) and group.finish("same")


def test_endpoint_restrictions_limit_the_candidates():
    group = routers(3, subnet=5)
    only = request(prompt(1), restrictions=(("127.0.5.2:8000", "127.0.5.3"), ("127.0.5.3:8000",)))
    for _ in range(5):
        assert group.probe_now(only).choice.worker == Worker("w2")
    with pytest.raises(NoEligibleWorker, match="allowed endpoint subset"):
        group.probe_now(request(prompt(1), restrictions=((),)))


def test_unknown_model_no_workers_and_all_busy_are_named():
    group = routers(2, active_prefill_tokens_threshold=100)
    with pytest.raises(UnknownModel):
        group.probe_now(GroupRequest("other-model", prompt(1)))
    group.commit_now(request(prompt(1)), "a", None)
    group.commit_now(request(prompt(2)), "b", None)
    with pytest.raises(AllWorkersBusy):
        group.probe_now(request(prompt(3)))
    with pytest.raises(AllWorkersBusy):
        group.commit_now(request(prompt(3)), "c", None)
    with pytest.raises(NoWorkers):
        routers(0).probe_now(request(prompt(1)))


def test_load_only_requests_are_routed_on_load():
    group = routers(2)
    decision = group.commit_now(request([], isl=4000), "r1", None)
    assert decision.choice.request_blocks == 0
    assert group.pools[MODEL].router.sequences.prefill_tokens(decision.choice.worker) == 4000


def test_data_parallel_ranks_get_their_header():
    group = routers(1, dp_ranks=(0, 1))
    choices = [group.commit_now(request(prompt(i)), f"r{i}", None).choice for i in range(4)]
    assert {(c.worker.dp_rank, c.headers[DP_RANK_HEADER]) for c in choices} == {(0, "0"), (1, "1")}
    assert routers(1).probe_now(request(prompt(1))).choice.headers == {}


def test_lifecycle_calls_for_unknown_models_or_ids_are_harmless():
    group = routers(1)
    assert not group.free("other-model", "x") and not group.first_token("x")


def test_the_routers_are_the_pickers_own():
    picker = EndpointPicker(group_config("w", 2))
    group = picker.local
    group.commit_now(request(prompt(1)), "r1", None)
    assert group.in_flight() == 1 and not picker.pools[MODEL].router.is_idle()
    group.finish("r1")
    assert picker.is_idle() and group.in_flight() == 0
    picker.set_workers(MODEL, [*picker.config.workers, WorkerConfig("w9", "127.0.9.9:8000", MODEL)])
    assert group.probe_now(request(prompt(1))).load.workers == 3


def test_a_probe_reports_the_best_overlap_when_it_chooses_another_worker():
    group = routers(2)
    holder = group.commit_now(request(prompt(1)), "r1", None).choice.worker  # still prefilling: busy
    group.commit_now(request(prompt(9, 16 * 60)), "big", holder)  # and a long prompt on top
    probe = group.probe_now(request(prompt(1)))
    assert probe.choice.worker != holder
    assert (probe.choice.overlap_blocks, probe.choice.best_overlap_blocks) == (0, 10)


def test_a_salted_request_is_hashed_with_its_salt_in_probe_and_commit():
    group = routers(2)
    first = group.commit_now(GroupRequest(MODEL, prompt(1), cache_salt="tenant-a"), "r1", None)
    group.first_token("r1")
    same_salt = group.probe_now(GroupRequest(MODEL, prompt(1), cache_salt="tenant-a"))
    assert same_salt.choice.worker == first.choice.worker and same_salt.choice.overlap_blocks == 10
    assert group.probe_now(GroupRequest(MODEL, prompt(1))).choice.overlap_blocks == 0
    assert group.probe_now(GroupRequest(MODEL, prompt(1), cache_salt="tenant-b")).choice.overlap_blocks == 0
    loads = group.potential_loads_now(GroupRequest(MODEL, prompt(1), cache_salt="tenant-a"))
    assert max(w.overlap_blocks for w in loads.workers) == 10
