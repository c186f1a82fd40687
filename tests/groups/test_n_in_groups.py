"""A request's `n` reaches the group that serves it, local or remote: its router counts n decoding
sequences sharing one prefill (each its own partial last block), and the free gives them back once."""

from __future__ import annotations

from .builders import MODEL, group_config
from .test_features_in_groups import LONG, build, chat, closing, group_idle, mode, pick

__all__ = ["closing", "mode"]  # the fixtures these tests use


async def test_n_sequences_are_counted_in_the_group_that_serves_the_request(mode, closing):
    setup = await build(mode, group_config("n", 2))
    closing.append(setup)
    one = await pick(setup.top, chat(LONG), "one")
    await setup.settle()
    router = setup.group.pools[MODEL].router
    blocks_of_one = router.sequences.decode_blocks(one.worker)
    prefill_of_one = router.sequences.prefill_tokens(one.worker)
    setup.top.finish(one, "complete")
    await setup.settle()
    assert group_idle(setup)
    three = await pick(setup.top, chat(LONG.upper(), n=3), "three")  # as long, nothing cached
    await setup.settle()
    assert router.sequences.prefill_tokens(three.worker) == prefill_of_one  # one prefill
    assert router.sequences.decode_blocks(three.worker) == blocks_of_one + 2  # two more partial blocks
    setup.top.finish(three, "complete")
    setup.top.finish(three, "complete")
    await setup.settle()
    assert router.sequences.decode_blocks(three.worker) == 0
    assert group_idle(setup) and setup.top.is_idle()
