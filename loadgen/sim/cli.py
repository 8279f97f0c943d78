"""`loadgen sim`: parse flags (over an optional `--config` YAML), validate, serve.

Flags override the file key by key; boolean flags can only switch a setting on.
`--fault NAME=PROB` entries are merged over the file's `faults:` mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from loadgen.errors import LoadgenError
from loadgen.sim.config import (
    API_NAMES,
    FAULT_NAMES,
    ROLE_MODES,
    SimConfig,
    config_from_mapping,
    load_config_file,
    parse_faults,
)
from loadgen.sim.server import run

_BOOL_FLAGS = ("no_done", "usage_in_finish", "close_after_stream", "per_request_metrics")


def build_config(
    config_path: Path | None, flags: dict[str, Any], fault_specs: tuple[str, ...]
) -> SimConfig:
    """Merge file settings, flags (those given) and `--fault` entries into a `SimConfig`."""
    settings: dict[str, Any] = load_config_file(config_path) if config_path else {}
    source = str(config_path) if config_path else "command line"
    for key, value in flags.items():
        if value is None or (key in _BOOL_FLAGS and value is False):
            continue
        settings[key] = value
        source = "command line" if config_path is None else f"{config_path} + command line"
    if fault_specs:
        try:
            cli_faults = parse_faults(list(fault_specs))
        except ValueError as exc:
            raise LoadgenError(f"--fault: {exc}") from None
        base = settings.get("faults") or {}
        settings["faults"] = {**base, **cli_faults} if isinstance(base, dict) else cli_faults
    return config_from_mapping(settings, source)


_SECONDS = "simulated seconds (divided by --speed)"


@click.command("sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file of settings (keys = flag names with underscores); flags override it.",
)
@click.option(
    "--api",
    type=click.Choice(API_NAMES),
    help="Dialect(s) to speak: 'all' serves each on its own path (/v1/chat/completions, "
    "/v1/completions, /v1/responses, /v1/messages, /generate_stream, /generate, /api/chat, "
    "/api/generate); one name serves only that API, on its paths and on '/'.  [default: all]",
)
@click.option("--host", help="Address to listen on.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="TCP port; 0 picks a free one.  [default: 8000]")
@click.option(
    "--prefill-tokens-per-s", type=float, help="Prefill rate per replica.  [default: 8000]"
)
@click.option(
    "--decode-table",
    metavar="B:MS,...",
    help="Decode step time by batch size, 'B:MS,...' (piecewise linear) or one number (flat)."
    "  [default: 16:20,32:30,64:55]",
)
@click.option("--decode-step-ms", "old_decode_step_ms", hidden=True)  # old: --decode-table
@click.option("--max-batch", type=int, help="Max running sequences.  [default: 32]")
@click.option(
    "--chunk-tokens", type=int, help="Prefill tokens per step; 0 = whole prompts.  [default: 0]"
)
@click.option(
    "--queue-cap", type=int, help="Waiting requests beyond this get 429; 0 = no cap.  [default: 0]"
)
@click.option(
    "--prefill-replicas",
    type=int,
    help="Disaggregate: a separate prefill pool of N replicas; 0 = colocated.  [default: 0]",
)
@click.option("--kv-transfer-ms", type=float, help="Prefill→decode hand-off when disaggregated.")
@click.option(
    "--speed", type=float, help="Run the same physics X times faster (tests).  [default: 1]"
)
@click.option(
    "--output-dist",
    help="Output length when not forced: 'fixed:300', 'exponential:mean=200', "
    "'lognormal:mean=200,cv=1'; capped by max_tokens.  [default: fixed:300]",
)
@click.option("--seed", type=int, help="Seed for output lengths and faults.  [default: 0]")
@click.option("--model", help="Model id to report.  [default: loadgen-sim]")
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write a JSON Lines trace.")
@click.option(
    "--otlp-traces-endpoint",
    metavar="URL",
    help="Send one OpenTelemetry span per request (vLLM's llm_request, its attribute names, "
    "the engine's exact queue and prefill times) to this OTLP/HTTP URL, parented under the "
    "request's traceparent (none for a not-sampled one); needs pip install 'loadgen[spans]'.",
)
@click.option(
    "--fault",
    "fault_specs",
    multiple=True,
    metavar="NAME=PROB",
    help=f"Inject a fault into a fraction of requests (repeatable): {', '.join(FAULT_NAMES)}.",
)
@click.option(
    "--fault-after-tokens", type=int, help="k for drop/stall/garbage; default: uniform random."
)
@click.option("--stall-s", type=float, help=f"Stall length, {_SECONDS}.  [default: 2]")
@click.option("--fault-status", type=int, help="Status for the status fault.  [default: 503]")
@click.option("--header-delay-s", type=float, help=f"Header delay, {_SECONDS}.  [default: 1]")
@click.option(
    "--role",
    type=click.Choice(ROLE_MODES),
    help="Role chunk / opening event (message_start, response.created): at accept, with the "
    "first token, or never where optional.  [default: first]",
)
@click.option("--no-done", is_flag=True, help="Omit 'data: [DONE]'.")
@click.option("--usage-in-finish", is_flag=True, help="Put usage in the finish chunk.")
@click.option(
    "--per-request-metrics",
    is_flag=True,
    help="vLLM's per-request metrics object in the final usage chunk (OpenAI dialects): the "
    "engine's exact queue, prefill and generation times, as vLLM's "
    "--enable-per-request-metrics sends them.",
)
@click.option("--tokens-per-chunk", type=int, help="Tokens per content chunk.  [default: 1]")
@click.option(
    "--reasoning-tokens", type=int, help="First k tokens as reasoning (each dialect's field)."
)
@click.option(
    "--heartbeat-s",
    type=float,
    help=f"Heartbeat interval (': ping' comment; Anthropic ping event), {_SECONDS}.",
)
@click.option(
    "--close-after-stream", is_flag=True, help="Close the connection after each response."
)
@click.option(
    "--empty-every",
    type=int,
    help="Every k-th token after the first as an empty-text token event (OpenAI, TGI), as "
    "llama-cpp-python sends partial UTF-8 tokens.  [default: 0 = never]",
)
@click.option(
    "--prefix-cache-tokens",
    type=int,
    help="Prefix cache capacity: a prompt's leading blocks seen before are not prefilled "
    "again and are reported as cached tokens; 0 = off.  [default: 0]",
)
@click.option("--prefix-block-tokens", type=int, help="Prefix cache block size.  [default: 16]")
@click.option(
    "--kv-capacity-tokens",
    type=int,
    help="KV-cache capacity that /metrics reports usage against.  [default: 262144]",
)
def sim(
    config_path: Path | None,
    fault_specs: tuple[str, ...],
    old_decode_step_ms: str | None,
    **flags: Any,
) -> None:
    """Serve a simulated streaming LLM whose timing follows a serving model, in every dialect.

    It speaks OpenAI chat/completions, OpenAI Responses, Anthropic Messages, TGI and
    Ollama, each on its usual path (or one of them only, with --api).

    Continuous batching up to --max-batch; each step decodes one token per running
    sequence (--decode-table: its step time by batch size) and prefills waiting prompts at
    --prefill-tokens-per-s (whole, or --chunk-tokens per step). Per-request faults and
    dialects via X-Sim-* headers (see loadgen.sim.faults). Prints one line,
    'loadgen sim listening on http://HOST:PORT', then serves until SIGINT/SIGTERM.

    Example:

    \b
        loadgen sim --port 8000
        loadgen sim --port 0 --speed 20 --chunk-tokens 160 --trace-file sim.jsonl
        loadgen sim --config sim.yaml --fault stall=0.01 --stall-s 2
        loadgen sim --api anthropic --port 8080 --fault error_after=0.05
    """
    if old_decode_step_ms is not None:  # the old name: it still works, saying its new one
        if flags["decode_table"] is not None:
            raise click.UsageError("--decode-step-ms is the old name of --decode-table: give one")
        click.echo("warning: --decode-step-ms is deprecated: its new name is --decode-table "
                   "(the old one still works)", err=True)  # fmt: skip
        flags["decode_table"] = old_decode_step_ms
    try:
        config = build_config(config_path, flags, fault_specs)
    except LoadgenError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        run(config)
    except LoadgenError as exc:  # a setting only serving can check (--otlp-traces-endpoint)
        raise click.ClickException(str(exc)) from None
