"""Command line: `python -m extproc serve | mock-worker | demo`. Parses, configures logging, runs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from extproc.config import ConfigError, add_serve_arguments, load_config
from extproc.devstack.envoy_config import PickerHealth, PickerTls

DESCRIPTION = """\
extproc: a KV-cache-aware endpoint picker for LLM serving behind Envoy.

  serve        run the ext_proc picker (gRPC :9002, health :9003) for the workers in --config
  mock-worker  run a simulated OpenAI-compatible worker (prefix cache + timing model)
  demo         start Envoy, the picker and four mock workers; compare KV routing with round robin
  replay       replay traces through simulated engines and the router in virtual time (routing quality)
  envoy-config print a ready Envoy config (buffered, duplex or failopen) for a picker and workers
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m extproc",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the ext_proc endpoint picker",
        allow_abbrev=False,  # --router-ttl is a flag of its own, not a prefix of --router-ttl-secs
        description="Run the ext_proc endpoint picker. Every router flag can also be set with an environment "
        "variable DYN_<FLAG> (e.g. DYN_ROUTER_MODE=round-robin) or in the config file's 'router:' section; "
        "flags win over the environment, which wins over the file.",
    )
    add_serve_arguments(serve)
    serve.add_argument(
        "--ports-file",
        metavar="PATH",
        help="once every server listens, write the bound ports as JSON here (port, health_port, "
        "admin_port, group_api_port): start with port 0 and read the ports back, no port chosen in advance",
    )

    from extproc.sim.mock_worker import add_mock_worker_arguments

    mock = sub.add_parser(
        "mock-worker",
        help="run a simulated OpenAI-compatible worker",
        description="A simulated vLLM-like worker: OpenAI endpoints, /tokenize, /metrics, "
        "a block-level prefix cache and the Dynamo mocker's timing model.",
    )
    add_mock_worker_arguments(mock)

    from extproc.devstack.demo import add_demo_arguments

    demo = sub.add_parser(
        "demo",
        help="compare KV routing with round robin on loopback",
        description="Start Envoy, the picker and mock workers on 127.0.0.1, send multi-turn "
        "chat traffic with shared system prompts, and print per-worker tables.",
    )
    add_demo_arguments(demo)

    from extproc.sim.replay_cli import add_replay_arguments

    replay = sub.add_parser(
        "replay",
        help="replay traces through simulated engines and the router, in virtual time",
        description="Replay Mooncake traces through N simulated vLLM-style engines (REFERENCE section 6) "
        "and the real KV router, in virtual time; print TTFT, ITL, E2E, throughput, reuse and balance.",
    )
    add_replay_arguments(replay)

    envoy = sub.add_parser(
        "envoy-config",
        help="print an Envoy config that works with this picker",
        description="Render one of the Envoy configs the picker ships (extproc/devstack/envoy/README.md).",
    )
    envoy.add_argument(
        "--variant",
        choices=("buffered", "duplex", "failopen"),
        default="buffered",
        help="buffered (default): body in one message, destination from metadata; duplex: "
        "GIE-style FULL_DUPLEX_STREAMED; failopen: round robin when the picker is down",
    )
    envoy.add_argument(
        "--listen-port", type=int, default=8080, help="Envoy's HTTP port (default: %(default)s)"
    )
    envoy.add_argument(
        "--admin-port", type=int, default=9901, help="Envoy's admin port (default: %(default)s)"
    )
    envoy.add_argument(
        "--picker",
        action="append",
        default=[],
        metavar="IP:PORT,...",
        help="the picker's ip:port, or its replicas' (comma-separated or repeated; default: 127.0.0.1:9002)",
    )
    envoy.add_argument(
        "--picker-health-port",
        default="9003",
        metavar="PORT[,PORT...]",
        help="the pickers' gRPC health port (their --health-port), one for all or one per --picker "
        "replica in order; Envoy health-checks each replica there (default: %(default)s)",
    )
    envoy.add_argument(
        "--picker-health-interval-ms",
        type=int,
        default=1000,
        help="how often Envoy checks each picker's health (default: %(default)s)",
    )
    envoy.add_argument(
        "--picker-unhealthy-threshold",
        type=int,
        default=2,
        help="failed checks in a row that take a picker out (default: %(default)s)",
    )
    envoy.add_argument(
        "--picker-healthy-threshold",
        type=int,
        default=1,
        help="passed checks that bring it back (default: %(default)s)",
    )
    envoy.add_argument(
        "--workers",
        action="append",
        default=[],
        metavar="[MODEL=]IP:PORT,...",
        help="comma-separated worker ip:port list (needed by failopen); with several models, once per "
        "model as MODEL=ip:port,...: failopen then keeps a request the picker skipped on its model's workers",
    )
    envoy.add_argument(
        "--message-timeout-ms", type=int, default=5000, help="ext_proc message timeout (default: %(default)s)"
    )
    envoy.add_argument(
        "--prefill-endpoint-header",
        default="x-prefill-endpoint",
        help="the picker's --prefill-endpoint-header: removed from clients' requests like every header the "
        "picker owns (default: %(default)s)",
    )
    tls = envoy.add_argument_group("TLS to the picker (for a picker started with --tls-*)")
    tls.add_argument(
        "--picker-tls",
        action="store_true",
        help="reach the picker over TLS without verifying it (a --tls-self-signed picker)",
    )
    tls.add_argument("--picker-tls-ca-file", help="verify the picker's certificate against this CA (TLS on)")
    tls.add_argument(
        "--picker-tls-server-name",
        help="name the picker's certificate must carry, also sent as SNI (default: the picker's IP)",
    )
    tls.add_argument("--picker-tls-cert-file", help="Envoy's client certificate, for a picker requiring mTLS")
    tls.add_argument("--picker-tls-key-file", help="private key of --picker-tls-cert-file")
    return parser


def _workers(values: list[str]) -> list[str] | dict[str, list[str]]:
    """envoy-config's --workers values ("ip:port,..." or "model=ip:port,...", repeated) as
    render_envoy_config's `workers`. Raises ValueError when some name a model and others do not."""
    lists = [value.partition("=") if "=" in value else ("", "", value) for value in values]
    named = {model.strip() for model, _, _ in lists if model.strip()}
    if not named:
        return [w.strip() for _, _, value in lists for w in value.split(",") if w.strip()]
    if any(not model.strip() for model, _, _ in lists):
        raise ValueError("--workers: name the model of every list (MODEL=ip:port,...) or of none")
    workers: dict[str, list[str]] = {}
    for model, _, value in lists:
        workers.setdefault(model.strip(), []).extend(w.strip() for w in value.split(",") if w.strip())
    return workers


def _ports(value: str) -> int | list[int]:
    """envoy-config's --picker-health-port ("9003" or "9003,9013"); ValueError names the value."""
    try:
        ports = [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--picker-health-port {value!r}: give a port or a comma list of ports") from None
    return ports[0] if len(ports) == 1 else ports


def _picker_tls(args: argparse.Namespace) -> bool | PickerTls:
    """envoy-config's TLS flags as render_envoy_config's `picker_tls`."""
    files = (
        args.picker_tls_ca_file,
        args.picker_tls_server_name,
        args.picker_tls_cert_file,
        args.picker_tls_key_file,
    )
    if not any(files):
        return bool(args.picker_tls)
    return PickerTls(*files)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            config = load_config(args=args)
        except ConfigError as exc:
            print(f"extproc serve: {exc}", file=sys.stderr)
            return 2
        _logging(config.log_level)
        for notice in config.notices:  # Dynamo's knobs accepted but not applied: one line each
            logging.getLogger("extproc.config").warning("%s", notice)
        from extproc.events.nats_security import NatsRefused
        from extproc.runtime.server import serve
        from extproc.runtime.tls import TlsError
        from extproc.runtime.wakeups import run

        try:
            run(serve(config, ports_file=args.ports_file))
        except TlsError as exc:  # unusable certificate files
            print(f"extproc serve: {exc}", file=sys.stderr)
            return 2
        except NatsRefused as exc:  # logged already, with the setting to check
            print(f"extproc serve: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "envoy-config":
        from extproc.devstack.envoy_config import render_envoy_config

        try:
            text = render_envoy_config(
                args.variant,
                listen_port=args.listen_port,
                admin_port=args.admin_port,
                picker_address=[p.strip() for v in args.picker or ["127.0.0.1:9002"] for p in v.split(",")],
                picker_health_port=_ports(args.picker_health_port),
                picker_health=PickerHealth(
                    interval_ms=args.picker_health_interval_ms,
                    unhealthy_threshold=args.picker_unhealthy_threshold,
                    healthy_threshold=args.picker_healthy_threshold,
                ),
                workers=_workers(args.workers),
                message_timeout_ms=args.message_timeout_ms,
                picker_tls=_picker_tls(args),
                prefill_endpoint_header=args.prefill_endpoint_header,
            )
            print(text)
        except ValueError as exc:
            print(f"extproc envoy-config: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "replay":
        from extproc.sim.replay_cli import run_replay

        return run_replay(args)
    if args.command == "mock-worker":
        from extproc.sim.mock_worker import run_mock_worker

        _logging(getattr(args, "log_level", "info") or "info")
        asyncio.run(run_mock_worker(args))
        return 0
    from extproc.devstack.demo import run_demo

    _logging("warning")
    return run_demo(args)
