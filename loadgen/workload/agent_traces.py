"""Agent traces: recorded trajectories (hops, token counts, tool times) read for replay.

Part of the plans stage: an agent class with `arrival: {process: trace, format: agent,
path: ...}` replays each recorded trajectory at its start time, its hops in order with
the recorded tool time between them, under the same rules as a generated trajectory (the
context grows: hop 0 sends the recorded input as the task; every later hop adds the real
answers and a tool result sized so the context matches the recorded input of the next
hop). The format, one JSON object per line:

    {"trajectory": "t1", "hop": 0, "start_s": 0.0, "input_tokens": 1800,
     "output_tokens": 42, "tool_s": 0.35, "parent": null}

* `trajectory` (string or integer): the trajectory the model call belongs to.
* `hop` (integer >= 0): its position; several lines with the same hop are a fan-out, sent
  at once and joined.
* `input_tokens`, `output_tokens` (integers >= 1): the prompt the call sent (the whole
  context) and the tokens it generated.
* `tool_s` (seconds >= 0, default 0): the tool time after this hop, before the next.
* `start_s` (seconds >= 0): when the trajectory started, on its hop-0 line (required there).
* `parent` (optional): the trajectory that spawned this one as a sub-agent; it must be in
  the file. A sub-agent is replayed as its own trajectory at its own start time.

Errors name the file, the line and the field.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadgen.errors import ConfigError
from loadgen.workload.inputs import TRACE_MAX_BYTES, json_problem, read_text


@dataclass(frozen=True, slots=True)
class TraceCall:
    """One recorded model call of a trajectory."""

    input_tokens: int
    output_tokens: int
    tool_s: float


@dataclass(frozen=True, slots=True)
class TraceTrajectory:
    """One recorded trajectory: its start, parent, and calls by hop (a list per hop)."""

    trajectory: str
    start_s: float
    parent: str | None
    hops: tuple[tuple[TraceCall, ...], ...]

    def tool_results(self) -> list[int]:
        """Per hop, the tokens of each call's tool result: what the next hop's recorded
        input adds beyond this hop's input and its answers, shared by its calls (>= 1)."""
        sizes = []
        for k, calls in enumerate(self.hops):
            if k + 1 == len(self.hops):
                sizes.append(1)
                continue
            added = self.hops[k + 1][0].input_tokens - calls[0].input_tokens
            added -= sum(c.output_tokens for c in calls)
            sizes.append(max(1, round(added / len(calls))))
        return sizes


@functools.lru_cache(maxsize=8)
def load_agent_trace(path: str) -> tuple[TraceTrajectory, ...]:
    """Every trajectory of the file, by start time (then id)."""
    text = read_text(Path(path), cap_bytes=TRACE_MAX_BYTES, what="agent trace",
                     fix="cut the trajectories you replay into a smaller file")  # fmt: skip
    calls: dict[str, dict[int, list[TraceCall]]] = {}
    starts: dict[str, float] = {}
    parents: dict[str, tuple[str | None, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _row(path, number, line)
        name = _id(path, number, row.get("trajectory"), "trajectory")
        hop = _int(path, number, row, "hop", minimum=0)
        call = TraceCall(
            input_tokens=_int(path, number, row, "input_tokens", minimum=1),
            output_tokens=_int(path, number, row, "output_tokens", minimum=1),
            tool_s=_seconds(path, number, row, "tool_s", 0.0),
        )
        calls.setdefault(name, {}).setdefault(hop, []).append(call)
        if hop == 0:
            starts[name] = min(starts.get(name, math.inf), _seconds(path, number, row, "start_s"))
        parent = row.get("parent")
        parents.setdefault(name, (None if parent is None else _id(path, number, parent,
                                                                    "parent"), number))  # fmt: skip
    if not calls:
        raise ConfigError(path, "", "the agent trace has no rows",
                          "see docs/workloads.md, Agent traces")  # fmt: skip
    return tuple(sorted((_trajectory(path, name, hops, starts, parents)
                         for name, hops in calls.items()),
                        key=lambda t: (t.start_s, t.trajectory)))  # fmt: skip


def _trajectory(
    path: str, name: str, hops: dict[int, list[TraceCall]], starts: dict[str, float],
    parents: dict[str, tuple[str | None, int]],
) -> TraceTrajectory:  # fmt: skip
    missing = [k for k in range(max(hops) + 1) if k not in hops]
    if missing:
        raise ConfigError(path, f"trajectory {name!r}", f"has no hop {missing[0]}",
                          "hops count from 0 without gaps")  # fmt: skip
    if name not in starts:
        raise ConfigError(path, f"trajectory {name!r}", "its hop 0 has no start_s")
    parent, line = parents[name]
    if parent is not None and parent not in starts:
        raise ConfigError(path, f"line {line}, parent", f"names trajectory {parent!r}, which is "
                          "not in the file")  # fmt: skip
    ordered = tuple(tuple(hops[k]) for k in range(len(hops)))
    return TraceTrajectory(trajectory=name, start_s=starts[name], parent=parent, hops=ordered)


def _row(path: str, number: int, line: str) -> dict[str, Any]:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(path, f"line {number}", json_problem(exc)) from None
    if not isinstance(row, dict):
        raise ConfigError(path, f"line {number}", "must be a JSON object",
                          "see docs/workloads.md, Agent traces, for the fields")  # fmt: skip
    return row


def _id(path: str, number: int, value: object, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise ConfigError(path, f"line {number}, {field}", f"must be a string or integer id, "
                          f"got {value!r:.40}")  # fmt: skip
    return str(value)


def _int(path: str, number: int, row: dict[str, Any], field: str, *, minimum: int) -> int:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(path, f"line {number}, {field}",
                          f"must be an integer >= {minimum}, got {value!r:.40}")  # fmt: skip
    return value


def _seconds(path: str, number: int, row: dict[str, Any], field: str,
             default: float | None = None) -> float:  # fmt: skip
    value = row.get(field, default)
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or value < 0):  # fmt: skip
        raise ConfigError(path, f"line {number}, {field}",
                          f"must be a number of seconds >= 0, got {value!r:.40}")  # fmt: skip
    return float(value)
