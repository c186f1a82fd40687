"""A real DNS server for the discovery tests: dnslib over UDP on 127.0.0.1, records from a JSON file.

    python tests/k8s/dns_server.py ZONE.json

Binds a free port and prints `PORT <n>`. Every query re-reads ZONE.json, so a test changes the
records (or the server's behaviour) by rewriting the file while the server runs:

    {"mode": "ok" | "servfail",
     "records": {"workers.test.": {"A": ["10.0.0.1"], "AAAA": ["fd00::1"]}},
     "servfail": ["prefill.test."]}

`mode: servfail` fails every query; `servfail` (optional) lists the names that fail while the
others answer.

A name missing from `records` is answered NXDOMAIN; a known name without records of the asked type
gets an empty NOERROR answer (what a headless Service without IPv6 pods looks like). Runs until
SIGTERM; the test stops it by pid.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from dnslib import AAAA, QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

TTL_S = 1


class ZoneFileResolver(BaseResolver):
    def __init__(self, path: Path) -> None:
        self.path = path

    def resolve(self, request, handler):  # type: ignore[no-untyped-def]  # dnslib's signature
        reply = request.reply()
        zone = json.loads(self.path.read_text())
        name = str(request.q.qname).lower()
        if zone.get("mode") == "servfail" or name in zone.get("servfail", []):
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        records = zone.get("records", {}).get(name)
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        qtype = QTYPE[request.q.qtype]
        for address in records.get(qtype, []):
            rdata = A(address) if qtype == "A" else AAAA(address)
            reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=TTL_S))
        return reply


def main() -> None:
    resolver = ZoneFileResolver(Path(sys.argv[1]))
    server = DNSServer(resolver, address="127.0.0.1", port=0, logger=DNSLogger("error", prefix=False))
    server.start_thread()
    print(f"PORT {server.server.server_address[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()  # the server thread is a daemon: it ends with the process


if __name__ == "__main__":
    main()
