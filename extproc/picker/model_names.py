"""The names a request's `model` may give beside the models themselves, and what each one means:

    alias    another name the model's workers serve it under (vLLM's `--served-model-name llama
             llama-3.1`: both names are the one model; its blocks hash alike under either)
    adapter  a LoRA adapter the workers serve on top of the model, as a model of its own (vLLM's
             `--lora-modules NAME=PATH`, or loaded at run time): its blocks hash with its name

Names come from the config (`models[].aliases`, `models[].lora-adapters`: checked at start, a name
that would be two things is refused) and from the workers' model lists (`runtime.lora_discovery`),
which may change at any time. A listed name never takes over a name already taken: a model stays a
model, a configured name stays what it was configured as, and a name two models' workers list stays
with the one that listed it first (logged once, when it appears).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from extproc.config.workers import NameKind as Kind
from extproc.picker.client_ids import loggable

log = logging.getLogger("extproc.picker")

KINDS: tuple[Kind, ...] = ("alias", "adapter")


@dataclass(frozen=True, slots=True)
class ModelName:
    """What a name means: `kind` of `model`."""

    model: str
    kind: Kind

    def describe(self) -> str:
        return f"{self.model}'s {'LoRA adapter' if self.kind == 'adapter' else 'alias'}"


class ModelNames:
    """The aliases and LoRA adapters of the picker's models, configured and discovered."""

    def __init__(self, models: Iterable[str], configured: Mapping[str, tuple[str, Kind]]) -> None:
        """`configured`: name -> (model, kind), as `config.workers.other_names` checked them."""
        self._models = tuple(models)
        self._configured = {name: ModelName(model, kind) for name, (model, kind) in configured.items()}
        self._listed: dict[str, dict[Kind, frozenset[str]]] = {}  # model -> what its workers list
        self._names = dict(self._configured)

    def get(self, name: str) -> ModelName | None:
        return self._names.get(name)

    def names(self) -> list[str]:
        """Every name but the models': configured first, then as their workers listed them."""
        return list(self._names)

    def of(self, model: str, kind: Kind) -> list[str]:
        """`model`'s names of `kind`, configured or listed."""
        return [name for name, meant in self._names.items() if meant == ModelName(model, kind)]

    def set_listed(self, model: str, listed: Mapping[Kind, Iterable[str]]) -> tuple[list[str], list[str]]:
        """What `model`'s workers list now, by kind (their own model's name among the aliases is
        left out). Returns the names `model` gained and lost, of either kind."""
        before = {name for name, meant in self._names.items() if meant.model == model}
        was = self._listed.get(model, {})
        seen_before = frozenset().union(*was.values()) if was else frozenset()
        self._listed[model] = {kind: frozenset(listed.get(kind, ())) - {model} for kind in KINDS}
        names = dict(self._configured)
        for owner, lists in self._listed.items():
            for kind in KINDS:
                meant = ModelName(owner, kind)
                for name in sorted(lists[kind]):
                    if name not in self._models and names.get(name, meant) == meant:
                        names[name] = meant
                    elif owner == model and name not in seen_before:  # once, as it appears
                        what = "a model" if name in self._models else names[name].describe()
                        as_what = "a LoRA adapter" if kind == "adapter" else "an alias"
                        log.warning("workers of %s list %s as %s, already %s: not theirs here",
                                    model, loggable(name), as_what, what)  # fmt: skip
        self._names = names
        after = {name for name, meant in names.items() if meant.model == model}
        return sorted(after - before), sorted(before - after)
