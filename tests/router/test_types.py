"""The router's shared nouns as logs and errors print them."""

from extproc.router import Worker


def test_a_worker_prints_its_id_and_a_dp_rank_past_the_first():
    assert str(Worker("w1")) == "w1"
    assert str(Worker(7, 0)) == "7"
    assert str(Worker("w1", 2)) == "w1/dp2"
