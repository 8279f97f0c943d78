"""`--otlp-receiver` and `--otlp-receiver-grace`, which `run` and `capacity` share, and
their checks before anything starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from loadgen.cli.options import OUTPUT, option
from loadgen.engine.otlp_receiver import GRPC, Address, parse_address
from loadgen.errors import OptionError

F = TypeVar("F", bound=Callable[..., Any])


def receiver_options(func: F) -> F:
    """--otlp-receiver, --otlp-receiver-grace."""
    func = option(
        OUTPUT, "--otlp-receiver-grace", "otlp_receiver_grace_s", type=click.FloatRange(0, 600),
        default=10.0, show_default=True,
        help="After the last response, wait up to this many seconds for the spans of the ok "
        "requests (servers export them in batches: vLLM every 5 s).",
    )(func)  # fmt: skip
    return option(
        OUTPUT, "--otlp-receiver", metavar="[grpc:][HOST:]PORT",
        help="Receive the server's OpenTelemetry spans on HOST:PORT (127.0.0.1 unless given; 0 "
        "picks a free port): OTLP/HTTP (protobuf or JSON), or OTLP/gRPC with grpc: (vLLM's "
        "default exporter, e.g. grpc:4317), and join them to the records by trace id, then "
        "request id: the run prints the URL to give the server as --otlp-traces-endpoint, "
        "keeps the spans in server-spans.parquet, says the join rate and splits TTFT by them "
        "(needs pip install 'loadgen[spans]'). The built-in simulator sends its own spans "
        "there.",
    )(func)  # fmt: skip


def check_receiver(text: str | None, *, simulator: bool, steps: bool = False) -> Address | None:
    """`--otlp-receiver` read, and refused where it cannot work: gRPC with the built-in
    simulator (it exports OTLP/HTTP); port 0 for a command of many runs (`steps`: each
    would listen on a port of its own, where the server is given one endpoint)."""
    if text is None:
        return None
    address = parse_address(text)
    if address.protocol == GRPC and simulator:
        raise OptionError("--otlp-receiver", "the built-in simulator (no --url) exports its "
                          "spans over OTLP/HTTP, not gRPC", "give --otlp-receiver [HOST:]PORT, "
                          "or a --url server that exports OTLP/gRPC")  # fmt: skip
    if steps and address.port == 0:
        raise OptionError("--otlp-receiver", "port 0 picks a new port for every step, where the "
                          "server is given one endpoint", "give a fixed port, e.g. grpc:4317 or "
                          "4318")  # fmt: skip
    return address
