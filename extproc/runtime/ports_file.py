"""`--ports-file PATH`: a process started with port 0 tells its parent which ports it got.

The parent (a test, a benchmark, `extproc demo`) passes port 0 and a path, waits for the file and
reads it (`extproc.devstack.procs.ManagedProcess.ports`); no port is chosen before the child binds
it, so no other process can take it in between. The file is one JSON object, name -> port, written
once every listener is bound (`serve`: port, health_port, admin_port, group_api_port; `mock-worker`:
port, kv_events_port, kv_replay_port) and replaced atomically, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path


def write_ports_file(path: str | os.PathLike[str], ports: Mapping[str, int | None]) -> None:
    """Write the bound `ports` (None values left out) to `path` as JSON, atomically."""
    target = Path(path)
    document = {name: port for name, port in ports.items() if port is not None}
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document) + "\n")
    os.replace(tmp, target)
