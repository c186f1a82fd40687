"""The router's shared nouns: as logs and errors print them, and a stored event's blocks as columns."""

import pytest

from extproc.router import Worker
from extproc.router.radix import RadixTree
from extproc.router.types import BlocksRemoved, BlocksStored, StoredBlock, StoredBlocks, columns, engine_ids


def test_a_worker_prints_its_id_and_a_dp_rank_past_the_first():
    assert str(Worker("w1")) == "w1"
    assert str(Worker(7, 0)) == "7"
    assert str(Worker("w1", 2)) == "w1/dp2"


def test_stored_blocks_read_as_columns_are_the_tuple_of_blocks_they_stand_for():
    """Decoders hand the tree two columns; every other reader sees the blocks, equal to the tuple."""
    blocks = StoredBlocks([11, 12, 13], [1, 2, 3])
    as_tuple = (StoredBlock(11, 1), StoredBlock(12, 2), StoredBlock(13, 3))
    assert len(blocks) == 3 and list(blocks) == list(as_tuple)
    assert blocks == as_tuple and as_tuple == blocks and hash(blocks) == hash(as_tuple)
    assert blocks[1] == StoredBlock(12, 2) and blocks[-1] == StoredBlock(13, 3)
    assert blocks[:2] == as_tuple[:2] and isinstance(blocks[:2], StoredBlocks)
    assert blocks != as_tuple[:2] and blocks == StoredBlocks([11, 12, 13], [1, 2, 3])
    assert blocks != StoredBlocks([11, 12, 13], [1, 2, 4]) and blocks != StoredBlocks([11, 12, 14], [1, 2, 3])
    assert blocks != [StoredBlock(11, 1)] and blocks != "blocks"  # only blocks compare
    event = BlocksStored(Worker("w"), blocks, parent_hash=7)
    assert event == BlocksStored(Worker("w"), as_tuple, parent_hash=7)
    assert columns(blocks) == ([11, 12, 13], [1, 2, 3]) and columns(blocks)[0] is not blocks.engine_hashes
    assert columns(as_tuple) == ([11, 12, 13], [1, 2, 3])
    assert repr(StoredBlocks([1], [2])) == "StoredBlocks([1], [2])"


def test_engine_ids_read_either_form_of_blocks():
    blocks = StoredBlocks([5, 6], [50, 60])
    assert engine_ids(blocks) == [5, 6]
    assert engine_ids(blocks) is blocks.engine_hashes  # read only: no copy
    assert engine_ids((StoredBlock(5, 50), StoredBlock(6, 60))) == [5, 6]
    assert engine_ids(()) == []


def test_stored_blocks_refuse_columns_of_different_lengths():
    with pytest.raises(ValueError, match="2 engine ids for 1 local hashes"):
        StoredBlocks([1, 2], [3])


def test_one_decoded_event_applied_to_two_trees_leaves_the_event_and_each_tree_as_it_was():
    """A tree keeps and grows the lists it stores: each must get its own (a model's routers, dumps)."""
    w = Worker("w")
    event = BlocksStored(w, StoredBlocks([11, 12], [1, 2]))
    first, second = RadixTree(), RadixTree()
    for tree in (first, second):
        assert tree.apply_event(event)
    assert first.apply_event(BlocksStored(w, StoredBlocks([13, 14], [3, 4]), parent_hash=12))
    assert event.blocks == (StoredBlock(11, 1), StoredBlock(12, 2))
    assert first.find_matches([1, 2, 3, 4]) == {w: 4}
    assert second.find_matches([1, 2, 3, 4]) == {w: 2}
    assert second.apply_event(BlocksRemoved(w, (12,)))  # removes what it stored, no more
    assert second.find_matches([1, 2]) == {w: 1} and first.find_matches([1, 2]) == {w: 2}
