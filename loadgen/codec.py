"""Frozen dataclasses ↔ JSON: the one codec of loadgen's documents.

summary.json and run.json are frozen dataclasses in memory (`results.summary`,
`results.runfolder.RunInfo`) and JSON only on disk; the workload spec run.json stores is
rebuilt with it too (`workload.identity.spec_from_resolved`). It imports nothing of
loadgen, so every package may use it. `to_json` walks a document's fields in
their declared order, so the order of a dataclass's fields is the order of its JSON keys;
nested dataclasses, mappings and tuples become objects and arrays, everything else is
written as it is (ints stay ints, floats floats). A field whose metadata is `OMIT_NONE` is
left out while it is None (a block only some runs have); `omitted_when(rule)` leaves a field
out by a rule on its whole document.

`from_json` is the inverse, by the fields' annotations: a key missing from the JSON takes
the field's default (older files lack newer keys), a field without a default is required,
keys the document does not know are ignored; `tuple[X, ...]` is an array of X, a
fixed `tuple[X, Y]` an array of exactly those; an `int` is a 64-bit integer and a `float` a
finite number (`INT64`). A malformed document raises ValueError with the dotted path of what
is wrong; the run folder turns it into a LoadgenError.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
OmitRule = Callable[[Any, Any], bool]  # (document, value) -> leave the field out
OMIT = "omit"
_HINTS: dict[type, dict[str, Any]] = {}  # a document class's resolved annotations
# An `int` field holds a 64-bit integer and a `float` field a finite number below 2**63 in
# size: what loadgen writes (`allow_nan=False`) and what every figure, clock and Parquet
# column can hold. A damaged file's 2**70, 1e300 or Infinity is a ValueError naming it.
INT64 = 2**63


def omitted_when(rule: OmitRule) -> dict[str, OmitRule]:
    """Field metadata: leave the field out of the JSON when rule(document, value) holds."""
    return {OMIT: rule}


OMIT_NONE = omitted_when(lambda _document, value: value is None)


def to_json(document: Any) -> dict[str, Any]:
    """A dataclass instance as a JSON-ready dict, keys in field order (see the module)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(document):
        value = getattr(document, f.name)
        rule = f.metadata.get(OMIT)
        if rule is None or not rule(document, value):
            out[f.name] = _value(value)
    return out


def _value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, Mapping):
        return {key: _value(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_value(item) for item in value]
    return value


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """The `cls` document that `data` (parsed JSON) holds; ValueError naming the bad key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where.rstrip('.') or 'the document'} is not an object")
    hints = _HINTS.get(cls) or _HINTS.setdefault(cls, typing.get_type_hints(cls))
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # cls is a dataclass
        if f.name in data:
            values[f.name] = _parse(hints[f.name], data[f.name], f"{where}{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}{f.name} is missing")
    return cls(**values)


def _parse(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        kinds = [a for a in args if a is not type(None)]
        return _parse(kinds[0], value, where) if len(kinds) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value, f"{where}.")  # type: ignore[arg-type]  # a class here
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} is not an object")
        return {key: _parse(args[1], item, f"{where}.{key}") for key, item in value.items()}
    if origin is tuple:
        return _tuple(args, value, where)
    if hint is int and (type(value) is not int or not -INT64 <= value < INT64):
        raise ValueError(f"{where} is not a 64-bit integer (got {value!r:.40})")
    if hint is float and (
        type(value) not in (int, float) or not math.isfinite(value) or abs(value) >= INT64
    ):
        raise ValueError(f"{where} is not a finite number (got {value!r:.40})")
    return value


def _tuple(args: tuple[Any, ...], value: Any, where: str) -> tuple[Any, ...]:
    """`tuple[X, ...]`: an array of X; `tuple[X, Y]`: an array of exactly an X and a Y."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where} is not an array")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_parse(args[0], item, f"{where}[]") for item in value)
    if len(value) != len(args):
        raise ValueError(f"{where} has {len(value)} items, not {len(args)}")
    return tuple(
        _parse(a, item, f"{where}[{i}]")
        for i, (a, item) in enumerate(zip(args, value, strict=True))
    )
