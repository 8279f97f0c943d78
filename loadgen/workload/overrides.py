"""The command line's changes to a workload: `--requests`, `--duration`, `--rate`, `--api`,
`--model`, `--force-output-tokens`, `--cache` and `--confidence` applied to a validated
spec, and checked as the file is (`check_schedule`), naming the flag that went out of range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from loadgen.adapters import APIS
from loadgen.errors import OptionError
from loadgen.workload.checks import (
    ACCEPT_ENCODING_FIX,
    accept_encoding_codings,
    check_schedule,
    number_text,
)
from loadgen.workload.model import (
    CACHE_MODES,
    MAX_REQUESTS,
    MAX_SPAN_S,
    MIN_CONFIDENCE,
    SPAN_WHY,
    ClassSpec,
    TargetSpec,
    WorkloadSpec,
)


def override(
    spec: WorkloadSpec,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    rate: str | None = None,
    api: str | None = None,
    model: str | None = None,
    force_output_tokens: bool | None = None,
    cache: str | None = None,
    confidence: float | None = None,
    accept_encoding: str | None = None,
    path_buffers: bool | None = None,
    traceparent: bool | None = None,
) -> WorkloadSpec:
    """The spec with the command line's `--requests`, `--duration`, `--rate`, `--api`,
    `--model`, `--force-output-tokens`, `--cache`, `--accept-encoding` and
    `--path-buffers` applied.

    `requests` replaces every class's count; `duration_s` every open-loop class's duration
    (a closed-loop batch, `concurrency`, keeps its `requests` documents: it has no arrivals
    to last for a duration; a spec of batches only is refused). `rate` is either a
    multiplier (`2x`, `0.5x`) applied to every class's rate, or a total rate in req/s that
    every class is scaled to in proportion to its own rate. `api` replaces `target.api`
    (the request path then follows the new API unless `target.path` is set); `model` and
    `force_output_tokens` replace theirs. `confidence` replaces every class's
    `slo.confidence` (the level its targets are judged at). `accept_encoding` replaces
    `target.accept_encoding` (codings, comma-separated; `none` sends none); `path_buffers`
    replaces `target.path_buffers`, `traceparent` `target.traceparent`.
    """
    _check_run_length(spec, requests, duration_s)
    spec = replace(spec, target=_override_target(spec, api, model, force_output_tokens))
    if accept_encoding is not None:
        try:
            codings = accept_encoding_codings(accept_encoding)
        except ValueError as exc:
            raise OptionError("--accept-encoding", str(exc), ACCEPT_ENCODING_FIX) from None
        spec = replace(spec, target=replace(spec.target, accept_encoding=codings))
    if path_buffers is not None:
        spec = replace(spec, target=replace(spec.target, path_buffers=path_buffers))
    if traceparent is not None:
        spec = replace(spec, target=replace(spec.target, traceparent=traceparent))
    if cache is not None:
        if cache not in CACHE_MODES:
            raise OptionError("--cache", f"unknown mode {cache!r}",
                              f"one of {', '.join(CACHE_MODES)}")  # fmt: skip
        spec = replace(spec, cache=cache)
    scale = rate_scale(spec, rate) if rate else 1.0
    classes = {name: _override_class(cls, scale, requests, duration_s)
               for name, cls in spec.classes.items()}  # fmt: skip
    if confidence is not None:
        if not (math.isfinite(confidence) and MIN_CONFIDENCE < confidence < 1.0):
            raise OptionError("--confidence", f"must be in ({MIN_CONFIDENCE:g}, 1) "
                              f"(got {confidence:g})", "e.g. --confidence 0.95")  # fmt: skip
        classes = {name: replace(cls, slo=replace(cls.slo, confidence=confidence))
                   for name, cls in classes.items()}  # fmt: skip
    spec = replace(spec, classes=classes)
    given = [flag for flag, value in (("--requests", requests), ("--duration", duration_s),
                                      ("--rate", rate)) if value is not None]  # fmt: skip
    if given:
        check_schedule(spec, after=f" with {'/'.join(given)}")
    return spec


def _check_run_length(spec: WorkloadSpec, requests: int | None, duration_s: float | None) -> None:
    """`--requests` or `--duration`, in range; `--duration` needs an open-loop class."""
    if requests is not None and duration_s is not None:
        raise OptionError("--requests/--duration", "give one, not both")
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        raise OptionError("--requests", f"must be 1 to "
                          f"{number_text(MAX_REQUESTS)} (got {number_text(requests)})")  # fmt: skip
    if duration_s is not None and not 0 < duration_s <= MAX_SPAN_S:
        raise OptionError("--duration", f"must be > 0 and <= "
                          f"{number_text(MAX_SPAN_S)} s ({SPAN_WHY}) "
                          f"(got {duration_s:g})")  # fmt: skip
    if duration_s is not None and all(c.concurrency is not None for c in spec.classes.values()):
        batches = ", ".join(f"{name}: {c.requests} documents, {c.concurrency} in flight"
                            for name, c in spec.classes.items())  # fmt: skip
        raise OptionError("--duration",
                          f"every class of {spec.source} is a closed-loop batch ({batches}), "
                          "which sends its documents, not arrivals for a duration",
                          "give --requests N (documents per class) instead")  # fmt: skip


def _override_class(
    cls: ClassSpec, scale: float, requests: int | None, duration_s: float | None
) -> ClassSpec:
    """The class at `scale` times its rates, for `requests` or `duration_s` (a closed-loop
    batch keeps its documents under `--duration`)."""
    count, duration = cls.requests, cls.duration_s
    if requests is not None:
        count, duration = requests, None
    elif duration_s is not None and cls.concurrency is None:
        count, duration = None, duration_s
    arrival = cls.arrival if cls.concurrency is not None else cls.arrival.scaled(scale)
    return replace(cls, arrival=arrival, requests=count, duration_s=duration)


def _override_target(
    spec: WorkloadSpec, api: str | None, model: str | None, force_output_tokens: bool | None
) -> TargetSpec:
    """The target with the command line's API, model and output-length forcing."""
    target = spec.target
    if api is not None and api != target.api:
        if api not in APIS:
            raise OptionError("--api", f"unknown API {api!r}",
                              f"one of {', '.join(APIS)}")  # fmt: skip
        if api == "generic" and (target.generic is None or target.path is None):
            raise OptionError(
                "--api generic",
                f"{spec.source} has no target.generic section and target.path",
                "describe it in the workload file: docs/apis.md, 'Generic streaming APIs'",
            )  # fmt: skip
        target = replace(target, api=api)
    if model is not None:
        target = replace(target, model=model)
    if force_output_tokens is not None:
        target = replace(target, force_output_tokens=force_output_tokens)
    return target


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferedRate:
    """The load a rate means: the arrivals per second of the workload's open-loop classes,
    summed. `--rate N`, `capacity --param rate`'s loads and labels, and knee.png's axis all
    read this one figure. A closed-loop class (`concurrency`) has no arrival rate (it sends
    as its requests end), so it is outside the total and keeps its concurrency.

    `per_s` is None when an open-loop class replays a trace (its rate is the trace's);
    `unit` says what an arrival is: `req/s`, `sessions/s`, `trajectories/s`, or
    `arrivals/s` when the open-loop classes count different things."""

    per_s: float | None
    unit: str
    open_loop: tuple[str, ...]  # the classes it sums, in file order
    closed_loop: tuple[str, ...]  # the classes outside it

    def describe(self, per_s: float | None = None) -> str:
        """`12 req/s (chat; summarize, a closed loop, is outside it)` at `per_s` (default
        the file's own total)."""
        value = self.per_s if per_s is None else per_s
        total = "a trace's rate" if value is None else f"{value:.3g} {self.unit}"
        classes = ", ".join(self.open_loop) or "no open-loop class"
        if self.closed_loop:
            names = ", ".join(self.closed_loop)
            verb = "is a closed loop" if len(self.closed_loop) == 1 else "are closed loops"
            return f"{total} ({classes}; {names} {verb}, outside it)"
        return f"{total} ({classes})"


_UNITS = {"requests": "req/s", "sessions": "sessions/s", "trajectories": "trajectories/s"}


def offered_rate(spec: WorkloadSpec) -> OfferedRate:
    """The workload's open-loop arrival rate as the file gives it (see `OfferedRate`)."""
    open_loop = [c for c in spec.classes.values() if c.concurrency is None]
    rates = [c.arrival.mean_rate_per_s for c in open_loop]
    units = {c.arrival_unit for c in open_loop}
    unit = _UNITS[str(next(iter(units)))] if len(units) == 1 else "arrivals/s"
    return OfferedRate(
        per_s=None if None in rates else sum(r for r in rates if r is not None),
        unit=unit,
        open_loop=tuple(c.name for c in open_loop),
        closed_loop=tuple(c.name for c in spec.classes.values() if c.concurrency is not None),
    )


def rate_scale(spec: WorkloadSpec, rate: str) -> float:
    """The factor `--rate` applies to every open-loop class's rate (see `override`): the
    multiplier itself (`2x`), or a total over `offered_rate`'s (`12`)."""
    text = rate.strip().lower()
    try:
        value = float(text[:-1]) if text.endswith("x") else float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise OptionError(
            "--rate",
            f"must be a positive number or multiplier (got {rate!r})",
            "e.g. --rate 8 (the open-loop classes' arrivals per second, in all) or --rate 2x",
        )
    if text.endswith("x"):
        return value
    offered = offered_rate(spec)
    if not offered.open_loop:
        raise OptionError(
            "--rate", f"every class of {spec.source} is a closed loop: it has no arrival rate",
            "set each class's concurrency in the file instead",
        )  # fmt: skip
    if offered.per_s is None:
        raise OptionError(
            "--rate", "a total rate cannot be split over trace-replay classes",
            "use a multiplier such as --rate 2x",
        )  # fmt: skip
    return value / offered.per_s
