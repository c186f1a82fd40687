"""Every Protocol in the package against the implementations its callers are given, so that a Protocol
and what implements it cannot drift apart unnoticed.

Two checks of the same table:

- Statically (mypy): the `TYPE_CHECKING` block assigns each implementation to its Protocol
  (`sink: EventSink = feed`); mypy reports a member that is missing or has an incompatible type.
- At run time, structurally (`inspect.signature`), because a Protocol that leaves a parameter out
  still type-checks (mypy checks this file in `make typecheck`, not every caller's use): every
  member of the Protocol exists on the implementation as the same kind of thing (method, coroutine
  method, property or attribute), with the same parameters (names, kinds, positions; a default where
  the Protocol has one). A parameter of the implementation that the Protocol does not declare must
  have a default, be named in the pair's `narrowed` set (the Protocol is deliberately narrower), and
  never be passed by a caller that holds the Protocol (the modules that import it): otherwise the
  Protocol lacks what its callers use, the drift of `epp.service.Picker.pick` (no `on_queued`, which
  `ExtProcService` passes and `EndpointPicker.pick` takes; issue 18).

Implementations are imported by name inside each case, so a moved class fails its own pairs only.
A Protocol added to the package without a row here fails `test_every_protocol_of_the_package_is_checked`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

import extproc

PACKAGE = Path(extproc.__file__).parent


@dataclass(frozen=True)
class Pair:
    protocol: str  # "module:Name"
    implementation: str
    narrowed: frozenset[str] = field(default_factory=frozenset)  # "method.param" the Protocol leaves out
    drift: str | None = None  # a known drift: the case is a strict xfail naming it

    @property
    def id(self) -> str:
        return f"{self.protocol.split(':')[1]}<-{self.implementation.split(':')[1]}"


def narrowed(*names: str) -> frozenset[str]:
    return frozenset(names)


PAIRS = [
    # runtime/
    Pair("extproc.runtime.discovery:WorkerSetTarget", "extproc.picker.pipeline:EndpointPicker"),
    Pair("extproc.runtime.engine_metrics:WorkerPools", "extproc.picker.pipeline:EndpointPicker"),
    Pair("extproc.runtime.lora_discovery:NameTarget", "extproc.picker.pipeline:EndpointPicker"),
    Pair("extproc.events.route_catchup:RouteSink", "extproc.picker.pipeline:EndpointPicker"),
    Pair("extproc.picker.pipeline:RouteShare", "extproc.events.sources:_RouteShare"),
    # request/
    Pair("extproc.request.tokenizer:Tokenizer", "extproc.request.tokenizer:ByteTokenizer"),
    Pair("extproc.request.tokenizer:Tokenizer", "extproc.request.tokenizer:HfTokenizer"),
    # sim/
    Pair("extproc.sim.prefix_cache:KvCacheListener", "extproc.events.zmq_publisher:VllmEventListener"),
    Pair("extproc.sim.prefix_cache:KvCacheListener", "extproc.events.nats_events:NatsEventPublisher"),
    Pair("extproc.sim.prefix_cache:KvCacheListener", "extproc.sim.kv_events:_Forward"),
    Pair("extproc.sim.prefix_cache:KvCacheListener", "extproc.sim.replay_router:KvEventTap"),
    Pair("extproc.sim.prefix_cache:OffloadListener", "extproc.events.zmq_publisher:VllmEventListener"),
    Pair("extproc.sim.prefix_cache:OffloadListener", "extproc.sim.replay_router:KvEventTap"),
    Pair("extproc.sim.replay_router:ReplayRouter", "extproc.sim.replay_router:KvRouterAdapter"),
    Pair("extproc.sim.replay_router:ReplayRouter", "extproc.sim.replay_router:DisaggRouterAdapter"),
    *(
        Pair(
            "extproc.sim.mock_worker:TokenizerLike",
            f"extproc.request.tokenizer:{name}",
            # the mock worker tokenizes as the engine does by default, without template kwargs
            narrowed(
                "encode_text.add_special_tokens",
                "encode_chat.chat_template_kwargs",
                "encode_chat.add_special_tokens",
            ),
        )
        for name in ("ByteTokenizer", "HfTokenizer")
    ),
    Pair("extproc.sim.disagg:EngineClock", "extproc.sim.mock_worker:EngineDriver"),
    Pair("extproc.sim.mock_responses:HandlerWorker", "extproc.sim.mock_worker:MockWorker"),
    Pair("extproc.sim.mock_responses:_Driver", "extproc.sim.mock_worker:EngineDriver"),
    Pair("extproc.sim.kv_events:KvEventPublisher", "extproc.sim.kv_events:ZmqKvEvents"),
    Pair("extproc.sim.kv_events:KvEventPublisher", "extproc.sim.kv_events:NatsKvEvents"),
    # events/
    Pair("extproc.events.sink:EventSink", "extproc.events.feed:RouterFeed"),
    Pair(  # a snapshot holds what the workers reported, never the router's predictions
        "extproc.events.durable:TreeSource",
        "extproc.router:KvRouter",
        narrowed("dump_events.include_predicted"),
    ),
    Pair("extproc.events.durable:TreeSource", "extproc.events.sources:_AllRouters"),
    Pair(  # replica sync marks only other replicas' requests, which teach no pass time (add_request)
        "extproc.events.replica_sync:SyncedRouter",
        "extproc.router:KvRouter",
        narrowed("mark_prefill_complete.at_first_token"),
    ),
    Pair("extproc.events.replica_sync:SyncedRouter", "extproc.events.sources:_AllRouters"),
    # router/ (what a TTL table keeps: a sticky session's pin, a stored answer's home)
    Pair("extproc.router.ttl_table:Timed", "extproc.router.sessions:Pin"),
    Pair("extproc.router.ttl_table:Timed", "extproc.picker.response_homes:Home"),
    # picker/
    Pair("extproc.picker.pipeline:WorkerSetListener", "extproc.events.sources:WorkerSetFollower"),
    Pair("extproc.picker.local_group:RouteListener", "extproc.events.sources:_SyncListener"),
    # epp/
    Pair(
        "extproc.epp.service:Picker",
        "extproc.picker.pipeline:EndpointPicker",
        # RoutingClient passes override to EndpointPicker itself; the stream handler never does
        narrowed("pick.override"),
    ),
    Pair("extproc.epp.service:OutputTracker", "extproc.picker.pipeline:EndpointPicker"),
    # groups/
    Pair("extproc.groups.servicer:ServedGroup", "extproc.picker.local_group:LocalGroup"),
    Pair("extproc.groups.types:RouterGroup", "extproc.picker.local_group:LocalGroup"),
    Pair("extproc.groups.types:RouterGroup", "extproc.groups.remote:RemoteGroup"),
]


if TYPE_CHECKING:  # the same table for mypy: each implementation assigned to its Protocol
    from extproc.epp.service import OutputTracker, Picker
    from extproc.events.durable import TreeSource
    from extproc.events.feed import RouterFeed
    from extproc.events.nats_events import NatsEventPublisher
    from extproc.events.replica_sync import SyncedRouter
    from extproc.events.route_catchup import RouteSink
    from extproc.events.sink import EventSink
    from extproc.events.sources import WorkerSetFollower, _AllRouters, _RouteShare, _SyncListener
    from extproc.events.zmq_publisher import VllmEventListener
    from extproc.groups.remote import RemoteGroup
    from extproc.groups.servicer import ServedGroup
    from extproc.groups.types import RouterGroup
    from extproc.picker.local_group import LocalGroup, RouteListener
    from extproc.picker.pipeline import EndpointPicker, RouteShare, WorkerSetListener
    from extproc.picker.response_homes import Home
    from extproc.request.tokenizer import ByteTokenizer, HfTokenizer, Tokenizer
    from extproc.router import KvRouter
    from extproc.router.sessions import Pin
    from extproc.router.ttl_table import Timed
    from extproc.runtime.discovery import WorkerSetTarget
    from extproc.runtime.engine_metrics import WorkerPools
    from extproc.runtime.lora_discovery import NameTarget
    from extproc.sim.disagg import EngineClock
    from extproc.sim.kv_events import KvEventPublisher, NatsKvEvents, ZmqKvEvents, _Forward
    from extproc.sim.mock_responses import HandlerWorker, _Driver
    from extproc.sim.mock_worker import EngineDriver, MockWorker, TokenizerLike
    from extproc.sim.prefix_cache import KvCacheListener, OffloadListener
    from extproc.sim.replay_router import DisaggRouterAdapter, KvEventTap, KvRouterAdapter, ReplayRouter

    def _assignable(
        endpoint_picker: EndpointPicker,
        byte_tokenizer: ByteTokenizer,
        hf_tokenizer: HfTokenizer,
        vllm_listener: VllmEventListener,
        nats_publisher: NatsEventPublisher,
        forward: _Forward,
        tap: KvEventTap,
        kv_adapter: KvRouterAdapter,
        disagg_adapter: DisaggRouterAdapter,
        driver: EngineDriver,
        zmq_events: ZmqKvEvents,
        nats_events: NatsKvEvents,
        feed: RouterFeed,
        router: KvRouter,
        all_routers: _AllRouters,
        follower: WorkerSetFollower,
        sync_listener: _SyncListener,
        local_group: LocalGroup,
        remote_group: RemoteGroup,
        mock_worker: MockWorker,
        route_share_impl: _RouteShare,
        pin: Pin,
        home: Home,
    ) -> None:
        targets: list[WorkerSetTarget] = [endpoint_picker]
        tokenizers: list[Tokenizer] = [byte_tokenizer, hf_tokenizer]
        listeners: list[KvCacheListener] = [vllm_listener, nats_publisher, forward, tap]
        offload_listeners: list[OffloadListener] = [vllm_listener, tap]
        replay_routers: list[ReplayRouter] = [kv_adapter, disagg_adapter]
        worker_tokenizers: list[TokenizerLike] = [byte_tokenizer, hf_tokenizer]
        clock: EngineClock = driver
        responses_driver: _Driver = driver
        handler_worker: HandlerWorker = mock_worker
        publishers: list[KvEventPublisher] = [zmq_events, nats_events]
        sink: EventSink = feed
        trees: list[TreeSource] = [router, all_routers]
        synced: list[SyncedRouter] = [router, all_routers]
        worker_set_listener: WorkerSetListener = follower
        route_listener: RouteListener = sync_listener
        picker: Picker = endpoint_picker
        output_tracker: OutputTracker = endpoint_picker
        worker_pools: WorkerPools = endpoint_picker
        name_target: NameTarget = endpoint_picker
        route_sink: RouteSink = endpoint_picker
        route_share: RouteShare = route_share_impl
        served: ServedGroup = local_group
        groups: list[RouterGroup] = [local_group, remote_group]
        timed: list[Timed] = [pin, home]
        del timed, targets, tokenizers, listeners, replay_routers, worker_tokenizers, clock, publishers, sink
        del offload_listeners
        del trees, synced, worker_set_listener, route_listener, picker, served, groups, output_tracker
        del worker_pools, name_target, responses_driver, handler_worker, route_sink, route_share


# --- the structural check --------------------------------------------------------------------------

_PROTOCOL_INTERNALS = {"_is_protocol", "_is_runtime_protocol", "_abc_impl", "__protocol_attrs__"}


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _protocol_members(proto: type) -> dict[str, object]:
    """Name -> the Protocol's own definition (function, property, or None for an annotated attribute)."""
    members: dict[str, object] = {}
    for klass in reversed(proto.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        for name in inspect.get_annotations(klass):
            members.setdefault(name, None)
        for name, value in vars(klass).items():
            if name.startswith("__") or name in _PROTOCOL_INTERNALS:
                continue
            members[name] = value
    return members


def _has_attribute(cls: type, name: str) -> bool:
    """`name` is data of `cls`'s instances: a class attribute, annotation, slot, field or `self.name =`."""
    if hasattr(cls, name):
        return True
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            return True
        slots = klass.__dict__.get("__slots__", ())
        if name in ((slots,) if isinstance(slots, str) else slots):
            return True
    if is_dataclass(cls) and name in {f.name for f in fields(cls)}:
        return True
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == name
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    return True
    return False


def _params(func: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(func).parameters.values())[1:]  # without self


def _signature_problems(name: str, expected: Any, actual: Any, narrowed_params: frozenset[str]) -> list[str]:
    problems = []
    if inspect.iscoroutinefunction(expected) != inspect.iscoroutinefunction(actual):
        kind = "async" if inspect.iscoroutinefunction(expected) else "sync"
        problems.append(f"{name}: the Protocol's is {kind}, the implementation's is not")
    theirs = {p.name: p for p in _params(actual)}
    positional = [p.name for p in _params(actual) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in theirs.values())
    for index, p in enumerate(_params(expected)):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if not any(q.kind is p.kind for q in theirs.values()):
                problems.append(f"{name}: no {p} as the Protocol has")
            continue
        q = theirs.get(p.name)
        if q is None:
            if not (p.kind is p.KEYWORD_ONLY and var_kw):
                problems.append(f"{name}: no parameter {p.name!r} ({p.kind.description} in the Protocol)")
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if (
                q.kind not in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)
                or positional.index(p.name) != index
            ):
                problems.append(f"{name}: {p.name!r} is not positional at {index} as in the Protocol")
        elif q.kind not in (q.KEYWORD_ONLY, q.POSITIONAL_OR_KEYWORD):
            problems.append(f"{name}: {p.name!r} cannot be passed by keyword as the Protocol allows")
        if p.default is not p.empty and q.default is q.empty:
            problems.append(f"{name}: {p.name!r} has a default in the Protocol, none here")
    declared = {p.name for p in _params(expected)}
    for q in theirs.values():
        if q.name in declared or q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            continue
        if q.default is q.empty:
            problems.append(f"{name}: {q.name!r} is required here but the Protocol's callers never pass it")
        elif f"{name}.{q.name}" not in narrowed_params:
            problems.append(f"{name}: {q.name!r} is not in the Protocol (nor listed as narrowed)")
    return problems


def _holds(module: str, tree: ast.Module, proto: type) -> bool:
    """The module declares `proto` or imports it by name."""
    return module == proto.__module__ or any(
        isinstance(node, ast.ImportFrom)
        and node.module == proto.__module__
        and any(alias.name == proto.__name__ for alias in node.names)
        for node in ast.walk(tree)
    )


def _callers_passing(proto: type, method: str, keyword: str) -> list[str]:
    """`module:line` of calls `<x>.method(..., keyword=...)` in the modules that declare or import `proto`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        if not _holds(module, tree, proto):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == method
                and any(k.arg == keyword for k in node.keywords)
            ):
                found.append(f"{module}:{node.lineno}")
    return found


def conformance_problems(pair: Pair) -> list[str]:
    proto, impl = _load(pair.protocol), _load(pair.implementation)
    assert getattr(proto, "_is_protocol", False), f"{pair.protocol} is not a Protocol"
    problems = []
    for name, expected in _protocol_members(proto).items():
        actual = inspect.getattr_static(impl, name, None)
        if expected is None or isinstance(expected, property):  # data: an attribute or a property
            if actual is None and not _has_attribute(impl, name):
                problems.append(f"{name}: missing (the Protocol's attribute)")
            elif inspect.isfunction(actual) or isinstance(actual, staticmethod | classmethod):
                problems.append(f"{name}: a method here, an attribute in the Protocol")
            continue
        if actual is None:
            problems.append(f"{name}: missing (the Protocol's method)")
            continue
        if isinstance(actual, property) or not callable(actual):
            problems.append(f"{name}: not a method here")
            continue
        problems += _signature_problems(name, expected, getattr(impl, name), pair.narrowed)
    for entry in sorted(pair.narrowed):
        method, _, keyword = entry.partition(".")
        for where in _callers_passing(proto, method, keyword):
            problems.append(f"{entry} is passed by a caller holding {proto.__name__} ({where})")
    return problems


def _case(pair: Pair) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=pair.drift)] if pair.drift else []
    return pytest.param(pair, id=pair.id, marks=marks)


@pytest.mark.parametrize("pair", [_case(p) for p in PAIRS])
def test_the_implementation_has_every_member_of_its_protocol_as_the_protocol_declares_it(pair: Pair) -> None:
    problems = conformance_problems(pair)
    assert not problems, f"{pair.implementation} against {pair.protocol}:\n  " + "\n  ".join(problems)


def test_every_protocol_of_the_package_is_checked() -> None:
    declared = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Protocol")
                or (
                    isinstance(b, ast.Attribute)
                    and b.attr == "Protocol"
                    and ast.unparse(b) != "asyncio.Protocol"
                )
                for b in node.bases  # asyncio.Protocol is a transport's callbacks, not a typing Protocol
            ):
                declared.add(f"{module}:{node.name}")
    assert declared == {p.protocol for p in PAIRS}


# --- the check itself, on pairs made to drift ------------------------------------------------------


class _Proto(Protocol):
    name: str

    @property
    def size(self) -> int: ...

    def put(self, key: str, value: int, *, replace: bool = False) -> None: ...

    async def close(self) -> None: ...


class _Fits:
    def __init__(self) -> None:
        self.name = "x"
        self.size = 0

    def put(self, key: str, value: int, *, replace: bool = False, trace: bool = False) -> None: ...

    async def close(self) -> None: ...


class _Drifted:
    size = 0

    def put(self, value: int, key: str, *, must: bool) -> None: ...

    def close(self) -> None: ...


def _problems(implementation: str, *narrowed_params: str) -> list[str]:
    return conformance_problems(
        Pair(f"{__name__}:_Proto", f"{__name__}:{implementation}", narrowed(*narrowed_params))
    )


def test_the_check_accepts_a_deliberately_narrower_protocol_and_names_every_drift() -> None:
    assert _problems("_Fits", "put.trace") == []
    assert _problems("_Fits") == ["put: 'trace' is not in the Protocol (nor listed as narrowed)"]
    assert _problems("_Drifted") == [
        "name: missing (the Protocol's attribute)",
        "put: 'key' is not positional at 0 as in the Protocol",
        "put: 'value' is not positional at 1 as in the Protocol",
        "put: no parameter 'replace' (keyword-only in the Protocol)",
        "put: 'must' is required here but the Protocol's callers never pass it",
        "close: the Protocol's is async, the implementation's is not",
    ]
