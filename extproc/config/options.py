"""The setting machinery every config section shares: one `Option` declaration and its one reading rule.

An `Option` is one setting: its flag (and alias spellings), its environment variables, its config-file
keys, its type, default, choices and --help text. `Reader.read` applies the precedence, the same for
every section:

    command-line flag > environment (DYN_<FLAG> for each spelling, then the option's env aliases)
                      > the section's key in the config file (each spelling, kebab- or snake_case)
                      > default

A flag left at None counts as not given, so `--admin-port none` falls through to the environment.
Flags are converted by argparse (`type=kind`, `choices`); environment and file values by `convert`,
whose messages name the variable or key, the value and what is accepted. This module owns no setting;
the section modules beside it (router.py, events.py, ...) declare theirs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class ConfigError(ValueError):
    """The configuration is unusable; the message names the setting, the value and what is accepted."""


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    """One setting of `serve`: where it is read from, its type, default and --help text.

    `kind` converts text (a flag, an environment value, a file value) to the setting's type; `bool`
    makes an on/off flag with a `--no-` form. A bool option whose default is None means "auto" (the
    section decides). `dest` is argparse's attribute and the help's metavar; by default the flag's
    name in snake_case.
    """

    flag: str
    kind: Callable[[Any], T]  # a flag's or variable's text, or a YAML scalar
    default: T
    help: str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # more spellings: flags, DYN_ variables and file keys like `flag`
    cli_aliases: tuple[str, ...] = ()  # more flags only (neither environment nor file)
    env_aliases: tuple[str, ...] = ()  # more environment variables, read after the DYN_ ones
    dest: str = ""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.flag.lstrip("-").replace("-", "_"))

    @property
    def is_switch(self) -> bool:
        return self.kind is bool

    @property
    def flags(self) -> tuple[str, ...]:
        """The spellings read from flags, the environment and the file (`cli_aliases` excluded)."""
        return (self.flag, *self.aliases)

    @property
    def env_names(self) -> tuple[str, ...]:
        """Environment variables, first found wins: DYN_<FLAG> of each spelling, then `env_aliases`."""
        derived = tuple("DYN_" + f.lstrip("-").upper().replace("-", "_") for f in self.flags)
        return derived + self.env_aliases

    @property
    def file_keys(self) -> tuple[str, ...]:
        """Config-file keys, first found wins: each spelling without dashes, kebab-case then snake_case."""
        keys: list[str] = []
        for flag in self.flags:
            key = flag.lstrip("-")
            keys += [key, key.replace("-", "_")]
        return tuple(keys)


def _float_or_none(text: str | float) -> float | None:
    """A number, or None for '', 'none' or 'null' (an optional setting left unset)."""
    if isinstance(text, str) and text.lower() in ("", "none", "null"):
        return None
    return float(text)


def _int_or_none(text: str | float) -> int | None:
    """An integer, or None for '', 'none' or 'null'; a float with a fraction is refused."""
    if isinstance(text, str) and text.lower() in ("", "none", "null"):
        return None
    if isinstance(text, float) and not text.is_integer():
        raise ValueError(f"{text!r} is not an integer")
    return int(text)


def add_options(
    group: argparse._ActionsContainer, options: Sequence[Option[Any]], *, skip: Sequence[str] = ()
) -> None:
    """Add `options` as flags (None default: `Reader.read` resolves env, file and defaults);
    `skip` names dests to leave out."""
    for opt in options:
        if opt.dest in skip:
            continue
        flags = [*opt.flags, *opt.cli_aliases]
        default_text = "auto" if opt.default is None and opt.is_switch else opt.default
        help_text = f"{opt.help} (default: {default_text})"
        if opt.is_switch:
            group.add_argument(
                *flags, dest=opt.dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            group.add_argument(
                *flags, dest=opt.dest, default=None, choices=opt.choices, type=opt.kind, help=help_text
            )


def parse_bool(name: str, text: object) -> bool:
    """true/false, 1/0, yes/no, on/off (any case) from the environment or the file."""
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {name}={text!r}: expected true or false")


def convert(opt: Option[T], name: str, raw: Any) -> T:
    """`raw` (an environment string or a YAML value found under `name`) as `opt`'s type.

    A YAML null means unset (the default), except for on/off options, which want true or false.
    """
    if opt.is_switch:
        return cast(T, raw if isinstance(raw, bool) else parse_bool(name, raw))
    if raw is None:
        return opt.default
    try:
        value = opt.kind(str(raw)) if not isinstance(raw, int | float) or opt.kind is str else opt.kind(raw)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"invalid {name}={raw!r}: expected {getattr(opt.kind, '__name__', 'a value')}"
        ) from None
    if opt.choices and value not in opt.choices:
        raise ConfigError(f"invalid {name}={raw!r}: expected one of {', '.join(opt.choices)}")
    return value


@dataclass(frozen=True, slots=True)
class Reader:
    """The three places one section's settings come from: parsed flags, the environment, the file section."""

    args: argparse.Namespace
    environ: Mapping[str, str]
    section: Mapping[str, Any]

    def source(self, opt: Option[Any]) -> str | None:
        """Where `opt` is set, by the reading rule: its flag, the environment variable or the file key
        (`--router-ttl-secs`, `DYN_ROUTER_TTL`, `router-ttl`); None when it is left at its default."""
        if getattr(self.args, opt.dest, None) is not None:
            return opt.flag
        for env in opt.env_names:
            if env in self.environ:
                return env
        for key in opt.file_keys:
            if key in self.section:
                return key
        return None

    def read(self, opt: Option[T]) -> T:
        """`opt`'s value: flag > environment > file > default. Raises ConfigError for a bad value."""
        flag_value = getattr(self.args, opt.dest, None)
        if flag_value is not None:
            return cast(T, flag_value)
        for env in opt.env_names:
            if env in self.environ:
                return convert(opt, env, self.environ[env])
        for key in opt.file_keys:
            if key in self.section:
                return convert(opt, key, self.section[key])
        return opt.default


def snake_keys(mapping: Mapping[Any, Any]) -> dict[str, Any]:
    """A file list item's keys in snake_case (`dp-size` and `dp_size` alike)."""
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}


# Checks shared by the sections; each message names the setting by its flag without dashes.


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"invalid {name}={value}: expected > 0")


def check_at_least_zero(name: str, value: float) -> None:
    if value < 0:  # NaN passes, as it always has
        raise ConfigError(f"invalid {name}={value}: expected >= 0")


def check_readable(opt: Option[str | None], path: str | None) -> None:
    """A file setting, when set, must name a readable file: said at start, not at the first handshake."""
    if path is None:
        return
    try:
        readable = os.access(path, os.R_OK)
    except ValueError:  # a NUL or a lone surrogate: no file has that name
        readable = False
    if not readable:
        what = "not found" if not os.path.exists(path) else "not readable"
        raise ConfigError(f"invalid {opt.flag.lstrip('-')}={path!r}: file {what}")


def check_pair(cert: Option[Any], cert_value: object, key: Option[Any], key_value: object) -> None:
    """Two settings that go together (a certificate and its key; a user and its password)."""
    if (cert_value is None) != (key_value is None):
        raise ConfigError(f"{cert.flag} and {key.flag} go together: give both")
