"""The router's errors carry what happened, as fields and in the message a client or log sees."""

import pytest

from extproc.router import Worker
from extproc.router.errors import (
    AllWorkersBusy,
    InvalidConfig,
    NoWorkers,
    PinnedWorkerUnavailable,
    QueueTimeout,
    RouterError,
    UnknownRequest,
)


def test_invalid_config_names_field_value_and_what_is_accepted():
    err = InvalidConfig("temperature", -1.0, "a number >= 0")
    assert (err.name, err.value, err.accepted) == ("temperature", -1.0, "a number >= 0")
    assert str(err) == "invalid temperature=-1.0: expected a number >= 0"
    assert isinstance(err, ValueError) and isinstance(err, RouterError)


def test_no_workers_says_why():
    assert str(NoWorkers()) == "no worker is registered"
    assert str(NoWorkers("no registered worker is allowed")) == "no registered worker is allowed"


def test_all_workers_busy_counts_the_candidates():
    err = AllWorkersBusy(3)
    assert err.candidates == 3
    assert str(err) == "all 3 candidate workers are over a busy threshold"


def test_pinned_worker_unavailable_names_the_worker_and_why():
    err = PinnedWorkerUnavailable(Worker("w1", 2), "busy")
    assert (err.worker, err.reason) == (Worker("w1", 2), "busy")
    assert str(err) == f"pinned worker {Worker('w1', 2)} is busy"


@pytest.mark.parametrize(
    ("sheddable", "suffix"), [(False, ""), (True, "; the request is sheddable and was shed")]
)
def test_queue_timeout_says_how_long_and_whether_it_was_shed(sheddable, suffix):
    err = QueueTimeout(2.25, sheddable=sheddable)
    assert (err.waited_s, err.sheddable) == (2.25, sheddable)
    assert str(err) == "every worker stayed saturated for 2.2 s while the request was queued" + suffix
    assert QueueTimeout(1.0).sheddable is False


def test_unknown_request_names_it():
    err = UnknownRequest("r-7")
    assert err.request_id == "r-7"
    assert str(err) == "request 'r-7' is not tracked"
