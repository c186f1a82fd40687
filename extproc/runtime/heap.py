"""Loading a large KV snapshot without stopping the event loop for Python's full garbage collections.

CPython's collector examines every tracked object in a full (generation 2) collection, while
holding the interpreter. With a router tree of 2^20 (worker, block) entries in the heap that took
0.15 s (lists of block hashes are visited element by element). Loading a snapshot allocates those
objects in a few seconds, and the collector starts a full collection each time the long-lived
objects grew by a quarter: a replica starting or reloading one stopped its event loop (routing) for
0.26 s at 2^20 entries and 1.0-1.1 s at 2^22, in the decoding thread as on the loop
(`benchmarks/bench_snapshot.py`: `start_longest_turn_s`).

`bulk_load()` holds full collections off while it lasts; young collections go on, so short-lived
garbage is still collected. When the outermost one ends, the young generations are collected and
the whole heap is frozen (`gc.freeze`): what the load built is never examined again by a
collection, so later full collections cost only what was allocated after it.

What freezing costs: an object in the frozen heap is still freed when its last reference goes (the
router tree makes no reference cycles: `tests/runtime/test_heap.py`), but a cycle of frozen objects
that becomes garbage is never collected. Only the cyclic garbage present when a load ends, and
not collected by then, is kept that way. Bulk loads are rare: a snapshot is loaded when a replica
starts and when it falls behind a purge (`extproc.events.durable`), and a replica that starts takes
the routes another one hands over (`extproc.events.route_catchup`: from an answer's first part to
its end).
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

_NEVER = 1 << 30  # full collections considered after this many collections of generation 1: never
_lock = threading.Lock()
_depth = 0  # bulk loads under way (a decoding thread and the loop may hold one each)
_threshold2 = 10  # generation 2's threshold to restore


class BulkLoad:
    """No full garbage collection while it lasts; the heap frozen when the outermost one ends."""

    def __enter__(self) -> None:
        global _depth, _threshold2
        with _lock:
            if _depth == 0:
                t0, t1, _threshold2 = gc.get_threshold()
                gc.set_threshold(t0, t1, _NEVER)
            _depth += 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.collect(1)  # the young generations' garbage, not frozen with the rest
                gc.freeze()
                t0, t1, _ = gc.get_threshold()
                gc.set_threshold(t0, t1, _threshold2)


def bulk_load() -> BulkLoad:
    """`with bulk_load():` around a load of many long-lived objects (a class, not a generator:
    mutation testing reaches its methods)."""
    return BulkLoad()
