"""The shared option set: `capacity` takes every `run` option that applies, defined once,
each reaches every step; every option of `run`, `capacity` and `check` is in one help group."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from loadgen.cli.capacity import capacity
from loadgen.cli.check import check
from loadgen.cli.options import HELP_GROUPS, option_group, output_console
from loadgen.cli.run import run
from loadgen.testing.builders import workload_file

# The `run` options `capacity` does not take, each with its reason. A new `run` option
# lands in `capacity` (through loadgen.cli.options) or here, with a reason: never silently.
RUN_ONLY = {
    "requests": "each step's count is planned by the search (--min-tail, --min-lifetimes)",
    "duration": "each step's length is planned by the search (--min-tail, --min-lifetimes)",
    "rate": "the load is what the search steps (--param rate, --start, --max, --steps)",
    "max_in_flight": "the cap is what --param max_in_flight steps",
    "run_id": "the steps are named step-NN inside --out",
    "shard_text": "a search is judged step by step on all of a step's records: not sharded",
    "start_at_text": "goes with --shard",
    "sim_trace": "capacity starts one simulator for every step; a trace is per run",
    "dry_run": "a step's plan depends on the lifetimes measured at the steps before it",
    "repeats": "a step is run again when inconclusive (--max-extend); repeats are run's",
    "start_when_told": "goes with --shard (the side of a shard that --ray starts)",
}
# Options both take with a meaning of their own (so not from the shared set).
OWN_MEANING = {"out_dir": "run: the results store; capacity: the search's own folder",
               "junit_path": "run: the SLO checks; capacity: the search's answer",
               "markdown_path": "run: the SLO checks; capacity: the search's answer"}  # fmt: skip


def options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


def test_capacity_takes_every_run_option_that_applies() -> None:
    """run's options less capacity's are exactly RUN_ONLY: --model, --api, --header,
    --server-metrics-url, --warm-connections, --lag-bound-ms ... are all on capacity."""
    missing = set(options(run)) - set(options(capacity))
    assert missing == set(RUN_ONLY), f"run options missing from capacity: {missing - set(RUN_ONLY)}"
    for name in ("model", "api", "headers", "server_metrics_url", "warm_text",
                 "force_output_tokens", "lag_bound_ms", "watchdog_s", "workers"):  # fmt: skip
        assert name in options(capacity), name


def test_the_shared_options_are_one_definition() -> None:
    """Every option both commands take has the same flags, type, default and help."""
    ours, theirs = options(run), options(capacity)
    shared = (set(ours) & set(theirs)) - set(OWN_MEANING)
    assert len(shared) >= 24  # run has 36 options, 11 its own, --out of each its own
    for name in shared:
        a, b = ours[name], theirs[name]
        assert (a.opts, a.secondary_opts, a.default, a.help, a.multiple) == (
            b.opts, b.secondary_opts, b.default, b.help, b.multiple,
        ), name  # fmt: skip
        assert type(a.type) is type(b.type)
        assert a.type.to_info_dict() == b.type.to_info_dict()


def test_check_takes_the_workload_options_of_run() -> None:
    """check shares run's definitions of what changes the plan."""
    for name in ("requests", "duration", "rate", "seed", "api", "model", "force_output_tokens",
                 "max_memory_gb"):  # fmt: skip
        assert options(check)[name].help == options(run)[name].help


SECTION = re.compile(r"^(\S.*):$")


def help_sections(command: click.Command) -> dict[str, str]:
    """`--help`'s option sections: title -> body."""
    text = CliRunner().invoke(command, ["--help"], terminal_width=100).output
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = SECTION.match(line)
        if match:
            current = match.group(1)
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {title: "\n".join(body) for title, body in sections.items()}


@pytest.mark.parametrize("command", [run, capacity, check], ids=["run", "capacity", "check"])
def test_every_option_is_listed_in_exactly_one_help_group(command: click.Command) -> None:
    sections = help_sections(command)
    titles = [t for t in sections if t.endswith(" options")]
    assert titles
    assert "Other options" not in sections, list(sections)
    assert all(t.removesuffix(" options") in HELP_GROUPS for t in titles)
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:  # hidden: not for people
            continue
        assert option_group(param) in HELP_GROUPS, param.name
        flag = max(param.opts, key=len)
        entry = re.compile(rf"^  (?:-\w, )?{re.escape(flag)}(?: |$)", re.M)  # an entry, not a help
        where = [t for t in titles if entry.search(sections[t])]
        assert len(where) == 1, (flag, where)
        assert option_group(param) + " options" == where[0]


def test_run_help_is_grouped_not_one_list() -> None:
    """No section of run --help holds more than a dozen options (it was 37 in one)."""
    sections = help_sections(run)
    for title, body in sections.items():
        if title.endswith(" options"):
            flags = re.findall(r"^  (?:-\w, )?--[\w-]+", body, flags=re.M)
            assert len(flags) <= 12, (title, len(flags))


WORKLOAD = """\
name: shared
target: {api: openai-chat, model: from-the-file}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 16}
    requests: 50
    prompt_tokens: {dist: fixed, value: 16}
    output_tokens: {dist: fixed, value: 20}
    slo: {ttft_ms: 5000, percentile: 90}
    deadlines: {first_token_s: 60, stall_s: 30, total_s: 120}
sim: {speed: 4, max_batch: 8, decode_table: 25, prefill_tokens_per_s: 1000000000}
"""


def test_every_shared_option_reaches_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step's RunOptions and spec carry what the command line said (the steps are
    faked: the search stops after the first)."""
    import loadgen.studies.capacity as studies

    seen: list[tuple[Any, Any]] = []

    def fake_run_one_against(url: str, *, options: Any, out: Path, live: Any, ray: Any) -> Any:
        def run_one(spec: Any, cap: int | None, run_id: str) -> Any:
            seen.append((spec, studies.replace(options, url=url, run_id=run_id)))
            raise SystemExit(0)

        return run_one

    monkeypatch.setattr("loadgen.cli.capacity.run_one_against", fake_run_one_against)
    monkeypatch.setenv("SHARED_TOKEN", "s3cret")
    path = workload_file(tmp_path, WORKLOAD)
    args = [str(path), "--url", "http://127.0.0.1:9", "--model", "m-x", "--api", "anthropic",
            "--no-force-output-tokens", "--header", "Authorization: Bearer ${SHARED_TOKEN}",
            "--server-metrics-url", "/metrics", "--server-metrics-header", "X-M: 1",
            "--server-metrics-interval", "0.5", "--warm-connections", "3", "--workers", "2",
            "--lag-bound-ms", "77", "--grace", "2", "--watchdog", "9", "--no-preflight",
            "--preflight-timeout", "4", "--seed", "5", "--price-per-hour", "2", "--replicas",
            "3", "-q", "--out", str(tmp_path / "out"), "--steps", "1x"]  # fmt: skip
    result = CliRunner().invoke(capacity, args)
    assert result.exit_code == 0, result.output
    spec, opts = seen[0]
    assert (spec.target.model, spec.target.api, spec.target.force_output_tokens) == (
        "m-x", "anthropic", False)  # fmt: skip
    assert opts.extra_headers == {"Authorization": "Bearer ${SHARED_TOKEN}"}
    assert opts.server_metrics_url == "/metrics"
    assert opts.server_metrics_headers == {"X-M": "1"}
    assert opts.server_metrics_interval_s == 0.5
    assert (opts.warm_connections, opts.workers, opts.lag_bound_ms) == (3, 2, 77.0)
    assert (opts.grace_s, opts.watchdog_s, opts.preflight_timeout_s) == (2.0, 9.0, 4.0)
    assert (opts.check_target, opts.seed, opts.quiet) == (False, 5, True)
    assert (opts.price_per_hour, opts.replicas) == (2.0, 3)
    assert opts.url == "http://127.0.0.1:9"


@pytest.mark.slow
def test_capacity_steps_on_the_simulator_run_with_the_shared_options(tmp_path: Path) -> None:
    """Against the built-in simulator: every step's run.json has the --model and --api of
    the command line (not the file's), the lag bound, and scraped /metrics."""
    path = workload_file(tmp_path, WORKLOAD)
    out = tmp_path / "out"
    result = CliRunner().invoke(capacity, [
        str(path), "--out", str(out), "-q", "--model", "served-name", "--api",
        "openai-completions", "--lag-bound-ms", "400", "--server-metrics-url", "/metrics",
        "--server-metrics-interval", "0.2", "--warm-connections", "0", "--steps", "0.5x,1x",
        "--min-tail", "5",
    ])  # fmt: skip
    assert result.exit_code in (0, 2), result.output
    steps = sorted((out / "steps").iterdir())
    assert len(steps) >= 2
    for step in steps:
        info = json.loads((step / "run.json").read_text())
        assert info["target"]["model"] == "served-name"
        assert info["target"]["api"] == "openai-completions"
        assert info["target"]["url"].endswith("/v1/completions")
        assert info["options"]["lag_bound_ms"] == 400
        assert info["server_metrics"]["scrapes"] >= 1
        assert (step / "server_metrics.parquet").exists()


HEADER_WORKLOAD = WORKLOAD.replace(
    "target: {api: openai-chat, model: from-the-file}",
    "target: {api: openai-chat, model: m, headers: {X-File: '${%s}'}}",
)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--dry-run", "--header", "Authorization: Bearer ${LOADGEN_UNSET_KEY}"],
        ["capacity", "--url", "http://127.0.0.1:9", "--steps", "1x", "--header",
         "Authorization: Bearer ${LOADGEN_UNSET_KEY}"],
        ["run", "--dry-run", "--server-metrics-url", "/metrics", "--server-metrics-header",
         "Authorization: Bearer ${LOADGEN_UNSET_KEY}"],
    ],
    ids=["run", "capacity", "metrics-header"],
)  # fmt: skip
def test_an_unset_variable_in_a_header_flag_names_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """A missing ${VAR} in --header is the flag's, not the workload file's."""
    from loadgen.cli import cli

    monkeypatch.delenv("LOADGEN_UNSET_KEY", raising=False)
    monkeypatch.setenv("LOADGEN_SET", "v")
    path = workload_file(tmp_path, HEADER_WORKLOAD % "LOADGEN_SET")
    command, *rest = args
    result = CliRunner().invoke(cli, [command, str(path), "--out", str(tmp_path / "o"), *rest])
    assert result.exit_code == 1, result.output
    flag = rest[-2]
    assert result.stderr.startswith(
        f"error: {flag} 'Authorization: Bearer ${{LOADGEN_UNSET_KEY}}': LOADGEN_UNSET_KEY is "
        "not set (export LOADGEN_UNSET_KEY=..."
    ), result.stderr
    assert str(path) not in result.stderr
    assert "Traceback" not in result.output


def test_an_unset_variable_in_the_files_header_still_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loadgen.cli import cli

    monkeypatch.delenv("LOADGEN_UNSET_KEY", raising=False)
    path = workload_file(tmp_path, HEADER_WORKLOAD % "LOADGEN_UNSET_KEY")
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--header", "X-Other: 1"])
    assert result.exit_code == 1, result.output
    assert f"{path}: target.headers.X-File: ${{LOADGEN_UNSET_KEY}} is not set" in result.stderr
    # ... unless the flag replaces that header: then the file's value is never read
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--header", "X-File: 1"])
    assert result.exit_code == 0, result.output


# `run` options that are not RunOptions fields, each with where it goes instead. A new
# option is a RunOptions field of the same name (passed as given), one `_READ_INTO_RUN`
# reads, or listed here: never silently dropped on its way to the run.
NOT_RUN_OPTIONS = {
    "requests": "the spec's (override)", "duration": "the spec's (override)",
    "rate": "the spec's (override)", "api": "the spec's (override)",
    "model": "the spec's (override)", "force_output_tokens": "the spec's (override)",
    "cache": "the spec's (override)", "max_memory_gb": "checked before the plan is built",
    "confidence": "the spec's (override: every class's slo.confidence)",
    "accept_encoding": "the spec's (override: target.accept_encoding)",
    "path_buffers": "the spec's (override: target.path_buffers)",
    "traceparent": "the spec's (override: target.traceparent)",
    "shard_text": "parsed into RunOptions.shard", "start_at_text": "parsed into start_at_unix_ns",
    "dry_run": "run() stops before execute", "repeats": "run() runs execute that many times", "prometheus_listen": "the live exporter's",
    "prometheus_grace_s": "the live exporter's", "otlp_endpoint": "the live exporter's",
    "otlp_interval_s": "the live exporter's", "junit_path": "written from the summary",
    "markdown_path": "written from the summary",
    "ray_address": "cli.ray_options: RayOptions", "ray_shards": "cli.ray_options: RayOptions",
    "max_clock_skew_ms": "cli.ray_options: RayOptions",
    **dict.fromkeys(("cacert", "cert", "key", "insecure", "proxy"), "read with the environment into RunOptions.network (cli.options.read_network)"),
}  # fmt: skip


def test_every_run_option_reaches_run_options_or_says_where_it_goes() -> None:
    """Each `run` option becomes the RunOptions field of its name, is read into one, or is
    listed with where it goes; and each RunOptions field set from the command line has one."""
    from loadgen.cli.options import _READ_INTO_RUN, RUN_FIELDS

    dests = set(options(run))
    unplaced = dests - RUN_FIELDS - set(_READ_INTO_RUN) - set(NOT_RUN_OPTIONS)
    assert not unplaced, f"run options that reach no RunOptions field: {sorted(unplaced)}"
    reached = (dests & RUN_FIELDS) | {field for field, _ in _READ_INTO_RUN.values()}
    assert not (set(NOT_RUN_OPTIONS) & RUN_FIELDS), "an option listed as not a field is one"
    # every field but those the run sets itself (none today) comes from an option
    own = {"shard", "start_at_unix_ns", "network"}  # parsed or read from several options
    assert RUN_FIELDS - reached - own == set(), RUN_FIELDS - reached


def test_shared_run_options_passes_each_option_as_given() -> None:
    """An option named as a field arrives unchanged; the read ones are read."""
    from loadgen.cli.options import shared_run_options

    made = shared_run_options(
        {"url": "http://h:1", "seed": 7, "lag_bound_ms": 9.5, "no_preflight": True,
         "headers": ("X-A: 1",), "warm_text": "12", "metrics_headers": (), "workers": 3,
         "requests": 40}, run_id="r1",
    )  # fmt: skip
    assert (made.url, made.seed, made.lag_bound_ms, made.workers, made.run_id) == (
        "http://h:1",
        7,
        9.5,
        3,
        "r1",
    )
    assert (made.check_target, dict(made.extra_headers), made.warm_connections) == (
        False,
        {"X-A": "1"},
        12,
    )


def test_the_output_console_prints_brackets_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    """A path like `runs[prod]/r` is printed whole (rich's markup ate `[prod]`), and text
    with `[/]` prints instead of raising a MarkupError."""
    console = output_console()
    console.print("records and summary: runs[prod]/r")
    console.print("a [/] and a [bold]x[/bold]")
    assert capsys.readouterr().out.splitlines() == [
        "records and summary: runs[prod]/r", "a [/] and a [bold]x[/bold]"]  # fmt: skip
