"""The resolved spec of a run, rebuilt from its run.json.

`run.json` keeps the resolved spec (`workload.spec`: the file after `--rate`, `--requests`,
`--duration`, `--api`, `--model` were applied, as `dataclasses.asdict` wrote it). Plans are
a pure function of spec and seed, so `spec_from_resolved` and the seed rebuild the exact
plan of a run that was killed (`loadgen.recover`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.spec import WorkloadSpec


def spec_from_resolved(data: Mapping[str, Any]) -> WorkloadSpec:
    """The `WorkloadSpec` that `run.json`'s `workload.spec` was written from.

    Keys a newer or older loadgen wrote that this one does not know are ignored; missing
    ones take their defaults. Header values were never stored (they may be secret): the
    rebuilt spec has the names with empty values, enough to plan, not to send.
    """
    try:
        spec = _build(data, WorkloadSpec)
    except (TypeError, ValueError, KeyError) as exc:
        raise LoadgenError(f"run.json: cannot rebuild the workload spec ({exc})") from None
    if not isinstance(spec, WorkloadSpec):
        raise LoadgenError("run.json: workload.spec is not a workload")
    return spec


def _build(value: Any, tp: Any) -> Any:
    """`value` (JSON data) as type `tp`: dataclasses, tuples and mappings rebuilt."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return _build(value, kinds[0]) if len(kinds) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise TypeError(f"{tp.__name__} must be a mapping, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp) if f.init}
        kwargs = {k: _build(v, hints[k]) for k, v in value.items() if k in known}
        return tp(**kwargs)
    if origin is tuple:
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if item is not None:
            return tuple(_build(v, item) for v in value)
        return tuple(_build(v, a) for v, a in zip(value, args, strict=True))
    if origin in (Mapping, dict, typing.Mapping) or tp in (dict, Mapping):
        if isinstance(value, list):  # header names only (values are never stored)
            return dict.fromkeys((str(v) for v in value), "")
        item = args[1] if len(args) == 2 else Any
        return {k: _build(v, item) for k, v in value.items()}
    return value
