"""A picker joining an engine whose replay buffer no longer reaches its first blocks, wired as `serve`
wires it: the engine's replayed stores hang under blocks the picker never saw, the worker is stale
with the reason, its subscriber is asked to rebuild (futile here: the buffer starts past seq 0, so
no replay loop), and prompts routed to it are learned by prediction until it is whole again."""

from __future__ import annotations

from extproc.events.feed import STALE
from extproc.events.sources import start_event_sources
from extproc.events.vllm import WireBlockStored
from extproc.events.zmq_publisher import ZmqEventPublisher
from extproc.picker.pipeline import EndpointPicker
from extproc.router.hashing import compute_block_hashes
from extproc.router.types import Worker
from tests.events.test_worker_set import BS, FAST, events_config, worker
from tests.events.test_zmq import wait_until
from tests.picker_fixtures import MODEL

W0 = Worker("w0")


async def test_a_truncated_replay_leaves_the_worker_stale_and_new_prompts_are_learned():
    engine = ZmqEventPublisher(port=0, replay_port=0, buffer_steps=2)
    await engine.start()
    template = list(range(100, 100 + 5 * BS))  # stored block by block, each under the one before
    for i in range(5):
        engine.publish([WireBlockStored([i + 1], i or None, template[i * BS : (i + 1) * BS], BS)])
    config = events_config((worker("w0", engine),))
    picker = EndpointPicker(config)
    sources = await start_event_sources(config, picker, timings=FAST)
    try:
        feed, counters = sources.feed, sources.counters
        await wait_until(lambda: feed.state(W0) == STALE and counters["zmq.resync_futile"] >= 1,
                         what="the orphans seen and the subscriber asked")  # fmt: skip
        assert "is unknown" in feed.reason(W0) and feed.lossy() == [W0]
        assert counters["zmq.rebuild"] == 1 and counters["feed.orphaned"] == 2

        router = picker.pools[MODEL].router
        prompt = template + list(range(900, 900 + 3 * BS))
        decision = router.best_worker(prompt, request_id="r1")
        assert decision.worker == W0 and decision.overlap_blocks == 0
        router.mark_prefill_complete("r1")
        router.free("r1")
        assert router.indexer.find_matches(compute_block_hashes(prompt, BS)) == {W0: 8}
    finally:
        await sources.stop()
        await engine.stop()
