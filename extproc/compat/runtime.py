"""`DistributedRuntime` and its endpoint path: where a `KvPushRouter` finds its workers.

Dynamo's runtime discovers the workers registered under namespace / component / endpoint (etcd or
Kubernetes). Here the workers come from the picker's own configuration, exactly as `serve` reads it:
the file named by `DYN_CONFIG` (its `workers:` and `models:` lists, `events:` for KV events), or a
`PickerConfig` given to `detached(config=...)`. The endpoint path names the model: its component
when that is a configured model's name, else the only model configured. No etcd, NATS or process
lease is involved: `detached()` only reads the configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from extproc.config import PickerConfig, load_config


class DistributedRuntime:
    """The configuration routers are made from. `detached()` as in Dynamo's guide."""

    def __init__(self, config: PickerConfig) -> None:
        self.config = config

    @classmethod
    def detached(
        cls, *, config: PickerConfig | None = None, environ: Mapping[str, str] | None = None
    ) -> DistributedRuntime:
        """The runtime over `config`, else over `serve`'s configuration read from `environ`
        (default `os.environ`; the workers come from the file `DYN_CONFIG` names).

        Raises ConfigError (a ValueError) when that configuration is unusable or names no worker.
        """
        if config is None:
            config = load_config([], environ=os.environ if environ is None else environ)
        if not config.workers:
            raise ValueError(
                "no workers: name a config file with a workers: list in DYN_CONFIG, "
                "or pass DistributedRuntime.detached(config=PickerConfig(...))"
            )
        return cls(config)

    def namespace(self, name: str) -> Namespace:
        return Namespace(self, name)

    def endpoint(self, path: str) -> Endpoint:
        """Dynamo 1.6.1's spelling: `"namespace.component.endpoint"` (a `dyn://` prefix is allowed)."""
        parts = path.removeprefix("dyn://").split(".")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"endpoint path {path!r}: expected namespace.component.endpoint")
        return Endpoint(self, *parts)

    def shutdown(self) -> None:
        """Nothing to stop: routers are closed with `KvPushRouter.close()`."""


@dataclass(frozen=True, slots=True)
class Namespace:
    runtime: DistributedRuntime
    name: str

    def component(self, name: str) -> Component:
        return Component(self.runtime, self.name, name)


@dataclass(frozen=True, slots=True)
class Component:
    runtime: DistributedRuntime
    namespace: str
    name: str

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(self.runtime, self.namespace, self.name, name)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """namespace/component/endpoint over the runtime's configuration."""

    runtime: DistributedRuntime
    namespace: str
    component: str
    name: str

    @property
    def model(self) -> str:
        """The configured model whose workers serve this endpoint (see the module docstring).

        Raises ValueError when the component names no model and several are configured.
        """
        models = sorted(m.name for m in self.runtime.config.models)
        if self.component in models:
            return self.component
        if len(models) == 1:
            return models[0]
        raise ValueError(
            f"component {self.component!r} is not a configured model and several are ({', '.join(models)}): "
            "name the model as the component"
        )

    def __str__(self) -> str:
        return f"{self.namespace}.{self.component}.{self.name}"
