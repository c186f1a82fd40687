"""Router groups: every routing decision goes through them. A plain deployment is one local group.

A picker asks its router groups which worker each would pick and how much of the prompt that worker
caches (a probe changes no state), chooses a group by policy, commits the request there and sends
the request's lifecycle to the owning group. The local group (this process's workers) is
`extproc.picker.local_group.LocalGroup`; any picker serves it to others with `--group-api-port`
(the gRPC API in `router_group.proto`). This package imports nothing from `extproc.picker`.

    types.py     GroupRequest, GroupProbe, GroupDecision, ...; the RouterGroup protocol
    selector.py  GroupSelector: commit (one group) or probe all, choose, commit; own the lifecycle
    remote.py    RemoteGroup: the gRPC client, with leases and retried lifecycle calls
    servicer.py  the gRPC API over a local group; the leases of the pickers that commit there
    leases.py    LeaseTable: which owner holds which request, until when
    codec.py     protobuf <-> types
    policy.py    max-overlap, min-cost, weighted
    metrics.py   per-group counters and their Prometheus collector
    errors.py    GroupError tree; NoGroupAvailable / AllGroupsBusy (503)
"""

from extproc.groups.errors import (
    AllGroupsBusy,
    GroupError,
    GroupRefused,
    GroupTimeout,
    GroupUnreachable,
    NoGroupAvailable,
)
from extproc.groups.leases import LeaseTable
from extproc.groups.metrics import GroupCollector, GroupMetrics
from extproc.groups.policy import GroupPolicy, parse_policy
from extproc.groups.remote import RemoteGroup
from extproc.groups.selector import GroupSelector
from extproc.groups.servicer import GroupApiServer, RouterGroupServicer, ServedGroup, start_group_api
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
    "GroupProbe",
    "GroupRefused",
    "GroupRequest",
    "GroupSelector",
    "GroupTimeout",
    "GroupUnreachable",
    "GroupWorkerLoad",
    "LeaseTable",
    "NoGroupAvailable",
    "RemoteGroup",
    "RouterGroup",
    "RouterGroupServicer",
    "ServedGroup",
    "parse_policy",
    "start_group_api",
]
