"""Shared pieces of every command: options, the clean-error wrapper, the console."""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from loadgen.adapters import APIS
from loadgen.errors import LoadgenError
from loadgen.workload.inputs import size_text
from loadgen.workload.plans import check_memory, default_memory_cap
from loadgen.workload.spec import (
    CACHE_MODES,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SPAN_S,
    header_problem,
    url_problem,
)

F = TypeVar("F", bound=Callable[..., Any])


EXIT_CODES_HELP = """\b
Exit codes:
  0    every SLO of every class met
  1    usage or configuration error (bad file, unreachable target)
  2    an SLO was missed
  3    the generator fell behind, or the client failed (out of disk space, file
       descriptors or permission mid-run): its numbers are not the server's
  4    the watchdog stopped a run where nothing progressed; records are written
  5    incomplete: a run killed outright, finished by report --recover (no verdict)
  130  interrupted (Ctrl-C / SIGTERM); records and summary are still written (no
       verdict: the figures are partial)"""


def clean_errors(func: F) -> F:
    """Turn a LoadgenError into its message on stderr and its exit code (1 for a bad input,
    3 for a client-side failure mid-run), never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LoadgenError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature


class FiniteFloat(click.ParamType):  # type: ignore[type-arg]  # generic only in click's stubs
    """A finite number in [low, high] (or (low, high] with `low_open`): click's FloatRange
    lets `nan` through, and `inf` wherever there is no upper bound."""

    name = "number"

    def __init__(self, low: float, high: float, *, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.low if self.low_open else number >= self.low
        if not (math.isfinite(number) and low_ok and number <= self.high):
            bound = ">" if self.low_open else ">="
            span = f"{bound} {self.low:g} and <= {self.high:,.0f}"
            self.fail(f"must be a finite number {span} (got {value!r})", param, ctx)
        return number


MAX_WAIT_S = (
    31 * 86_400
)  # = loadgen.workload.spec.MAX_SPAN_S (loadgen.workload.spec is imported lazily)


RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str | None) -> None:
    """A run id names one folder inside --out: letters, digits and `-_.`, never a path."""
    if run_id is not None and not RUN_ID.match(run_id):
        raise click.BadParameter(
            f"{run_id!r:.80} is not a safe folder name: use letters, digits and -_. (starting "
            "with a letter or digit, at most 128 characters), e.g. nightly-2026-11-29",
            param_hint="--run-id",
        )


def check_url(url: str | None) -> None:
    """A base URL that can be connected to: http(s), a host, a port in 1-65535."""

    if url is not None and (problem := url_problem(url)):
        raise click.BadParameter(f"it {problem}", param_hint="--url")


def memory_cap(max_memory_gb: float | None) -> tuple[int, str]:
    """The plan memory cap in bytes, and where it came from (for the error)."""

    if max_memory_gb is not None:
        return round(max_memory_gb * 1024**3), f"--max-memory-gb {max_memory_gb:g}"
    return default_memory_cap()


def workload_options(func: F) -> F:
    """--requests, --duration, --rate, --seed, --api, --model, --force-output-tokens: what
    `check` and `run` both change (applied by `spec.override`)."""

    options = [
        click.option("--requests", type=click.IntRange(min=1, max=MAX_REQUESTS),
                     help="Requests (or sessions, trajectories) per class, replacing the file's."),
        click.option("--duration", type=FiniteFloat(0, MAX_SPAN_S, low_open=True),
                     help="Seconds of arrivals per class, replacing the file's."),
        click.option("--rate", help="Total req/s across classes (e.g. 8), or a multiplier (2x)."),
        click.option("--seed", type=click.IntRange(min=0, max=MAX_SEED),
                     help="Seed for arrivals, lengths and prompts (default: the file's, else 0)."),
        click.option("--api", type=click.Choice(APIS),
                     help="API family, replacing target.api; the path follows it unless "
                     "target.path is set."),
        click.option("--model", help="Model name sent in every request, replacing target.model."),
        click.option("--force-output-tokens/--no-force-output-tokens", default=None,
                     help="Send ignore_eos + min_tokens (OpenAI APIs), replacing "
                     "target.force_output_tokens; servers that reject them answer HTTP 422."),
        click.option("--max-memory-gb", type=FiniteFloat(0, 1e6, low_open=True),
                     help="Refuse a plan whose estimated client memory (plans, records and "
                     "their audit) exceeds this many GiB (default: half of this host's memory)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


NONCE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def check_nonce(_ctx: click.Context, _param: click.Parameter, nonce: str | None) -> str | None:
    """A nonce is recorded in run.json and shown: 1-64 letters, digits and `-_.`."""
    if nonce is not None and not NONCE.match(nonce):
        raise click.BadParameter(f"{nonce!r:.80} is not a nonce: use 1-64 letters, digits "
                                 "and -_. (e.g. the one a run.json records)",
                                 param_hint="--nonce")  # fmt: skip
    return nonce


def cache_options(func: F) -> F:
    """--cache and --nonce: how a run stands to the server's prefix cache (README "Cache
    warmth"); `run`, `check` and `capacity` share them."""
    options = [
        click.option("--cache", type=click.Choice(CACHE_MODES),
                     help="cold: prompts start with a run nonce, so nothing is cached from "
                     "an earlier run; warm: the same bytes as every run of this file and "
                     "seed; reset: those, after asking the server to empty its prefix cache. "
                     "Replaces the file's `cache` (default cold)."),
        click.option("--nonce", callback=check_nonce,
                     help="A cold run's nonce (run.json's cache.nonce), to send exactly the "
                     "bytes of that run again (default: drawn per run and recorded)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def check_memory_line(spec: Any, seed: int | None, max_memory_gb: float | None) -> str:
    """Refuse a plan over the memory cap (before building it); the line `check` prints."""

    cap, source = memory_cap(max_memory_gb)
    estimate = check_memory(spec, cap, source, seed)
    return f"client memory: {estimate.text()} (cap {size_text(cap)}: {source})"


def output_console() -> Console:
    """stdout for tables: the terminal's width, or 120 columns when piped to a file or CI log."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def parse_headers(values: tuple[str, ...], flag: str = "--header") -> dict[str, str]:
    """`NAME:VALUE` strings as a dict; a malformed one is a usage error (of `flag`)."""

    headers = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r} is not NAME:VALUE", param_hint=flag)
        if problem := header_problem(name.strip(), rest.strip()):
            raise click.BadParameter(f"{value!r:.80}: {problem}", param_hint=flag)
        headers[name.strip()] = rest.strip()
    return headers
