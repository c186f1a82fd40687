"""ReportedLoads: the engines' own load reports, kept per worker, fresh for their max age."""

import pytest

from extproc.router.reported import ReportedLoad, ReportedLoads
from extproc.router.types import Worker

from .clock import FakeClock

A, B = Worker("a"), Worker("b")


def test_a_report_is_kept_as_given_and_stamped_with_the_clock():
    clock = FakeClock(100.0)
    loads = ReportedLoads(clock)
    assert len(loads) == 0 and loads.get(A) is None and loads.age_s(A) is None
    load = loads.set(A, kv_usage=0.25, running=3, waiting=2, max_age_s=5.0)
    assert load == ReportedLoad(kv_usage=0.25, running=3, waiting=2, at=100.0, max_age_s=5.0)
    assert loads.get(A) == load and loads.get(B) is None and len(loads) == 1
    assert loads.set(B, kv_usage=None, running=None, waiting=None, max_age_s=5.0, at=97.5).at == 97.5
    assert len(loads) == 2
    assert loads.get(B) == ReportedLoad(None, None, None, 97.5, 5.0)


@pytest.mark.parametrize(("given", "kept"), [(-0.5, 0.0), (0.0, 0.0), (0.4, 0.4), (1.0, 1.0), (1.7, 1.0)])
def test_a_kv_usage_is_clamped_to_a_fraction(given, kept):
    loads = ReportedLoads(FakeClock())
    assert loads.set(A, kv_usage=given, running=None, waiting=None, max_age_s=1.0).kv_usage == kept
    assert loads.fresh_kv_usage(A) == kept


def test_a_later_report_replaces_the_earlier_one():
    clock = FakeClock()
    loads = ReportedLoads(clock)
    loads.set(A, kv_usage=0.9, running=9, waiting=9, max_age_s=1.0)
    clock.advance(0.5)
    loads.set(A, kv_usage=0.1, running=1, waiting=0, max_age_s=2.0)
    assert loads.get(A) == ReportedLoad(0.1, 1, 0, 0.5, 2.0)
    assert len(loads) == 1


def test_the_age_counts_from_the_report_and_is_never_negative():
    clock = FakeClock(10.0)
    loads = ReportedLoads(clock)
    loads.set(A, kv_usage=0.5, running=None, waiting=None, max_age_s=3.0)
    assert loads.age_s(A) == 0.0
    clock.advance(2.5)
    assert loads.age_s(A) == 2.5
    loads.set(B, kv_usage=0.5, running=None, waiting=None, max_age_s=3.0, at=20.0)  # stamped ahead
    assert loads.age_s(B) == 0.0


def test_a_usage_is_fresh_up_to_its_max_age_inclusive():
    clock = FakeClock(10.0)
    loads = ReportedLoads(clock)
    loads.set(A, kv_usage=0.75, running=None, waiting=None, max_age_s=3.0)
    clock.advance(3.0)
    assert loads.fresh_kv_usage(A) == 0.75  # exactly the max age: still fresh
    clock.advance(0.001)
    assert loads.fresh_kv_usage(A) is None  # stale: the router's own view
    assert loads.get(A) is not None  # kept (for /debug/workers) until replaced or dropped
    assert loads.fresh_kv_usage(B) is None  # never reported


def test_a_report_without_kv_usage_leaves_the_routers_view():
    loads = ReportedLoads(FakeClock())
    loads.set(A, kv_usage=None, running=4, waiting=1, max_age_s=3.0)
    assert loads.fresh_kv_usage(A) is None


def test_drop_forgets_a_worker_and_ignores_an_unknown_one():
    loads = ReportedLoads(FakeClock())
    loads.set(A, kv_usage=0.5, running=None, waiting=None, max_age_s=3.0)
    loads.set(B, kv_usage=0.5, running=None, waiting=None, max_age_s=3.0)
    loads.drop(A)
    loads.drop(Worker("nobody"))
    assert loads.get(A) is None and loads.fresh_kv_usage(A) is None and loads.age_s(A) is None
    assert loads.get(B) is not None and len(loads) == 1
