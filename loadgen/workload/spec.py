"""The workload spec, one import away: what the stages above the workload use of it.

A YAML file validated into frozen, typed values before any traffic. Four modules do the
work: `workload.model` (the dataclasses, value sets and ranges), `workload.parse` with
`workload.node` and `workload.sections` (the file read into the model, every error naming
its key path), `workload.checks` (the URL, header and schedule checks the command line
uses too) and `workload.overrides` (the command line's `--rate`, `--requests`, ...).
Modules inside workload/ import from those; the rest of loadgen from here.
"""

from __future__ import annotations

from loadgen.workload.checks import (
    API_KEY_HEADERS,
    CREDENTIAL_NAMES,
    ENV_REFERENCE,
    check_schedule,
    header_problem,
    host_problem,
    is_secret_header,
    metrics_url_problem,
    path_problem,
    redact_url,
    url_problem,
)
from loadgen.workload.model import (
    ARRIVAL_PROCESSES,
    CACHE_MODES,
    CLASS_KINDS,
    CLIENT_CODINGS,
    DEFAULT_CONFIDENCE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SPAN_S,
    METRICS_MS,
    MIN_CONFIDENCE,
    SPAN_WHY,
    ArrivalSpec,
    ClassSpec,
    ContextSpec,
    DatasetSpec,
    Deadlines,
    FanoutSpec,
    LengthDist,
    Limits,
    SecondsDist,
    SharedPrefixSpec,
    SloTargets,
    TargetSpec,
    TraceSpec,
    WorkloadSpec,
)
from loadgen.workload.overrides import OfferedRate, offered_rate, override, rate_scale
from loadgen.workload.parse import load, loads, parse

__all__ = [
    "API_KEY_HEADERS",
    "ARRIVAL_PROCESSES",
    "CACHE_MODES",
    "CLASS_KINDS",
    "CLIENT_CODINGS",
    "CREDENTIAL_NAMES",
    "DEFAULT_CONFIDENCE",
    "ENV_REFERENCE",
    "MAX_REQUESTS",
    "MAX_SEED",
    "MAX_SPAN_S",
    "METRICS_MS",
    "MIN_CONFIDENCE",
    "SPAN_WHY",
    "ArrivalSpec",
    "ClassSpec",
    "ContextSpec",
    "DatasetSpec",
    "Deadlines",
    "FanoutSpec",
    "LengthDist",
    "Limits",
    "OfferedRate",
    "SecondsDist",
    "SharedPrefixSpec",
    "SloTargets",
    "TargetSpec",
    "TraceSpec",
    "WorkloadSpec",
    "check_schedule",
    "header_problem",
    "host_problem",
    "is_secret_header",
    "load",
    "loads",
    "metrics_url_problem",
    "offered_rate",
    "override",
    "parse",
    "path_problem",
    "rate_scale",
    "redact_url",
    "url_problem",
]
