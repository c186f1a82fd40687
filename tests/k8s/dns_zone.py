"""The zone the DNS discovery tests' server answers from (tests/k8s/dns_server.py, dnslib), and the
names they look up."""

from __future__ import annotations

import json
from pathlib import Path

NAME = "llm-workers.default.svc.cluster.local."
PREFILL_NAME = "llm-prefill.default.svc.cluster.local."


class Zone:
    """The zone file the DNS server answers from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(["10.1.0.1", "10.1.0.2"])

    def set(
        self,
        a: list[str],
        aaaa: list[str] | None = None,
        *,
        mode: str = "ok",
        exists: bool = True,
        prefill: list[str] | None = None,
        failing: tuple[str, ...] = (),
    ) -> None:
        """`prefill`: A records of PREFILL_NAME (None: no such name); `failing`: names answered SERVFAIL."""
        records = {NAME: {"A": a, "AAAA": aaaa or []}} if exists else {}
        if prefill is not None:
            records[PREFILL_NAME] = {"A": prefill}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mode": mode, "records": records, "servfail": list(failing)}))
        tmp.replace(self.path)  # atomic: the server never reads half a file
