"""Checks that Envoy Gateway's policies make Envoy honour the picker (code `envoy`, and `ref`/`port`).

An EnvoyExtensionPolicy must reach a picker and configure ext_proc as the picker needs it
(extproc/devstack/envoy/README.md): request headers and a Buffered or FullDuplexStreamed body, response
processing for the request lifecycle, an explicit message timeout, and `envoy.lb` among the
writable metadata namespaces (else Envoy drops the destination). A route it puts the picker on
whose backend is a plain Service must be redirected by an EnvoyPatchPolicy to an ORIGINAL_DST
cluster keyed on the `envoy.lb` / `x-gateway-destination-endpoint` metadata (not on the header, which
a client can forge); otherwise Envoy balances the requests itself and the picker's choice is lost.
xDS names in the patches must be those Envoy Gateway generates for the targeted Gateway:
`<namespace>/<gateway>/<listener>` and `httproute/<namespace>/<route>/...`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.k8s.manifests import Manifests, Obj, Picker, Problem, where

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
DESTINATION_METADATA = {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}
REQUEST_BODY_MODES = {"Buffered", "FullDuplexStreamed"}


def check_envoy_gateway(
    m: Manifests,
    by_deployment: dict[str, Picker],
    problems: list[Problem],
    *,
    picker_behind: Callable[..., object],
) -> None:
    redirected: set[str] = set()  # HTTPRoute names whose requests go to a picker-keyed ORIGINAL_DST cluster
    for policy in m.of_kind("EnvoyPatchPolicy"):
        redirected |= _check_patch_policy(m, policy, problems)
    for policy in m.of_kind("EnvoyExtensionPolicy"):
        _check_extension_policy(m, policy, by_deployment, redirected, problems, picker_behind)


def _targets(policy: Obj) -> list[Obj]:
    spec = policy["spec"]
    return [*([spec["targetRef"]] if "targetRef" in spec else []), *spec.get("targetRefs", [])]


def _check_extension_policy(
    m: Manifests,
    policy: Obj,
    by_deployment: dict[str, Picker],
    redirected: set[str],
    problems: list[Problem],
    picker_behind: Callable[..., object],
) -> None:
    def bad(code: str, message: str) -> None:
        problems.append(Problem(code, where(policy), message))

    for target in _targets(policy):
        obj = m.get(target["kind"], target["name"])
        if obj is None:
            bad("ref", f"targets a missing {target['kind']} {target['name']}")
        elif (
            target["kind"] == "HTTPRoute"
            and target["name"] not in redirected
            and _plain_service_backends(obj)
        ):
            bad(
                "envoy",
                f"HTTPRoute {target['name']} goes to a Service that Envoy balances itself: no "
                "EnvoyPatchPolicy points it at the picker's ORIGINAL_DST cluster",
            )
    for i, ext_proc in enumerate(policy["spec"].get("extProc", [])):
        for backend in ext_proc.get("backendRefs", []):
            if backend.get("kind", "Service") == "Service" and backend.get("group", "") == "":
                picker_behind(m, backend["name"], backend.get("port"), by_deployment, policy, problems)
        mode = ext_proc.get("processingMode", {})
        if mode.get("request", {}).get("body") not in REQUEST_BODY_MODES:
            bad(
                "envoy",
                f"extProc[{i}]: the picker needs the request body (processingMode.request.body "
                f"{' or '.join(sorted(REQUEST_BODY_MODES))})",
            )
        if "response" not in mode:
            bad(
                "envoy",
                f"extProc[{i}]: without processingMode.response the picker never sees a response "
                "(first token, end of stream) and its load picture drifts",
            )
        if "messageTimeout" not in ext_proc:
            bad("envoy", f"extProc[{i}]: no messageTimeout (Envoy's 200 ms default is too short)")
        if "envoy.lb" not in ext_proc.get("metadata", {}).get("writableNamespaces", []):
            bad(
                "envoy",
                f"extProc[{i}]: envoy.lb is not a writable metadata namespace: Envoy drops the "
                "picker's destination",
            )


def _plain_service_backends(route: Obj) -> bool:
    return any(
        b.get("kind", "Service") == "Service" and b.get("group", "") == ""
        for rule in route["spec"].get("rules", [])
        for b in rule.get("backendRefs", [])
    )


def _check_patch_policy(m: Manifests, policy: Obj, problems: list[Problem]) -> set[str]:
    def bad(code: str, message: str) -> None:
        problems.append(Problem(code, where(policy), message))

    target = policy["spec"]["targetRef"]
    gateway = m.get("Gateway", target["name"]) if target["kind"] == "Gateway" else None
    if gateway is None:
        bad("ref", f"targets a missing {target['kind']} {target['name']}")
        return set()
    namespace = policy["metadata"].get("namespace")
    listeners = {listener["name"] for listener in gateway["spec"]["listeners"]}
    added: set[str] = set()
    redirected: set[str] = set()
    patches = policy["spec"].get("jsonPatches", [])
    for patch in patches:
        operation = patch["operation"]
        adds_cluster = patch["type"] == CLUSTER and operation["op"] == "add" and operation.get("path") == ""
        if adds_cluster and _check_cluster(patch, bad):
            added.add(patch["name"])
    for patch in patches:
        operation, name = patch["operation"], patch["name"]
        if patch["type"] in (LISTENER, ROUTE_CONFIGURATION):
            ns, _, rest = name.partition("/")
            gw, _, listener = rest.partition("/")
            if (
                (namespace and ns != namespace)
                or gw != gateway["metadata"]["name"]
                or listener not in listeners
            ):
                bad(
                    "envoy",
                    f"{name}: Envoy Gateway names this listener's xDS {namespace or '<namespace>'}/"
                    f"{gateway['metadata']['name']}/<one of {sorted(listeners)}>",
                )
        if patch["type"] == ROUTE_CONFIGURATION and operation["op"] in ("replace", "add"):
            value = operation.get("value")
            if isinstance(value, str) and operation.get("jsonPath", "").endswith(".cluster"):
                if value not in added:
                    bad("envoy", f"{name}: routes to cluster {value!r}, which this policy does not add")
                redirected |= _routes_named(m, policy, operation["jsonPath"], gateway, bad)
    return redirected


def _check_cluster(patch: Obj, bad: Callable[[str, str], None]) -> bool:
    cluster = patch["operation"].get("value") or {}
    if cluster.get("name") != patch["name"]:
        bad("envoy", f"cluster {cluster.get('name')!r} added under the name {patch['name']!r}")
    if cluster.get("type") != "ORIGINAL_DST" or cluster.get("lb_policy") != "CLUSTER_PROVIDED":
        bad("envoy", f"cluster {patch['name']}: needs type ORIGINAL_DST with lb_policy CLUSTER_PROVIDED")
        return False
    config = cluster.get("original_dst_lb_config", {})
    if config.get("use_http_header"):
        bad(
            "envoy",
            f"cluster {patch['name']}: keyed on a request header, which a client can set itself; "
            "key it on the envoy.lb metadata (metadata_key)",
        )
        return False
    if config.get("metadata_key") != DESTINATION_METADATA:
        bad("envoy", f"cluster {patch['name']}: metadata_key must be {DESTINATION_METADATA}")
        return False
    return True


def _routes_named(
    m: Manifests, policy: Obj, json_path: str, gateway: Obj, bad: Callable[[str, str], None]
) -> set[str]:
    found = set()
    namespace = policy["metadata"].get("namespace")
    named = re.findall(r"httproute/([^/]+)/([^/]+)/", json_path)
    if not named:
        bad("envoy", f"jsonPath {json_path!r} names no httproute/<namespace>/<name>/ route")
    for ns, name in named:
        route = m.get("HTTPRoute", name)
        if route is None or (namespace and ns != namespace):
            bad(
                "envoy", f"jsonPath {json_path!r} names routes of HTTPRoute {ns}/{name}, which does not exist"
            )
            continue
        if not any(p["name"] == gateway["metadata"]["name"] for p in route["spec"].get("parentRefs", [])):
            bad("envoy", f"HTTPRoute {name} is not attached to Gateway {gateway['metadata']['name']}")
        found.add(name)
    return found
