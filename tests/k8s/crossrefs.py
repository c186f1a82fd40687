"""Cross-object checks: what each object names exists, and the pieces agree with each other.

Codes of the problems found:
- ref: a named object, key or port does not exist (ConfigMap, ServiceAccount, Service, Gateway,
  InferencePool, listener, a group's address, a discovery or tokenizer Service);
- port: numbers disagree (Service port vs targetPort vs containerPort vs the port the picker
  listens on; the InferencePool's endpointPickerRef; discovery port vs the pool's targetPorts);
- selector: a selector matches nothing, matches another Deployment's pods, a picker Service selects
  more than one picker, or the picker discovers other pods than its InferencePool holds;
- probe: readiness/liveness probes that do not ask the picker's gRPC health port and services;
- config: the router config does not load (extproc.config.load_config with the pod's arguments and
  environment), the picker listens on loopback only, reload cannot see ConfigMap updates, a
  discovery Service is not headless, or mock workers disagree with the picker (model, block size,
  KV event ports);
- rbac: the picker's ServiceAccount gets an API token or a Role it does not need.
Envoy Gateway's policies are checked in `envoy_gateway.py`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from extproc.runtime.server import HEALTH_SERVICES
from tests.k8s.envoy_gateway import check_envoy_gateway
from tests.k8s.manifests import (
    Manifests,
    MockWorker,
    Obj,
    Picker,
    Problem,
    find_mock_workers,
    find_pickers,
    pod_spec,
    selects,
    template_labels,
    where,
)


def cross_check(objects: list[Obj], *, workers_included: bool) -> list[Problem]:
    """Every cross-object problem in a rendered set. `workers_included`: the model servers are part
    of the set (the demo), so pools and worker Services must select them."""
    m = Manifests(objects)
    problems: list[Problem] = []
    pickers = find_pickers(m, problems)
    by_deployment = {p.name: p for p in pickers}
    for deployment in m.of_kind("Deployment"):
        _check_deployment(m, deployment, problems)
    for service in m.of_kind("Service"):
        _check_service(m, service, by_deployment, workers_included, problems)
    for picker in pickers:
        _check_picker(m, picker, by_deployment, problems)
    for pool in m.of_kind("InferencePool"):
        _check_pool(m, pool, by_deployment, workers_included, problems)
    for route in m.of_kind("HTTPRoute"):
        _check_route(m, route, problems)
    _check_mock_workers(find_mock_workers(m), pickers, problems)
    check_envoy_gateway(m, by_deployment, problems, picker_behind=picker_behind)
    return problems


def picker_behind(
    m: Manifests,
    service_name: str,
    port: int,
    by_deployment: dict[str, Picker],
    who: Obj,
    problems: list[Problem],
) -> Picker | None:
    """The picker that `service_name:port` reaches, checking the port chain up to the picker's --port."""
    service = m.get("Service", service_name)
    if service is None:
        problems.append(Problem("ref", where(who), f"no Service {service_name}"))
        return None
    service_port = next((p for p in service["spec"].get("ports", []) if p["port"] == port), None)
    if service_port is None:
        problems.append(Problem("port", where(who), f"Service {service_name} has no port {port}"))
        return None
    selected = m.deployments_selected_by(service["spec"].get("selector"))
    pickers = [
        by_deployment[d["metadata"]["name"]] for d in selected if d["metadata"]["name"] in by_deployment
    ]
    if len(pickers) != 1 or len(selected) != 1:
        if selected:  # selecting nothing is reported with the Service itself
            problems.append(Problem("ref", where(who), f"Service {service_name} is not one endpoint picker"))
        return None
    picker = pickers[0]
    target = m.target_port(service_port, picker.deployment)
    if picker.config is not None and target != picker.config.port:
        problems.append(
            Problem(
                "port",
                where(who),
                f"{service_name}:{port} reaches container port {target}, but the "
                f"picker's ext_proc listens on {picker.config.port}",
            )
        )
    return picker


def _check_deployment(m: Manifests, deployment: Obj, problems: list[Problem]) -> None:
    selector = deployment["spec"]["selector"].get("matchLabels")
    if not selects(selector, template_labels(deployment)):
        problems.append(
            Problem("selector", where(deployment), "selector does not match its own pod template")
        )
    for other in m.of_kind("Deployment"):
        if other is not deployment and selects(selector, template_labels(other)):
            problems.append(
                Problem("selector", where(deployment), f"selector also matches the pods of {where(other)}")
            )
    spec = pod_spec(deployment)
    if "serviceAccountName" in spec and m.get("ServiceAccount", spec["serviceAccountName"]) is None:
        problems.append(Problem("ref", where(deployment), f"no ServiceAccount {spec['serviceAccountName']}"))
    for volume in spec.get("volumes", []):
        source = volume.get("configMap")
        if source and not source.get("optional") and m.get("ConfigMap", source["name"]) is None:
            problems.append(Problem("ref", where(deployment), f"no ConfigMap {source['name']}"))


def _check_service(
    m: Manifests,
    service: Obj,
    by_deployment: dict[str, Picker],
    workers_included: bool,
    problems: list[Problem],
) -> None:
    selector = service["spec"].get("selector")
    selected = m.deployments_selected_by(selector)
    headless = service["spec"].get("clusterIP") == "None"
    if not selected:
        if workers_included or not headless:  # a headless worker Service may select pods defined elsewhere
            problems.append(
                Problem("selector", where(service), f"selector {selector} matches no pod template")
            )
        return
    if any(d["metadata"]["name"] in by_deployment for d in selected) and len(selected) != 1:
        names = ", ".join(d["metadata"]["name"] for d in selected)
        problems.append(
            Problem("selector", where(service), f"selects the pods of several Deployments: {names}")
        )
    for port in service["spec"].get("ports", []):
        for deployment in selected:
            if m.target_port(port, deployment) is None:
                problems.append(
                    Problem(
                        "port",
                        where(service),
                        f"port {port['port']} targets {port.get('targetPort')}, "
                        f"which the pods of {where(deployment)} do not expose",
                    )
                )


def _check_picker(
    m: Manifests, picker: Picker, by_deployment: dict[str, Picker], problems: list[Problem]
) -> None:
    config, dep = picker.config, picker.deployment
    ports = {p["containerPort"] for p in picker.container.get("ports", [])}
    named = {p["name"]: p["containerPort"] for p in picker.container.get("ports", []) if "name" in p}
    _check_rbac(m, dep, problems)
    if config is None:
        return
    if config.host not in ("0.0.0.0", "::"):
        problems.append(Problem("config", where(dep), f"ext_proc listens on {config.host} only: unreachable"))
    wanted = {"ext_proc": config.port, "health": config.health_port}
    if config.admin_port is not None:
        wanted["admin"] = config.admin_port
    if config.groups.api_port is not None:
        wanted["group API"] = config.groups.api_port
    for what, port in wanted.items():
        if port not in ports:
            problems.append(
                Problem("port", where(dep), f"the picker's {what} port {port} is no containerPort")
            )
    for probe_name, service in (("readinessProbe", "readiness"), ("livenessProbe", "liveness")):
        grpc = picker.container.get(probe_name, {}).get("grpc")
        if grpc is None:
            problems.append(Problem("probe", where(dep), f"no gRPC {probe_name}"))
            continue
        port = named.get(grpc["port"]) if isinstance(grpc["port"], str) else grpc["port"]
        if port != config.health_port or grpc.get("service", "") not in HEALTH_SERVICES:
            problems.append(
                Problem(
                    "probe",
                    where(dep),
                    f"{probe_name} asks {grpc}, the picker's health answers on "
                    f"{config.health_port} for {', '.join(repr(s) for s in HEALTH_SERVICES)}",
                )
            )
        elif grpc.get("service") != service:
            problems.append(Problem("probe", where(dep), f"{probe_name} should ask the {service!r} service"))
    if config.discovery.reload_config and picker.config_mount and picker.config_mount.get("subPath"):
        problems.append(Problem("config", where(dep), "--reload-config with a subPath mount: never updated"))
    if config.discovery.dns_name:
        _check_discovery_service(m, picker, problems)
    for url in {config.tokenize_url, *(model.tokenize_url for model in config.models)} - {None, "worker"}:
        parts = urlsplit(url)
        host = _service_name(parts.hostname or "")
        if host and parts.port and not _service_has_port(m, host, parts.port):
            problems.append(
                Problem("ref", where(dep), f"tokenize-url {url}: no Service {host} with that port")
            )
    for group in config.groups.groups:
        if group.address is not None:
            _check_group_address(m, picker, group.name, group.address, by_deployment, problems)


def _service_name(host: str) -> str | None:
    """The Service a cluster DNS name names (`svc`, `svc.ns`, `svc.ns.svc.cluster.local`), else None."""
    labels = host.rstrip(".").split(".")
    if len(labels) == 1 or (len(labels) >= 3 and labels[2] == "svc") or len(labels) == 2:
        return labels[0]
    return None


def _service_has_port(m: Manifests, name: str, port: int) -> bool:
    service = m.get("Service", name)
    return service is not None and any(p["port"] == port for p in service["spec"].get("ports", []))


def _check_discovery_service(m: Manifests, picker: Picker, problems: list[Problem]) -> None:
    assert picker.config is not None
    discovery, dep = picker.config.discovery, picker.deployment
    name = _service_name(discovery.dns_name or "")
    service = m.get("Service", name) if name else None
    if service is None:
        problems.append(Problem("ref", where(dep), f"--discovery-dns {discovery.dns_name}: no such Service"))
        return
    if service["spec"].get("clusterIP") != "None":
        problems.append(
            Problem(
                "config",
                where(dep),
                f"discovery Service {name} is not headless: its DNS name is one virtual IP, not the pods",
            )
        )
    targets = {p.get("targetPort", p["port"]) for p in service["spec"].get("ports", [])}
    if discovery.dns_port not in targets:
        problems.append(
            Problem(
                "port",
                where(dep),
                f"--discovery-port {discovery.dns_port} is not a port of Service {name} "
                f"({sorted(targets, key=str)})",
            )
        )


def _check_group_address(
    m: Manifests,
    picker: Picker,
    group: str,
    address: str,
    by_deployment: dict[str, Picker],
    problems: list[Problem],
) -> None:
    host, _, port_text = address.rpartition(":")
    name = _service_name(host)
    service = m.get("Service", name) if name else None
    dep = picker.deployment
    if service is None or not port_text.isdigit():
        problems.append(Problem("ref", where(dep), f"group {group} at {address}: no such Service"))
        return
    port = next((p for p in service["spec"].get("ports", []) if p["port"] == int(port_text)), None)
    if port is None:
        problems.append(
            Problem("ref", where(dep), f"group {group} at {address}: Service {name} has no such port")
        )
        return
    targets = [
        by_deployment.get(d["metadata"]["name"])
        for d in m.deployments_selected_by(service["spec"]["selector"])
    ]
    group_pickers = [t for t in targets if t is not None and t.config is not None]
    if len(group_pickers) != 1:
        problems.append(Problem("ref", where(dep), f"group {group} at {address}: not one picker behind it"))
        return
    target, api_port = group_pickers[0], group_pickers[0].config.groups.api_port  # type: ignore[union-attr]
    if api_port is None or m.target_port(port, target.deployment) != api_port:
        problems.append(
            Problem(
                "port",
                where(dep),
                f"group {group} at {address} reaches {where(target.deployment)}, whose "
                f"group API port is {api_port}",
            )
        )


def _check_rbac(m: Manifests, deployment: Obj, problems: list[Problem]) -> None:
    spec = pod_spec(deployment)
    name = spec.get("serviceAccountName", "default")
    account = m.get("ServiceAccount", name) or {}
    if spec.get("automountServiceAccountToken", account.get("automountServiceAccountToken", True)):
        problems.append(Problem("rbac", where(deployment), "an API token is mounted; the picker needs none"))
    for binding in [*m.of_kind("RoleBinding"), *m.of_kind("ClusterRoleBinding")]:
        if any(
            s.get("kind") == "ServiceAccount" and s.get("name") == name for s in binding.get("subjects", [])
        ):
            problems.append(Problem("rbac", where(binding), f"grants {name} a role; the picker needs none"))


def _check_pool(
    m: Manifests, pool: Obj, by_deployment: dict[str, Picker], workers_included: bool, problems: list[Problem]
) -> None:
    spec = pool["spec"]
    ref = spec.get("endpointPickerRef", {})
    port = ref.get("port", {}).get("number")
    picker = None
    if ref.get("kind", "Service") == "Service" and ref.get("group", "") == "" and port is not None:
        picker = picker_behind(m, ref["name"], port, by_deployment, pool, problems)
    selector = spec.get("selector", {}).get("matchLabels")
    target_ports = {p["number"] for p in spec.get("targetPorts", [])}
    if workers_included:
        workers = m.deployments_selected_by(selector)
        if not workers:
            problems.append(Problem("selector", where(pool), f"selector {selector} matches no model server"))
        for worker in workers:
            exposed = {p["containerPort"] for c in pod_spec(worker)["containers"] for p in c.get("ports", [])}
            if not target_ports <= exposed:
                problems.append(
                    Problem(
                        "port", where(pool), f"targetPorts {sorted(target_ports)} not all on {where(worker)}"
                    )
                )
    if picker is None or picker.config is None or not picker.config.discovery.dns_name:
        return
    discovery = picker.config.discovery
    service = m.get("Service", _service_name(discovery.dns_name or "") or "")
    if service is not None and service["spec"].get("selector") != selector:
        problems.append(
            Problem(
                "selector",
                where(pool),
                f"its picker discovers {where(service)} selecting "
                f"{service['spec'].get('selector')}, not the pool's {selector}",
            )
        )
    if discovery.dns_port not in target_ports:
        problems.append(
            Problem(
                "port",
                where(pool),
                f"its picker routes to port {discovery.dns_port}, not in targetPorts {sorted(target_ports)}",
            )
        )


def _check_route(m: Manifests, route: Obj, problems: list[Problem]) -> None:
    for parent in route["spec"].get("parentRefs", []):
        if parent.get("kind", "Gateway") != "Gateway":
            continue
        gateway = m.get("Gateway", parent["name"])
        if gateway is None:
            problems.append(Problem("ref", where(route), f"no Gateway {parent['name']}"))
        elif "sectionName" in parent and parent["sectionName"] not in {
            listener["name"] for listener in gateway["spec"]["listeners"]
        }:
            problems.append(
                Problem("ref", where(route), f"Gateway {parent['name']} has no {parent['sectionName']}")
            )
    for rule in route["spec"].get("rules", []):
        for backend in rule.get("backendRefs", []):
            kind, group = backend.get("kind", "Service"), backend.get("group", "")
            if kind == "InferencePool" and group == "inference.networking.k8s.io":
                if m.get("InferencePool", backend["name"]) is None:
                    problems.append(Problem("ref", where(route), f"no InferencePool {backend['name']}"))
            elif (
                kind == "Service"
                and group == ""
                and not _service_has_port(m, backend["name"], backend.get("port"))
            ):
                problems.append(
                    Problem("ref", where(route), f"no Service {backend['name']}:{backend.get('port')}")
                )


def _check_mock_workers(workers: list[MockWorker], pickers: list[Picker], problems: list[Problem]) -> None:
    for worker in workers:
        args, dep = worker.args, worker.deployment
        if args.host not in ("0.0.0.0", "::"):
            problems.append(Problem("config", where(dep), f"mock worker listens on {args.host} only"))
        for picker in pickers:
            config = picker.config
            if config is None or not config.discovery.dns_name:
                continue
            models = {model.name for model in config.models}
            if args.model not in models:
                problems.append(
                    Problem(
                        "config",
                        where(dep),
                        f"serves {args.model!r}, picker {picker.name} routes {sorted(models)}",
                    )
                )
            if args.block_size != config.router.block_size:
                problems.append(
                    Problem(
                        "config",
                        where(dep),
                        f"block size {args.block_size}, picker "
                        f"{picker.name} hashes {config.router.block_size}-token blocks",
                    )
                )
            events = config.events
            published = (args.kv_events_port, args.kv_replay_port)
            subscribed = (events.kv_events_port, events.kv_replay_port)
            if config.router.use_kv_events and args.kv_events == "zmq" and published != subscribed:
                problems.append(
                    Problem(
                        "config",
                        where(dep),
                        f"KV events on ports {published}, picker {picker.name} subscribes to {subscribed}",
                    )
                )
