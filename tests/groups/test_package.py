"""The groups package: its promised names, and checked-in stubs that match the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import extproc.groups

PACKAGE = Path(extproc.groups.__file__).parent
GENERATED = ("router_group_pb2.py", "router_group_pb2.pyi", "router_group_pb2_grpc.py")


# The package's public names, exactly: adding or removing one is a deliberate change made here too.
GROUPS_API = [
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


def test_the_exported_names_are_exactly_the_listed_ones_sorted_and_each_exists():
    names = extproc.groups.__all__
    assert names == GROUPS_API
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    star: dict[str, object] = {}
    exec("from extproc.groups import *", star)
    assert sorted(n for n in star if n != "__builtins__") == sorted(GROUPS_API)
    for name in names:
        assert getattr(extproc.groups, name) is not None, name


def test_the_checked_in_stubs_match_the_proto(tmp_path):
    # the same command as `make protos`, writing under tmp_path
    result = subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-Iextproc/groups/_generated={PACKAGE}",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            str(PACKAGE / "router_group.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name in GENERATED:
        fresh = (tmp_path / "extproc" / "groups" / "_generated" / name).read_text()
        assert fresh == (PACKAGE / "_generated" / name).read_text(), f"{name} is stale: run `make protos`"
