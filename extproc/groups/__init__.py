"""Hierarchical routing: router groups (local or remote), probed and chosen per request.

A top-level picker asks every router group which worker it would pick and how much of the prompt
that worker caches (a probe changes no state), chooses a group by policy, commits the request
there and sends the request's lifecycle to the owning group. Any picker serves its own routers as
a group with `--group-api-port` (the gRPC API in `router_group.proto`).

    types.py     GroupRequest, GroupProbe, GroupDecision, ...; the RouterGroup protocol
    routers.py   GroupRouters: a picker's routers as a group (sync decisions)
    local.py     LocalGroup: GroupRouters as a RouterGroup in this process
    servicer.py  the gRPC API over GroupRouters; start_group_api
    remote.py    RemoteGroup: the gRPC client
    codec.py     protobuf <-> types
    policy.py    max-overlap, min-cost, weighted
    selector.py  GroupSelector: probe all, choose, commit, own the lifecycle, fall back
    metrics.py   per-group counters and their Prometheus collector
    errors.py    GroupError tree; NoGroupAvailable / AllGroupsBusy (503)
    stack.py     groups, a top-level picker and Envoy as child processes (examples, tests, benchmarks)
"""

from extproc.groups.errors import (
    AllGroupsBusy,
    GroupError,
    GroupRefused,
    GroupTimeout,
    GroupUnreachable,
    NoGroupAvailable,
)
from extproc.groups.local import LocalGroup
from extproc.groups.metrics import GroupCollector, GroupMetrics
from extproc.groups.policy import GroupPolicy, parse_policy
from extproc.groups.remote import RemoteGroup
from extproc.groups.routers import GroupPool, GroupRouters
from extproc.groups.selector import GroupSelector
from extproc.groups.servicer import GroupApiServer, RouterGroupServicer, start_group_api
from extproc.groups.types import (
    GroupChoice,
    GroupDecision,
    GroupLoad,
    GroupLoads,
    GroupProbe,
    GroupRequest,
    GroupWorkerLoad,
    RouterGroup,
)

__all__ = [
    "AllGroupsBusy",
    "GroupApiServer",
    "GroupChoice",
    "GroupCollector",
    "GroupDecision",
    "GroupError",
    "GroupLoad",
    "GroupLoads",
    "GroupMetrics",
    "GroupPolicy",
    "GroupPool",
    "GroupProbe",
    "GroupRefused",
    "GroupRequest",
    "GroupRouters",
    "GroupSelector",
    "GroupTimeout",
    "GroupUnreachable",
    "GroupWorkerLoad",
    "LocalGroup",
    "NoGroupAvailable",
    "RemoteGroup",
    "RouterGroup",
    "RouterGroupServicer",
    "parse_policy",
    "start_group_api",
]
