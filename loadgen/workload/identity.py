"""A run's workload identity, and its spec rebuilt from run.json.

`run.json` keeps the resolved spec (`workload.spec`: the file after `--rate`, `--requests`,
`--duration`, `--api`, `--model` were applied, as `dataclasses.asdict` wrote it). Two uses:

- Identity. The results store, rolling windows and baselines pool runs only of one
  workload: the same name and the same fingerprint. The fingerprint is a hash of the
  resolved spec leaving out what a nightly job varies without changing the traffic's
  shape: the seed, the run length (every class's `requests` and `duration_s`, what
  `--requests`/`--duration` set), the target URL, and where the files lie (the workload's
  path; a trace, dataset or tokenizer file counts by its file name). Everything else is in: arrival
  processes and their rates (so `--rate 3x` is another workload), lengths, SLOs,
  deadlines, API, model, the built-in simulator's profile, and `--max-in-flight`. Settings
  at their default are left out before hashing, so a loadgen upgrade that adds a setting
  does not change the identity of existing workloads.
- Recovery. Plans are a pure function of spec and seed, so `spec_from_resolved` and the
  seed rebuild the exact plan of a run that was killed (`loadgen.results.recover`).

Leaving defaults out is sound only while a default means the traffic it always meant. Where
a release changes what a default sends, the fingerprint must name the semantics instead:

- Agent context. Before run.json schema 9 an agent hop carried a fixed context (the task
  plus the previous answer); since, `kind: agent` grows its context by default (every
  earlier hop and a tool result). So an agent class always hashes its context mode, even at
  its default: `{"grow": false}` for a fixed context, or `{"grow": true, "max_tokens": cap
  or null}` plus `overflow` when capped, `summary_tokens` when summarising, and the tool
  result's length distribution (`tool_result_tokens`, or the one the plans use when the
  class gives none; not for a recorded agent trace, which carries its own). Only what
  shapes the traffic enters, so a setting that a mode ignores does not split a series.
  `{"grow": false}` is exactly what the default-dropping rule hashed for an explicit
  `grow: false`, so such runs keep their key (unless they set a `tool_result_tokens`, which
  a fixed context never sends). Classes that are not agents hash as before: their
  fingerprints are unchanged (tests/workload/test_identity.py pins the shipped ones).
- Old run.json. A stored agent class without a `context` key (schema 8 and older) ran a
  fixed context: `spec_from_resolved` rebuilds it as `grow: false`, so both `recover` and
  the identity see the traffic it sent. The identity an older loadgen recorded for a run
  with an agent class cannot tell a fixed context from a growing one (runs written between
  the change of default and this rule hashed both alike), so `identity_of_run` derives the
  identity of such runs from their stored spec; every other run keeps the identity it
  recorded, and so does an agent run whose identity names this rule (`scheme` 2, recorded
  since run.json schema 11; a newer loadgen's stored spec may hold settings this one
  cannot rebuild, so its recorded key is the better one). Agent workloads stored before
  this rule therefore start a new series: their fixed-context runs pool with `grow: false`
  runs, their growing ones with growing ones.
- Cache warmth. Since run.json schema 14 a run's prompts start with a run nonce by default
  (`cache: cold`), where before the same file and seed sent the same bytes every run,
  served from whatever cache an earlier run had warmed (today's `cache: warm`). `cache` is
  hashed when not `cold`, so cold runs keep the fingerprint the same workload had; a stored
  spec without `cache` (schema 13 and older) is rebuilt as `warm`, and the identity of such
  a run is derived from its stored spec (`scheme` 3, recorded since schema 14): old runs
  pool with `--cache warm` runs, never silently with cold ones. `reset` is a mode of its own.
- Renamed keys. A `sim:` key that was renamed is hashed by its old name (`HASHED_AS`:
  `decode_table` as `decode_step_ms`), so a file that takes up the new name keeps its series.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from loadgen.codec import from_json
from loadgen.errors import LoadgenError
from loadgen.workload.model import (
    BY_FILE_NAME,
    FINGERPRINT,
    NOT_TRAFFIC,
    ClassSpec,
    TargetSpec,
    WorkloadSpec,
)
from loadgen.workload.overrides import offered_rate
from loadgen.workload.plans import DEFAULT_TOOL_RESULT, is_agent_trace

FINGERPRINT_CHARS = 16
# The fingerprint's rule, recorded with it (`workload.identity.scheme`): 2 = an agent class
# hashes its context mode (identities recorded without it are scheme 1); 3 = a run's cache
# mode, `warm` for runs stored before it was recorded.
SCHEME = 3
SHOWN_CHARS = 8  # in a workload key: `chat-smoke@3f2a9c1d`
# How a field enters the fingerprint: its metadata in `workload.model` (NOT_TRAFFIC: left
# out; BY_FILE_NAME: a file, by its name); every other field is hashed.
_LEFT_OUT, _FILE_NAME = NOT_TRAFFIC[FINGERPRINT], BY_FILE_NAME[FINGERPRINT]


def _not_traffic(cls: type[Any]) -> frozenset[str]:
    """The fields of `cls` the fingerprint leaves out."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.metadata.get(FINGERPRINT) == _LEFT_OUT)  # fmt: skip


# What the identity of a stored spec this loadgen cannot rebuild leaves out, by its place
# in the spec (`_raw_identity`): the same fields, except that the request id's header and
# format were never left out there, so such runs keep the keys they were given.
_RAW_LEFT_OUT = {
    (): _not_traffic(WorkloadSpec),
    ("target",): _not_traffic(TargetSpec) - {"request_id_header", "request_id_format"},
}
_RAW_LEFT_OUT_CLASS = _not_traffic(ClassSpec)


def spec_from_resolved(data: Mapping[str, Any]) -> WorkloadSpec:
    """The `WorkloadSpec` that `run.json`'s `workload.spec` was written from.

    Keys a newer or older loadgen wrote that this one does not know are ignored; missing
    ones take their defaults. Header values were never stored (they may be secret): the
    rebuilt spec has the names with empty values, enough to plan, not to send.
    """
    try:
        return from_json(WorkloadSpec, _header_names(_upgrade(data)), "workload.spec.")
    except (TypeError, ValueError, KeyError) as exc:
        raise LoadgenError(f"run.json: cannot rebuild the workload spec ({exc})") from None


def _upgrade(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A stored spec of an older loadgen in today's terms, where a missing key's default
    would not be what that loadgen sent: an agent class without `context` (run.json schema
    8 and older) ran a fixed context, where today's default grows it."""
    if "cache" not in data and "classes" in data:  # schema 13 and older: the same bytes
        data = {**data, "cache": "warm"}  # every run (the module docstring)
    classes = data.get("classes")
    if not isinstance(classes, Mapping):
        return data
    fixed = {name: {**cls, "context": {"grow": False}} for name, cls in classes.items()
             if isinstance(cls, Mapping) and cls.get("kind") == "agent"
             and "context" not in cls}  # fmt: skip
    return {**data, "classes": {**classes, **fixed}} if fixed else data


def _header_names(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """run.json stores the target's header names only (values may be secret): as headers
    with empty values, enough to plan, not to send."""
    target = data.get("target")
    if not isinstance(target, Mapping):
        return data
    names = {key: dict.fromkeys((str(name) for name in value), "")
             for key in ("headers", "server_metrics_headers")
             if isinstance(value := target.get(key), list)}  # fmt: skip
    return {**data, "target": {**target, **names}} if names else data


def fingerprint(spec: WorkloadSpec, *, max_in_flight: int | None = None) -> str:
    """The workload's fingerprint (hex): see the module docstring for what it covers."""
    canonical = {"spec": _canonical(spec), "max_in_flight": max_in_flight}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def _canonical(value: Any) -> Any:
    """Plain data for hashing: dataclass fields at their default and left-out fields dropped."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _canonical_fields(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 4.0 and 4 are one rate
    return value


def _canonical_fields(value: Any) -> dict[str, Any]:
    """A dataclass's hashed fields: those left out, and those at their default, dropped; a
    file by its name; an agent class's context mode always (`_agent_context`)."""
    out = {}
    for f in dataclasses.fields(value):
        how, current = f.metadata.get(FINGERPRINT), getattr(value, f.name)
        if how == _LEFT_OUT or _is_default(f, current):
            continue
        if how == _FILE_NAME and isinstance(current, str):
            current = PurePath(current).name
        if isinstance(value, WorkloadSpec) and f.name == "sim":
            current = {HASHED_AS.get(str(k), str(k)): v for k, v in current.items()}
        out[f.name] = _canonical(current)
    if isinstance(value, ClassSpec) and value.kind == "agent":
        out.pop("tool_result_tokens", None)  # in the context entry, when it shapes traffic
        out["context"] = _agent_context(value)
    return out


# A `sim:` key renamed since -> the name it is hashed by: the one it had when workloads'
# series began, so renaming it in a file splits no series.
HASHED_AS = {"decode_table": "decode_step_ms"}


def _agent_context(cls: ClassSpec) -> dict[str, Any]:
    """An agent class's context mode and the settings that shape its traffic, defaults
    included (the module docstring says why)."""
    context = cls.context
    if not context.grow:
        return {"grow": False}
    out: dict[str, Any] = {"grow": True, "max_tokens": context.max_tokens}
    if context.max_tokens is not None:
        out["overflow"] = context.overflow
        if context.overflow == "summarize":
            out["summary_tokens"] = context.summary_tokens
    if not is_agent_trace(cls):
        out["tool_result_tokens"] = _canonical(cls.tool_result_tokens or DEFAULT_TOOL_RESULT)
    return out


def _is_default(f: dataclasses.Field[Any], value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


def offered_rate_per_s(spec: WorkloadSpec) -> float | None:
    """The open-loop classes' arrivals per second, summed (`overrides.offered_rate`, the
    load `--rate` means; None when a class replays a trace)."""
    total = offered_rate(spec).per_s
    return None if total is None else round(total, 6)


def identity(spec: WorkloadSpec, *, max_in_flight: int | None = None) -> dict[str, Any]:
    """`{name, fingerprint, key, offered_rate_per_s, scheme}`: what run.json records as
    `workload.identity`. The key (`name@first 8 hex`) is what the store groups by."""
    print_ = fingerprint(spec, max_in_flight=max_in_flight)
    return {
        "name": spec.name,
        "fingerprint": print_,
        "key": f"{spec.name}@{print_[:SHOWN_CHARS]}",
        "offered_rate_per_s": offered_rate_per_s(spec),
        "scheme": SCHEME,
    }


def identity_of_run(info: Mapping[str, Any]) -> dict[str, Any]:
    """A run's workload identity: as its run.json records it (scheme 3 and later), or
    derived the same way from its stored spec for a run written before identities were
    recorded, and for one whose identity predates scheme 3: it ran warm and its key does not
    say so, and an agent run's before scheme 2 may not say which context it ran (the module
    docstring)."""
    workload = info.get("workload") or {}
    stored = workload.get("identity")
    if isinstance(stored, Mapping) and stored.get("key"):
        scheme = stored.get("scheme", 1)
        if isinstance(scheme, int) and scheme >= SCHEME:
            return dict(stored)
    cap = (info.get("options") or {}).get("max_in_flight")
    stored_spec = workload.get("spec") or {}
    try:
        spec = spec_from_resolved(stored_spec)
    except LoadgenError:  # a spec this loadgen cannot rebuild: hash what is stored
        stored_spec = _upgrade(stored_spec) if isinstance(stored_spec, Mapping) else stored_spec
        return _raw_identity(str(workload.get("name", "")), stored_spec, cap)
    return identity(spec, max_in_flight=cap)


def _raw_identity(name: str, stored: Mapping[str, Any], cap: int | None) -> dict[str, Any]:
    """An identity from the stored spec as written (the same fields left out, defaults
    kept): stable for runs of one loadgen version, if not across versions."""

    text = json.dumps({"spec": _strip(stored, ()), "max_in_flight": cap}, sort_keys=True,
                      separators=(",", ":"), default=str)  # fmt: skip
    print_ = hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]
    return {"name": name, "fingerprint": print_, "key": f"{name}@{print_[:SHOWN_CHARS]}",
            "offered_rate_per_s": None, "scheme": SCHEME}  # fmt: skip


def _strip(value: Any, path: tuple[str, ...]) -> Any:
    """A stored spec without the keys the fingerprint leaves out."""
    if isinstance(value, Mapping):
        return {k: _strip(v, (*path, k)) for k, v in value.items() if not _left_out(path, k)}
    return value


def _left_out(path: tuple[str, ...], key: str) -> bool:
    """Keys of a stored spec the fingerprint leaves out (by their place in it)."""
    if path in _RAW_LEFT_OUT:
        return key in _RAW_LEFT_OUT[path]
    return len(path) == 2 and path[0] == "classes" and key in _RAW_LEFT_OUT_CLASS


# --- what differs between two runs' workloads ----------------------------------------------

_DEFAULT = "(default)"  # a setting left at its default on one side (so not hashed there)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SettingDifference:
    """One setting in which two runs' workloads differ, as the fingerprint sees them.

    `path`: the setting's place in run.json's `workload.spec` (`classes.agent.context.grow`),
    or `max_in_flight` (`--max-in-flight`); `first` and `second`: its value in each run,
    as text (`(default)` for a setting one side left at its default)."""

    path: str
    first: str
    second: str

    def describe(self) -> str:
        """`classes.agent.context.grow: false vs true (class agent's context: fixed vs
        growing)`: the setting, both values, and what they mean where loadgen knows."""
        text = f"{self.path}: {self.first} vs {self.second}"
        if self.path == "cache":
            text += " (cache warmth: a cold run starts with nothing an earlier run cached)"
        if _is_context_mode(self.path):
            mode = {"false": "fixed", "true": "growing"}
            first, second = (mode.get(v, v) for v in (self.first, self.second))
            text += f" (class {self.path.split('.')[1]}'s context: {first} vs {second})"
        return text

    def remedy(self) -> str:
        """How to make the two runs alike in this setting."""
        if _is_context_mode(self.path):
            name = self.path.split(".")[1]
            return (
                f"give class {name} one context mode in both workloads (`context: {{grow: "
                "false}` fixed, `{grow: true}` growing, the default) and rerun one"
            )
        if self.path == "max_in_flight":
            return "run both with one --max-in-flight"
        if self.path == "cache":
            return (
                "run both with one cache mode (--cache cold, the default; warm; reset): "
                "see docs/cache-warmth.md"
            )
        if self.path == "name":
            return "give both workloads one name"
        return f"set {self.path} alike in both workloads and rerun one"


def workload_differences(
    first: Mapping[str, Any], second: Mapping[str, Any]
) -> list[SettingDifference]:
    """Every setting the fingerprint hashes whose value differs between two runs (their
    run.json data), in path order: the name, a spec field, an agent class's context mode,
    `max_in_flight`. Empty when the two hash alike under this loadgen's rule (runs whose
    recorded keys differ all the same were fingerprinted by another rule: see the module
    docstring). Values come from each run's stored spec with its defaults filled in."""
    (a, a_all), (b, b_all) = _hashed_settings(first), _hashed_settings(second)

    def shown(path: str, hashed: Mapping[str, str], every: Mapping[str, str]) -> str:
        if path in hashed:
            return hashed[path]
        return f"{every[path]} (default)" if path in every else _DEFAULT

    differing = [p for p in sorted(a.keys() | b.keys())  # by value, defaults filled in:
                 if a.get(p, a_all.get(p)) != b.get(p, b_all.get(p))]  # fmt: skip
    modes = {p.removesuffix("grow") for p in differing if _is_context_mode(p)}
    return [SettingDifference(path=p, first=shown(p, a, a_all), second=shown(p, b, b_all))
            for p in differing  # a fixed context ignores the settings of a growing one
            if _is_context_mode(p) or not any(p.startswith(m) for m in modes)]  # fmt: skip


def _is_context_mode(path: str) -> bool:
    """`classes.<name>.context.grow`: an agent class's context mode."""
    parts = path.split(".")
    return len(parts) == 4 and parts[0] == "classes" and parts[2:] == ["context", "grow"]


def _hashed_settings(info: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """A run's hashed settings as `{dotted path: value as JSON text}` (leaves only), and
    every setting of its spec, defaults included (to name a default's value)."""
    workload = info.get("workload") or {}
    stored = workload.get("spec") or {}
    cap = (info.get("options") or {}).get("max_in_flight")
    try:
        spec = spec_from_resolved(stored)
    except LoadgenError:  # hash what is stored, as `_raw_identity` does
        hashed, every = _strip(stored, ()), stored
    else:
        hashed, every = _canonical(spec), dataclasses.asdict(spec)
    return _flat({"spec": hashed, "max_in_flight": cap}), _flat({"spec": every})


def _flat(value: Any, path: str = "") -> dict[str, str]:
    """Nested mappings as `{dotted path: leaf as JSON text}`, the `spec.` prefix dropped;
    None leaves are left out (a setting at its default, or none)."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{path}.{key}" if path else str(key)))
        return out
    if value is None:
        return {}
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # as `_canonical` hashes it: 60.0 and 60 are one deadline
    return {path.removeprefix("spec."): json.dumps(value, sort_keys=True, default=str)}
