"""DisaggRouter: decode worker, prefill worker by overlap and prefill load, conditional disaggregation."""

import random

import pytest

from extproc.router import (
    AllWorkersBusy,
    BlocksStored,
    KvRouter,
    RouterConfig,
    RouterConfigOverride,
    StoredBlock,
    Worker,
    WorkerSpec,
    compute_block_hashes,
)
from extproc.router.disagg import (
    LOCAL_CACHED,
    LOCAL_NO_PREFILL,
    LOCAL_PREFILL_BUSY,
    LOCAL_SHORT,
    DisaggPolicy,
    DisaggRouter,
    prefill_router_config,
)

from .clock import FakeClock

BS = 16
D0, D1, P0, P1 = Worker("d0"), Worker("d1"), Worker("p0"), Worker("p1")
PROMPT = list(range(1000, 1000 + 64 * BS))  # 64 full blocks = 1024 tokens


def make(policy: DisaggPolicy | None = None, prefill_workers=("p0", "p1"), **config) -> DisaggRouter:
    cfg = RouterConfig(block_size=BS, **config)
    clock = FakeClock()
    decode = KvRouter(cfg, clock=clock, rng=random.Random(1), workers=[WorkerSpec("d0"), WorkerSpec("d1")])
    prefill = KvRouter(
        prefill_router_config(cfg),
        clock=clock,
        rng=random.Random(2),
        workers=[WorkerSpec(w) for w in prefill_workers],
    )
    return DisaggRouter(decode, prefill, policy or DisaggPolicy())


def cache(router: KvRouter, worker: Worker, tokens: list[int]) -> list[int]:
    hashes = compute_block_hashes(tokens, BS)
    blocks = tuple(StoredBlock(h, h) for h in hashes)
    router.apply_event(BlocksStored(worker, blocks))
    return hashes


def test_the_prefill_worker_caching_the_prefix_prefills_and_the_decode_worker_is_the_destination():
    router = make()
    hashes = cache(router.prefill, P1, PROMPT[: 48 * BS])  # p1 caches 48 of 64 blocks
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.prefill_worker == P1 and decision.prefill.overlap_blocks == len(hashes)
    assert decision.decode.worker in (D0, D1) and decision.local_reason is None
    # the prompt is the prefill worker's work, not the decode worker's
    assert router.prefill.sequences.prefill_tokens(P1) == len(PROMPT) - 48 * BS
    assert router.decode.sequences.prefill_tokens(decision.decode.worker) == 0
    assert router.prefill.sequences.decode_blocks(P1) == 0  # prefill workers track no decode blocks
    assert router.decode.sequences.decode_blocks(decision.decode.worker) > 0


def test_prefill_load_spreads_prompts_without_a_cached_prefix():
    router = make()
    first = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    other = [t + 50_000 for t in PROMPT]
    second = router.route(compute_block_hashes(other, BS), len(other), request_id="r2")
    assert {first.prefill_worker, second.prefill_worker} == {P0, P1}


def test_the_first_token_ends_the_prefill_share_and_free_ends_the_rest():
    router = make()
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert router.first_token("r1")
    assert router.prefill.is_idle() and not router.decode.is_idle()
    assert router.free("r1") and router.is_idle()
    assert not router.free("r1")  # idempotent
    assert decision.prefill is not None


def test_a_request_that_ends_before_its_first_token_frees_both_stages():
    router = make()
    router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert router.free("r1") and router.is_idle()


def test_a_short_uncached_part_is_prefilled_on_the_decode_worker():
    router = make(DisaggPolicy(min_remote_prefill_tokens=2000))
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.prefill is None and decision.local_reason == LOCAL_SHORT
    assert router.prefill.is_idle()
    # the decode worker does the prompt work, so its prefill tokens count
    assert router.decode.sequences.prefill_tokens(decision.decode.worker) == len(PROMPT)


def test_a_decode_worker_that_caches_most_of_the_prompt_prefills_it_itself():
    router = make(DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75))
    cache(router.decode, D1, PROMPT[: 56 * BS])  # 56/64 = 0.875 cached on d1
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.decode.worker == D1  # the decode router's own overlap weight found it
    assert decision.prefill is None and decision.local_reason == LOCAL_CACHED


def test_with_decode_overlap_weight_zero_the_cached_prefix_is_still_looked_up_for_the_skip():
    policy = DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75, decode_overlap_weight=0)
    router = make(policy)
    for w in (D0, D1):
        cache(router.decode, w, PROMPT[: 60 * BS])
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.local_reason == LOCAL_CACHED


def test_a_kv_indexers_answer_stands_in_for_both_routers_own_indexes():
    """One answer for the model's decode and prefill workers alike (`--kv-indexer-url`): each stage
    reads its own workers' part, whatever its own index holds."""
    hashes = compute_block_hashes(PROMPT, BS)
    router = make(DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75))
    cache(router.prefill, P0, PROMPT)  # the routers' own view, which the answer replaces
    decision = router.route(hashes, len(PROMPT), request_id="r1", found={P1: 48, D0: 8})
    assert (decision.prefill_worker, decision.prefill.overlap_blocks) == (P1, 48)
    assert (decision.decode.worker, decision.decode.overlap_blocks) == (D0, 8)
    decision = router.route(hashes, len(PROMPT), request_id="r2", found={D1: 56, P0: 64})
    assert (decision.decode.worker, decision.prefill, decision.local_reason) == (D1, None, LOCAL_CACHED)

    policy = DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75, decode_overlap_weight=0)
    balancing = make(policy)
    for w in (D0, D1):
        cache(balancing.decode, w, PROMPT)  # cached everywhere by its own index: the answer says not
    decision = balancing.route(hashes, len(PROMPT), request_id="r1", found={P1: 1})
    assert decision.local_reason is None and decision.prefill_worker == P1
    decision = balancing.route(hashes, len(PROMPT), request_id="r2", found={D0: 60, D1: 60})
    assert decision.local_reason == LOCAL_CACHED  # the skip is looked up in the answer too


def test_a_prompt_shorter_than_a_block_is_prefilled_locally_whatever_the_decode_weight():
    for weight in (None, 0):
        router = make(DisaggPolicy(decode_overlap_weight=weight))
        decision = router.route([], BS - 1, request_id="r1")  # no full block: nothing to look up
        assert (decision.prefill, decision.local_reason) == (None, LOCAL_SHORT)
        assert router.route([], BS - 1, request_id="r2", found={P0: 3}).local_reason == LOCAL_SHORT


def test_no_prefill_worker_falls_back_to_aggregated_serving():
    router = make(prefill_workers=())
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.prefill is None and decision.local_reason == LOCAL_NO_PREFILL
    assert router.decode.sequences.prefill_tokens(decision.decode.worker) == len(PROMPT)
    router.free("r1")
    assert router.is_idle()


def test_prefill_workers_outside_the_allowed_set_are_not_used():
    router = make()
    decision = router.route(
        compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1", prefill_allowed={"p1"}
    )
    assert decision.prefill_worker == P1
    other = [t + 50_000 for t in PROMPT]  # not predicted on a decode worker yet
    none = router.route(compute_block_hashes(other, BS), len(other), request_id="r2", prefill_allowed={"x"})
    assert none.local_reason == LOCAL_NO_PREFILL


def test_busy_prefill_workers_fall_back_to_local_prefill_and_busy_decode_workers_raise():
    router = make(active_prefill_tokens_threshold=1000)

    def prompt(i: int) -> list[int]:  # a prompt no worker caches
        return [t + 100_000 * i for t in PROMPT]

    for i in range(2):  # 1024 uncached prefill tokens each: both prefill workers over 1000
        assert router.route(compute_block_hashes(prompt(i), BS), 1024, request_id=f"r{i}").prefill is not None
    busy = router.route(compute_block_hashes(prompt(2), BS), 1024, request_id="r2")
    assert busy.local_reason == LOCAL_PREFILL_BUSY
    # the decode worker prefills that one itself: it is now over the threshold, the other is not
    assert router.decode.sequences.prefill_tokens(busy.decode.worker) == 1024
    router.route(compute_block_hashes(prompt(3), BS), 1024, request_id="r3")
    with pytest.raises(AllWorkersBusy):
        router.route(compute_block_hashes(prompt(4), BS), 1024, request_id="r4")


def test_the_prefill_router_config_drops_decode_tracking_and_the_queue():
    cfg = prefill_router_config(
        RouterConfig(
            router_queue_threshold=0.5, router_track_output_blocks=True, router_track_prefill_tokens=False
        )
    )
    assert not cfg.router_track_active_blocks and not cfg.router_track_output_blocks
    assert cfg.router_queue_threshold is None
    assert cfg.router_track_prefill_tokens  # the decode-only flag leaves the prefill stage's load alone


def test_decode_only_flags_shape_the_decode_side_of_local_and_remote_prefills():
    router = make(router_track_prefill_tokens=False, router_assume_kv_reuse=False)
    remote = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert router.prefill.sequences.prefill_tokens(remote.prefill_worker) == len(PROMPT)
    other = [t + 7 for t in PROMPT[: 8 * BS]]  # short: prefilled on its decode worker
    local = router.route(compute_block_hashes(other, BS), len(other), request_id="r2")
    assert local.local_reason == LOCAL_SHORT
    assert router.decode.sequences.prefill_tokens(local.decode.worker) == 0  # not tracked at all
    # no reuse assumed: every block of every request counts on its decode worker
    blocks = sum(router.decode.sequences.decode_blocks(w) for w in (D0, D1))
    assert blocks == 64 + 8


# --- the policy's edges and what each stage is given ------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "isl", "cached", "reason"),
    [
        (DisaggPolicy(), 1000, 745, LOCAL_SHORT),  # 255 uncached < 256
        (DisaggPolicy(), 1000, 744, None),  # 256 uncached, 74.4 % cached
        (DisaggPolicy(), 300, 100, LOCAL_SHORT),
        (DisaggPolicy(), 1000, 5000, LOCAL_SHORT),  # cached beyond the prompt counts as the prompt
        (DisaggPolicy(min_remote_prefill_tokens=0), 1000, 800, LOCAL_CACHED),  # exactly 80 %
        (DisaggPolicy(min_remote_prefill_tokens=0), 1000, 799, None),
        (DisaggPolicy(min_remote_prefill_tokens=0), 1000, 1, None),
        (DisaggPolicy(min_remote_prefill_tokens=0), 1, 1, LOCAL_CACHED),
        (DisaggPolicy(min_remote_prefill_tokens=0), 0, 0, None),  # an empty prompt: no division
    ],
)
def test_the_policy_at_its_edges(policy, isl, cached, reason):
    assert policy.local_reason(isl, cached) == reason


def test_the_prefill_router_config_turns_decode_tracking_off_not_unset():
    cfg = prefill_router_config(RouterConfig(router_track_output_blocks=True))
    assert cfg.router_track_active_blocks is False and cfg.router_track_output_blocks is False


def loaded_d1_caching_the_prompt(policy: DisaggPolicy) -> DisaggRouter:
    """d1 caches the whole prompt and decodes another request; d0 is idle and caches nothing."""
    router = make(policy)
    cache(router.decode, D1, PROMPT)
    other = [t + 50_000 for t in PROMPT[: 16 * BS]]
    busy = router.route(compute_block_hashes(other, BS), len(other), request_id="r0", allowed_workers={"d1"})
    assert busy.decode.worker == D1
    return router


def test_decode_overlap_weight_zero_balances_decode_load_and_a_requests_own_weight_wins():
    hashes, isl = compute_block_hashes(PROMPT, BS), len(PROMPT)
    own_weight = loaded_d1_caching_the_prompt(DisaggPolicy())
    assert own_weight.route(hashes, isl, request_id="r1").decode.worker == D1  # the cache decides
    zero = loaded_d1_caching_the_prompt(DisaggPolicy(decode_overlap_weight=0))
    assert zero.route(hashes, isl, request_id="r1").decode.worker == D0  # the lighter load decides
    overridden = loaded_d1_caching_the_prompt(DisaggPolicy(decode_overlap_weight=0))
    decision = overridden.route(
        hashes, isl, request_id="r1", config_override=RouterConfigOverride(overlap_score_weight=1.0)
    )
    assert decision.decode.worker == D1


def test_with_decode_overlap_weight_zero_an_uncached_decode_worker_counts_nothing_cached():
    policy = DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.01, decode_overlap_weight=0)
    router = make(policy)
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.local_reason is None and decision.prefill is not None


def test_round_robin_decode_still_skips_the_prefill_of_a_prompt_its_worker_caches():
    policy = DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75)
    router = make(policy, mode="round-robin")
    for w in (D0, D1):
        cache(router.decode, w, PROMPT[: 60 * BS])
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert decision.local_reason == LOCAL_CACHED


def test_the_decode_stage_gets_the_preferred_and_allowed_workers():
    router = make()
    hashes = compute_block_hashes(PROMPT, BS)
    cache(router.decode, D0, PROMPT)
    assert router.route(hashes, len(PROMPT), request_id="r1", preferred_worker="d1").decode.worker == D1
    assert router.route(hashes, len(PROMPT), request_id="r2", allowed_workers={"d1"}).decode.worker == D1


def test_the_decode_stage_gets_the_expected_output_length():
    def output_blocks(expected):
        router = make(DisaggPolicy(min_remote_prefill_tokens=2000), router_track_output_blocks=True)
        decision = router.route(
            compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1", expected_output_tokens=expected
        )
        worker = decision.decode.worker
        before = router.decode.sequences.decode_blocks(worker)
        router.decode.add_output_tokens("r1", 16)
        return router.decode.sequences.decode_blocks(worker) - before

    assert output_blocks(None) == 1.0
    assert output_blocks(32) == 0.5  # half of the expected output is out: the block weighs half


def test_a_requests_override_reaches_the_prefill_stage():
    # p1 caches the prompt: by overlap it always prefills; with weight 0 both prefill workers tie
    def prefill_workers(override):
        router = make(DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=1.5))  # never local
        cache(router.prefill, P1, PROMPT)
        chosen = set()
        for i in range(20):
            decision = router.route(
                compute_block_hashes(PROMPT, BS), len(PROMPT), request_id=f"r{i}", config_override=override
            )
            chosen.add(decision.prefill_worker)
            router.free(f"r{i}")
        return chosen

    assert prefill_workers(None) == {P1}
    assert prefill_workers(RouterConfigOverride(overlap_score_weight=0.0)) == {P0, P1}


def test_the_first_token_of_a_locally_prefilled_request_ends_its_prefill_on_the_decode_worker():
    router = make(DisaggPolicy(min_remote_prefill_tokens=2000))
    decision = router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert router.decode.sequences.prefill_tokens(decision.decode.worker) == len(PROMPT)
    assert router.first_token("r1")
    assert router.decode.sequences.prefill_tokens(decision.decode.worker) == 0
    assert not router.is_idle()  # the decode worker still decodes it
    assert not router.first_token("unknown")


def test_idle_means_both_stages_idle():
    router = make()
    router.route(compute_block_hashes(PROMPT, BS), len(PROMPT), request_id="r1")
    assert router.first_token("r1")
    assert router.prefill.is_idle() and not router.is_idle()


def test_predictions_past_their_ttl_do_not_keep_a_prompt_on_its_decode_worker():
    # decode overlap weight 0: the decode cache is looked up apart from the decision, and predictions
    # whose TTL passed while no request came must not count there either
    clock = FakeClock()
    cfg = RouterConfig(block_size=BS, use_kv_events=False, router_ttl_secs=120.0)
    decode = KvRouter(cfg, clock=clock, rng=random.Random(1), workers=[WorkerSpec("d0"), WorkerSpec("d1")])
    prefill = KvRouter(
        prefill_router_config(cfg), clock=clock, rng=random.Random(2), workers=[WorkerSpec("p0")]
    )
    policy = DisaggPolicy(min_remote_prefill_tokens=0, max_decode_prefix_frac=0.75, decode_overlap_weight=0)
    router = DisaggRouter(decode, prefill, policy)
    hashes = compute_block_hashes(PROMPT, BS)
    for i, worker in enumerate(("d0", "d1")):
        router.route(hashes, len(PROMPT), request_id=f"old{i}", allowed_workers={worker})
        router.free(f"old{i}")
    assert router.route(hashes, len(PROMPT), request_id="fresh").local_reason == LOCAL_CACHED
    router.free("fresh")
    clock.advance(121.0)
    decision = router.route(hashes, len(PROMPT), request_id="late")
    assert decision.local_reason is None and decision.prefill_worker == P0
