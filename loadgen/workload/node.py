"""Reading a workload file's mappings: every value typed, in range, and named by its key
path when it is not (`Node`), and the keys a section may hold, from its dataclass.

A `ConfigError` names the file, the key path, what is wrong and how to fix it; the CLI
turns it into exit code 1 without a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from loadgen.errors import ConfigError
from loadgen.workload.checks import number_text

T = TypeVar("T")


def file_keys(cls: type[Any], keys: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The keys a workload file may give for the section `cls` holds, in field order: each
    field's name, or for a field in `keys` the file keys it is read from (`()`: no key, the
    field is derived). So a field added to the model is a key of the file at once, and a
    test that reads every key (tests/workload/test_spec.py) finds the parser that forgot it."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = set(keys or {}) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    out = {key: None for name in names for key in (keys or {}).get(name, (name,))}
    return tuple(out)


class Node:
    """A mapping with its key path, so every error says where it happened."""

    def __init__(self, source: str, path: str, value: object) -> None:
        if not isinstance(value, Mapping):
            raise ConfigError(
                source, path or "(top level)", f"must be a mapping, got {kind_of(value)}"
            )
        self.source, self.path, self.value = source, path, value

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, problem: str, fix: str = "") -> ConfigError:
        return ConfigError(self.source, self.key(name), problem, fix)

    def allow(self, *names: str) -> None:
        """Reject keys not in `names`, suggesting the closest known key."""
        for k in self.value:
            if k not in names:
                close = difflib.get_close_matches(str(k), names, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(names)}"
                raise self.error(str(k), "unknown key", hint)

    def has(self, name: str) -> bool:
        return name in self.value

    def child(self, name: str) -> Node:
        if name not in self.value:
            raise self.error(name, "is required", f"add a '{name}:' mapping")
        return Node(self.source, self.key(name), self.value[name])

    def section(self, name: str) -> Node:
        """The mapping at `name`, or an empty one there when the file leaves it out."""
        return self.child(name) if name in self.value else Node(self.source, self.key(name), {})

    def optional(self, name: str, read: Callable[[Node], T]) -> T | None:
        """`read` of the mapping at `name`, or None when the file leaves it out."""
        return read(self.child(name)) if name in self.value else None

    def optional_string(self, name: str) -> str | None:
        """The non-empty string at `name`, or None when the file leaves it out."""
        return self.string(name) if name in self.value else None

    def string(
        self, name: str, default: str | None = None, *, choices: tuple[str, ...] = ()
    ) -> str:
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", _choices_fix(choices) or f"add '{name}: ...'")
        if not isinstance(value, str) or not value:
            raise self.error(name, f"must be a non-empty string, got {kind_of(value)}")
        if choices and value not in choices:
            raise self.error(name, f"unknown value '{value}'", _choices_fix(choices))
        return value

    def number(
        self, name: str, default: float | None = None, *, positive: bool = False,
        minimum: float = 0, maximum: float = math.inf, why: str = "",
    ) -> float:  # fmt: skip
        """A finite number in range; `why` says where `maximum` comes from."""
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", f"add '{name}: <number>'")
        self._not_quoted(name, value)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.error(name, f"must be a number, got {kind_of(value)}")
        self._in_range(name, value, minimum, maximum, why, positive=positive)
        return float(value)

    def integer(
        self, name: str, default: int | None = None, *, minimum: int = 0,
        maximum: float = math.inf, why: str = "",
    ) -> int:  # fmt: skip
        """An integer in range; a whole float (YAML `1e6`) counts as one."""
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", f"add '{name}: <integer>'")
        self._not_quoted(name, value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {kind_of(value)}")
        self._in_range(name, value, minimum, maximum, why)
        return value

    def _not_quoted(self, name: str, value: object) -> None:
        """A number written as a string (`"1e-12"`, `'40'`) gets the exact fix."""
        if isinstance(value, str) and _NUMBER.match(value.strip()):
            raise self.error(
                name, f"must be a number, got the string {value!r}",
                f"write it without quotes: {name}: {value.strip()}",
            )  # fmt: skip

    def _in_range(
        self, name: str, value: float, minimum: float, maximum: float, why: str,
        *, positive: bool = False,
    ) -> None:  # fmt: skip
        if positive and value <= 0:
            raise self.error(name, f"must be > 0 (got {number_text(value)})")
        if value < minimum:
            raise self.error(name, f"must be >= {number_text(minimum)} (got {number_text(value)})")
        if value > maximum:
            reason = f" ({why})" if why else ""
            raise self.error(
                name, f"must be <= {number_text(maximum)}{reason} (got {number_text(value)})"
            )

    def boolean(self, name: str, default: bool) -> bool:
        value = self.value.get(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {kind_of(value)}")
        return value


def kind_of(value: object) -> str:
    """What a wrong value is, for a message: `nothing`, `int 5`, `str 'x'` (at most 80)."""
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"[:80]


_NUMBER = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")


def _choices_fix(choices: tuple[str, ...]) -> str:
    return f"use one of: {', '.join(choices)}" if choices else ""


def not_a_file(node: Node, key: str, resolved: Path) -> None:
    """Refuse a path that exists but is no regular file (not "not found": it is there)."""
    if resolved.is_dir():
        raise node.error(key, f"{resolved} is a directory, not a file", "name the file in it")
    if resolved.exists() and not resolved.is_file():
        raise node.error(
            key, f"{resolved} is not a regular file (a device, FIFO or socket)",
            "give a file on disk: loadgen reads it whole, and a device never ends",
        )  # fmt: skip


def local_file(node: Node, key: str) -> str:
    """A file path relative to the workload file; it must be a regular file."""
    path = Path(node.string(key))
    resolved = path if path.is_absolute() else Path(node.source).parent / path
    not_a_file(node, key, resolved)
    if not resolved.is_file():
        raise node.error(
            key, f"file {resolved} not found", "paths are relative to the workload file"
        )
    return str(resolved)
