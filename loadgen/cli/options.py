"""Shared pieces of every command: options, the clean-error wrapper, the console."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table

from loadgen.adapters import APIS
from loadgen.analysis.confidence import INTERVAL, RULES
from loadgen.engine.network import Network
from loadgen.engine.proxy import ProxySettings
from loadgen.engine.tls import TlsSettings, check_settings
from loadgen.errors import LoadgenError, OptionError
from loadgen.printable import printable
from loadgen.run.options import RunOptions
from loadgen.workload.inputs import size_text
from loadgen.workload.plans import check_memory, default_memory_cap
from loadgen.workload.shards import MAX_WAIT_S
from loadgen.workload.spec import (
    CACHE_MODES,
    CLIENT_CODINGS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SPAN_S,
    WorkloadSpec,
    header_problem,
    load,
    metrics_url_problem,
    override,
    url_problem,
)

F = TypeVar("F", bound=Callable[..., Any])


def clean_errors(func: F) -> F:
    """Turn a LoadgenError into its message on stderr and its exit code (1 for a bad input,
    3 for a client-side failure mid-run), never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LoadgenError as exc:
            lines = str(exc).split("\n")  # loadgen's own line breaks; nothing else breaks one
            click.echo("error: " + "\n".join(map(printable, lines)), err=True)
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


# -- grouped help: every option belongs to one group of `--help` -------------------------
TARGET, LOAD, TIMING, SERVER_METRICS = "Target", "Load", "Deadlines and pacing", "Server metrics"
OUTPUT, LIVE, COST, SEARCH = "Output", "Live export", "Cost", "Search"
VERDICT = "Verdict"  # how sure a verdict is, and by which rule
CLUSTER = "Cluster"  # --ray and its shards
NETWORK = "TLS and proxy"  # how every connection verifies servers and reaches them
HELP_GROUPS = (
    TARGET, NETWORK, LOAD, SEARCH, TIMING, SERVER_METRICS, VERDICT, CLUSTER, OUTPUT, LIVE, COST,
)  # fmt: skip
HELP_OPTION_GROUP = "Help"  # --help itself (click adds it, ungrouped)


class GroupedOption(click.Option):
    """An option that says which `--help` group it is listed in."""

    def __init__(self, *args: Any, group: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


def option(group: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    """`click.option` listed under `group` in `--help`."""
    return click.option(*decls, cls=GroupedOption, group=group, **attrs)


def option_group(param: click.Parameter) -> str | None:
    """The `--help` group of a parameter (None: an argument, or an ungrouped option)."""
    if isinstance(param, GroupedOption):
        return param.group
    if isinstance(param, click.Option) and "--help" in param.opts:
        return HELP_OPTION_GROUP
    return None


class GroupedHelp(click.Command):
    """A command whose `--help` lists its options in HELP_GROUPS sections, not one list of
    dozens (an ungrouped option lands under "Other options", which a test forbids)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                group = option_group(param) or "Other options"
                sections.setdefault(group, []).append(record)
        order = [*HELP_GROUPS, HELP_OPTION_GROUP]
        for name in sorted(sections, key=lambda n: order.index(n) if n in order else len(order)):
            with formatter.section(f"{name} options" if name in HELP_GROUPS else name):
                formatter.write_dl(sections[name])


Decorator = Callable[[Any], Any]


def _apply(options: Sequence[Decorator], func: F) -> F:
    for decorator in reversed(options):
        func = decorator(func)
    return func


NONCE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def check_nonce(_ctx: click.Context, _param: click.Parameter, nonce: str | None) -> str | None:
    """A nonce is recorded in run.json and shown: 1-64 letters, digits and `-_.`."""
    if nonce is not None and not NONCE.match(nonce):
        raise click.BadParameter(f"{nonce!r:.80} is not a nonce: use 1-64 letters, digits "
                                 "and -_. (e.g. the one a run.json records)",
                                 param_hint="--nonce")  # fmt: skip
    return nonce


# -- the shared option sets -----------------------------------------------------------------
# One definition per option, used by every command it applies to (`check`, `run`,
# `capacity`), so the commands never drift. To add an option that changes the workload
# (what `spec.override` applies) to all three, add it to SPEC_OPTIONS; to `run` and
# `capacity`, to RUN_STEP_OPTIONS. `tests/cli/test_options.py` names the `run` options that
# `capacity` does not take, each with its reason.

COUNT_OPTIONS: list[Decorator] = [
    option(LOAD, "--requests", type=click.IntRange(min=1, max=MAX_REQUESTS),
           help="Requests (or sessions, trajectories) per class, replacing the file's."),
    option(LOAD, "--duration", type=FiniteFloat(0, MAX_SPAN_S, low_open=True),
           help="Seconds of arrivals per class, replacing the file's."),
    option(LOAD, "--rate", help="The open-loop classes' arrivals per second in all (e.g. 8; "
           "each class keeps its share; closed-loop batches run as written), or a multiplier "
           "of their rates (2x)."),
]  # fmt: skip

SPEC_OPTIONS: list[Decorator] = [
    option(LOAD, "--seed", type=click.IntRange(min=0, max=MAX_SEED),
           help="Seed for arrivals, lengths and prompts (default: the file's, else 0)."),
    option(TARGET, "--api", type=click.Choice(APIS), metavar="NAME",
           help=f"API family ({', '.join(APIS)}), replacing target.api; the path follows it "
           "unless target.path is set."),
    option(TARGET, "--model", help="Model name sent in every request, replacing target.model."),
    option(TARGET, "--force-output-tokens/--no-force-output-tokens", default=None,
           help="Send ignore_eos + min_tokens (OpenAI APIs), replacing "
           "target.force_output_tokens; servers that reject them answer HTTP 422."),
    option(TARGET, "--accept-encoding", metavar="[CODINGS]", is_flag=False,
           flag_value=", ".join(CLIENT_CODINGS),
           help="Send Accept-Encoding as the users' clients do: alone, "
           f"'{', '.join(CLIENT_CODINGS)}' (the OpenAI SDK's); or the codings, e.g. gzip; none "
           "sends none. Replaces target.accept_encoding. Compressed streams are inflated as "
           "they arrive and timed by the compressed bytes. Put it after WORKLOAD, or give a "
           "value."),
    option(VERDICT, "--path-buffers/--no-path-buffers", default=None,
           help="The path to the server is known to buffer (a proxy or gateway that holds "
           "streams back): streams that arrive coalesced are judged as observed, not "
           "INCONCLUSIVE on TPOT/ITL. Replaces target.path_buffers."),
    option(TARGET, "--traceparent/--no-traceparent", default=None,
           help="Send each request a W3C traceparent of its own (a new trace id, sampled), "
           "kept in the records to join the server's spans; replaces target.traceparent "
           "(default on). A traceparent --header is sent as given instead."),
    option(LOAD, "--max-memory-gb", type=FiniteFloat(0, 1e6, low_open=True),
           help="Refuse a plan whose estimated client memory (plans, records and their "
           "audit) exceeds this many GiB (default: half of this host's memory)."),
    option(LOAD, "--cache", type=click.Choice(CACHE_MODES),
           help="cold: prompts start with a run nonce, so nothing is cached from an earlier "
           "run; warm: the same bytes as every run of this file and seed; reset: those, after "
           "asking the server to empty its prefix cache. Replaces the file's `cache` "
           "(default cold)."),
    option(LOAD, "--nonce", callback=check_nonce,
           help="A cold run's nonce (run.json's cache.nonce), to send exactly the bytes of "
           "that run again (default: drawn per run and recorded)."),
    option(VERDICT, "--confidence", type=FiniteFloat(0.5, 1, low_open=True), metavar="LEVEL",
           help="Confidence of every SLO verdict, e.g. 0.95: MET and MISSED are each wrong "
           "at most 1 − LEVEL of the time; replaces every class's slo.confidence (default "
           "0.95). `check` says how many requests each check needs at it."),
]  # fmt: skip

URL_OPTION = option(
    TARGET, "--url",
    help="Base URL of the endpoint, e.g. http://127.0.0.1:8000. Without it (and without "
    "target.url) the built-in simulator is started.",
)  # fmt: skip

# TLS and forward proxies (`engine.network`): every connection a command makes (the
# target, the preflight, the scraper, the cache reset, the OTLP push) uses them.
NETWORK_OPTIONS: list[Decorator] = [
    option(NETWORK, "--cacert", metavar="FILE",
           help="Trust only the CA certificates in FILE (PEM) when verifying servers "
           "(default: the system store, or SSL_CERT_FILE / SSL_CERT_DIR)."),
    option(NETWORK, "--cert", metavar="FILE",
           help="Client certificate (PEM) for mutual TLS, shown to servers that ask for one; "
           "its key in --key, or in the same file."),
    option(NETWORK, "--key", metavar="FILE",
           help="The unencrypted private key (PEM) of --cert."),
    option(NETWORK, "--insecure", is_flag=True,
           help="Do not verify TLS certificates (test servers only: requests and their "
           "credentials go to whoever answers). Said on the terminal, recorded in run.json."),
    option(NETWORK, "--proxy", metavar="URL|none",
           help="Forward proxy for every connection: http://[USER:PASSWORD@]HOST:PORT (https "
           "targets through a CONNECT tunnel). Default: HTTPS_PROXY, HTTP_PROXY or ALL_PROXY "
           "as curl reads them, less the hosts in NO_PROXY; none: no proxy at all."),
]  # fmt: skip

RUN_STEP_OPTIONS: list[Decorator] = [
    option(TARGET, "--header", "headers", multiple=True, metavar="NAME:VALUE",
           help="Extra request header (repeatable); ${VAR} is read from the environment. "
           "Its value is redacted from every output unless the name is a harmless one "
           "(Content-Type, Accept, User-Agent, X-Request-Id, traceparent, ...)."),
    *NETWORK_OPTIONS,
    option(TARGET, "--no-preflight", is_flag=True,
           help="Skip the one-request check of the target."),
    option(TARGET, "--preflight-timeout", "preflight_timeout_s",
           type=FiniteFloat(0, MAX_WAIT_S, low_open=True),
           help="The preflight's overall deadline in seconds (default: the longest "
           "deadlines.first_token_s of the classes; never more than --watchdog)."),
    option(LOAD, "--warm-connections", "warm_text", default="auto", show_default=True,
           metavar="N|auto|0",
           help="Connections opened (and checked) before t0, so the first sends carry no "
           "connection setup in their latency; auto: the requests that can be in flight in "
           "the first second (capped at 1024); 0: today's cold start (setup inside TTFT)."),
    option(LOAD, "--workers", type=click.IntRange(min=1, max=256),
           help="Engine processes sharing the schedule (default 1; one per core when the "
           "expected peak exceeds this host's calibrated envelope). Capped at the plan's "
           "requests and flows; more than this host's cores is warned about."),
    option(TIMING, "--lag-bound-ms", type=FiniteFloat(0, 3_600_000, low_open=True),
           help="A strict bound on the client's send-lag p99: above it, exit 3 (a capacity "
           "step: invalid) whatever the verdict. Without it (the default) the run falls "
           "behind only when the client's lag could have changed the verdict (the lag is "
           "charged to TTFT/E2E: see docs/metrics.md)."),
    option(TIMING, "--grace", "grace_s", type=FiniteFloat(0, 86_400), default=5.0,
           show_default=True, help="Seconds in-flight requests get to finish after Ctrl-C."),
    option(TIMING, "--watchdog", "watchdog_s", type=FiniteFloat(0, MAX_WAIT_S, low_open=True),
           default=300.0, show_default=True,
           help="Abort (exit 4) when nothing progresses this many seconds while requests "
           "are due."),
    option(SERVER_METRICS, "--server-metrics-url", metavar="URL",
           help="Scrape the server's Prometheus endpoint during the run: a URL, or a path on "
           "the target such as /metrics (default: the workload's target.server_metrics_url)."),
    option(SERVER_METRICS, "--server-metrics-header", "metrics_headers", multiple=True,
           metavar="NAME:VALUE",
           help="Header sent with each scrape (repeatable; ${VAR} is read from the "
           "environment): the endpoint's own credentials. The target's are sent only to the "
           "target's origin."),
    option(SERVER_METRICS, "--server-metrics-interval", "server_metrics_interval_s",
           type=FiniteFloat(0.05, 3600),
           help="Seconds between scrapes (default: target.server_metrics_interval_s, else 1)."),
    option(OUTPUT, "-q", "--quiet", is_flag=True, help="No progress line, only the final table."),
    option(VERDICT, "--verdict", type=click.Choice(RULES), default=INTERVAL, show_default=True,
           help="interval: a check is MET when its confidence bound meets the target, MISSED "
           "when the other misses it, else INCONCLUSIVE (exit 7); point: MET when the point "
           "estimate meets it (the rule before confidence). Recorded in run.json."),
]  # fmt: skip


def workload_options(func: F) -> F:
    """--requests, --duration, --rate and SPEC_OPTIONS: what `check` and `run` both change."""
    return _apply([*COUNT_OPTIONS, *SPEC_OPTIONS], func)


def spec_options(func: F) -> F:
    """SPEC_OPTIONS: --seed, --api, --model, --force-output-tokens, --accept-encoding,
    --path-buffers, --traceparent, --max-memory-gb, --cache, --nonce, --confidence."""
    return _apply(SPEC_OPTIONS, func)


def run_step_options(func: F) -> F:
    """RUN_STEP_OPTIONS: how one run (or capacity step) reaches and paces the target."""
    return _apply(RUN_STEP_OPTIONS, func)


def network_options(func: F) -> F:
    """NETWORK_OPTIONS: --cacert, --cert, --key, --insecure, --proxy."""
    return _apply(NETWORK_OPTIONS, func)


def read_network(opts: dict[str, Any]) -> Network:
    """The command's TLS and proxy settings from NETWORK_OPTIONS and the environment,
    checked now (a file that cannot be used, contradictory flags, a proxy URL that is
    not one: exit 1 before anything is sent)."""
    tls = TlsSettings.from_environment(
        cacert=opts.get("cacert"), cert=opts.get("cert"), key=opts.get("key"),
        insecure=bool(opts.get("insecure")),
    )  # fmt: skip
    check_settings(tls)
    proxies = ProxySettings.from_environment(opts.get("proxy"))
    if proxies.flag is not None and not proxies.off:
        proxies.configured("https")  # a --proxy that is no proxy URL is refused here
    return Network(tls=tls, proxies=proxies)


def url_option(func: F) -> F:
    """--url (first in `--help`, so a decorator of its own)."""
    return URL_OPTION(func)


def shared_spec(workload: Path, opts: dict[str, Any]) -> WorkloadSpec:
    """The workload file with the shared options applied (`spec.override`)."""
    spec = override(
        load(workload), requests=opts.get("requests"), duration_s=opts.get("duration"),
        rate=opts.get("rate"), api=opts.get("api"), model=opts.get("model"),
        force_output_tokens=opts.get("force_output_tokens"), cache=opts.get("cache"),
        confidence=opts.get("confidence"), accept_encoding=opts.get("accept_encoding"),
        path_buffers=opts.get("path_buffers"), traceparent=opts.get("traceparent"),
    )  # fmt: skip
    if opts.get("nonce") is not None and spec.cache != "cold":
        raise OptionError("--nonce", f"applies to cache: cold, not {spec.cache}",
                          "drop --nonce, or add --cache cold")  # fmt: skip
    return spec


def check_run_step_options(opts: dict[str, Any], spec: WorkloadSpec) -> None:
    """What RUN_STEP_OPTIONS can get wrong, refused before anything is sent."""
    check_url(opts["url"])
    metrics_url = opts["server_metrics_url"]
    if metrics_url is not None and (problem := metrics_url_problem(metrics_url)):
        raise click.BadParameter(f"it {problem}", param_hint="--server-metrics-url")
    if opts["metrics_headers"] and not (metrics_url or spec.target.server_metrics_url):
        raise OptionError("--server-metrics-header", "scrapes nothing: no "
                          "metrics URL", "add --server-metrics-url URL (or a path such as "
                          "/metrics), or set target.server_metrics_url")  # fmt: skip


# The options whose value is read before it is a RunOptions field: destination -> (field,
# reader). Every other option whose destination names a RunOptions field is passed as given.
_READ_INTO_RUN: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "no_preflight": ("check_target", lambda skip: not skip),
    "headers": ("extra_headers", lambda values: parse_headers(values)),
    "warm_text": ("warm_connections", lambda text: parse_warm(text)),
    "metrics_headers": ("server_metrics_headers",
                        lambda values: parse_headers(values, "--server-metrics-header")),
}  # fmt: skip
RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunOptions))


def shared_run_options(opts: dict[str, Any], **own: Any) -> RunOptions:
    """The RunOptions the command's options make: each option named as a RunOptions field
    is passed as given, those in `_READ_INTO_RUN` read first; `own` is what the command
    adds (e.g. --run-id, the shard). Options that change the workload (`--requests`,
    `--api`, ...) are the spec's, applied by `override`."""
    values: dict[str, Any] = {"network": read_network(opts)}
    for name, value in opts.items():
        if name in _READ_INTO_RUN:
            field, read = _READ_INTO_RUN[name]
            values[field] = read(value)
        elif name in RUN_FIELDS:
            values[name] = value
    return RunOptions(**{**values, **own})


def parse_warm(text: str) -> int | None:
    """`--warm-connections`: a count >= 0, or auto (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if not 0 <= count <= 1_000_000:
        problem = f"must be auto or a count 0..1000000 (got {text!r})"
        fix = "e.g. --warm-connections auto, 512, or 0 for a cold start"
        raise OptionError("--warm-connections", problem, fix)
    return count


def check_memory_line(spec: Any, seed: int | None, max_memory_gb: float | None) -> str:
    """Refuse a plan over the memory cap (before building it); the line `check` prints."""

    cap, source = memory_cap(max_memory_gb)
    estimate = check_memory(spec, cap, source, seed)
    return f"client memory: {estimate.text()} (cap {size_text(cap)}: {source})"


class _PipedConsole(Console):
    """rich's console, but a reader that stopped reading (`| head -1`) is the quiet exit 0
    of `cli.exits`, not rich's own exit 1; and, with `fit_tables`, a table wider than the
    console is printed whole at its own width instead of cut (`judg…`, `100.…`)."""

    def __init__(self, *, fit_tables: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fit_tables = fit_tables

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError

    def print(self, *objects: Any, **kwargs: Any) -> None:
        wanted = max((_table_width(self, o) for o in objects), default=0)
        if not self.fit_tables or wanted <= self.width:
            super().print(*objects, **kwargs)
            return
        width = self.width
        self.width = wanted  # the lines of text printed with it wrap there too
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width


def _table_width(console: Console, renderable: Any) -> int:
    """The width a table needs to show every cell whole (0 for what is not a table): the
    widest table in a renderable or a group of them."""
    if isinstance(renderable, Group):
        return max((_table_width(console, r) for r in renderable.renderables), default=0)
    if not isinstance(renderable, Table):
        return 0
    unbounded = console.options.update_width(UNBOUNDED_WIDTH)
    return Measurement.get(console, unbounded, renderable).maximum


UNBOUNDED_WIDTH = 10_000  # wider than any table loadgen prints: measures it uncut
PIPED_WIDTH = 120  # text off a terminal wraps here when $COLUMNS does not say otherwise


def output_console() -> Console:
    """stdout for tables and lines. On a terminal, its width. Piped to a file or a CI log:
    $COLUMNS when set, else 120 columns, and a table wider than that printed whole at its
    own width (a log has no width to cut it to), so a CI log reads as the terminal does.

    Without rich's markup: text is printed as it is, so a path (`--out 'runs[prod]'`) or a
    server's text with `[...]` in it is neither eaten as a style tag nor a MarkupError
    (`[/]`); styles are given as `style=`."""
    if sys.stdout.isatty():
        return _PipedConsole(highlight=False, markup=False)
    columns = os.environ.get("COLUMNS", "")
    width = None if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH
    return _PipedConsole(highlight=False, markup=False, width=width, fit_tables=True)


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


def check_report_paths(*paths: tuple[str, Path | None]) -> None:
    """--junit / --markdown must land in an existing folder: checked before any traffic."""
    for flag, path in paths:
        if path is not None and not (path.parent if str(path.parent) else Path(".")).is_dir():
            raise OptionError(flag, f"the folder of {path} does not exist",
                              "create it first, or write the file elsewhere")  # fmt: skip


def write_text(path: Path, text: str) -> None:
    """A --junit or --markdown file; a failed write is an error naming it, not a traceback."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise LoadgenError(f"cannot write {path}: {exc.strerror}") from None
