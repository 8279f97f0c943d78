"""The live-export and price options `run`, `capacity` and `calibrate` share; the exporter."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from loadgen.cli.options import COST, LIVE, FiniteFloat, option
from loadgen.engine.network import Network
from loadgen.errors import OptionError
from loadgen.run.live import LiveExporter, parse_listen
from loadgen.workload.spec import redact_url

F = TypeVar("F", bound=Callable[..., Any])


def live_options(func: F) -> F:
    """--prometheus-port, --prometheus-grace, --otlp-endpoint, --otlp-interval."""
    for decorator in reversed(
        [
            option(
                LIVE, "--prometheus-port", "prometheus_listen", metavar="[ADDRESS:]PORT",
                help="Serve the run's live figures for Prometheus at http://ADDRESS:PORT/metrics "
                "(ADDRESS defaults to 127.0.0.1; port 0 picks a free one).",
            ),
            option(
                LIVE, "--prometheus-grace", "prometheus_grace_s", type=FiniteFloat(0, 86_400),
                default=15.0, show_default=True,
                help="Seconds the endpoint stays up after the run, for a last scrape.",
            ),
            option(
                LIVE, "--otlp-endpoint", metavar="URL",
                help="Push the same figures by OTLP/HTTP to this collector, e.g. "
                "http://127.0.0.1:4318/v1/metrics (needs pip install 'loadgen[otel]').",
            ),
            option(
                LIVE, "--otlp-interval", "otlp_interval_s", type=FiniteFloat(0.1, 3600),
                default=5.0, show_default=True, help="Seconds between OTLP pushes.",
            ),
        ]
    ):  # fmt: skip
        func = decorator(func)
    return func


def price_options(func: F) -> F:
    """--price-per-hour and --replicas: the run's cost per million (good) output tokens."""
    func = option(
        COST, "--replicas", type=click.IntRange(min=1, max=100_000), default=1, show_default=True,
        help="Replicas behind the URL: the fleet's price is --price-per-hour × this.",
    )(func)  # fmt: skip
    return option(
        COST, "--price-per-hour", "price_per_hour", type=FiniteFloat(0, 1e9, low_open=True),
        metavar="PRICE",
        help="Price of one replica per hour (or the fleet's, with --replicas 1): adds the cost "
        "per million output tokens and per million good output tokens to the summary.",
    )(func)  # fmt: skip


@contextlib.contextmanager
def open_live(
    prometheus_listen: str | None,
    prometheus_grace_s: float,
    otlp_endpoint: str | None,
    otlp_interval_s: float,
    *,
    price_per_hour: float | None = None,
    say: Callable[[str], None] | None = None,
    network: Network | None = None,
) -> Iterator[LiveExporter | None]:
    """The exporter the flags ask for (None without them); closed, after its grace, on exit.
    `say` prints where it serves (default: stderr)."""
    say = say or functools.partial(click.echo, err=True)
    if prometheus_listen is None and otlp_endpoint is None:
        yield None
        return
    if otlp_endpoint is not None and not otlp_endpoint.startswith(("http://", "https://")):
        raise OptionError(
            "--otlp-endpoint", f"{redact_url(otlp_endpoint)!r} is not an http(s) URL",
            "give the collector's OTLP/HTTP metrics URL, e.g. http://127.0.0.1:4318/v1/metrics",
        )  # fmt: skip
    address, port = parse_listen(prometheus_listen) if prometheus_listen else ("", None)
    live = LiveExporter(
        port=port, address=address, grace_s=prometheus_grace_s, otlp_endpoint=otlp_endpoint,
        otlp_interval_s=otlp_interval_s, price_per_hour=price_per_hour, network=network,
    )  # fmt: skip
    if live.url is not None:
        say(f"prometheus: serving the live figures at {live.url}")
    if otlp_endpoint is not None:
        shown = redact_url(otlp_endpoint)
        say(f"otlp: pushing the live figures to {shown} every {otlp_interval_s:g} s")
    try:
        yield live
    except BaseException:
        live.grace_s = 0.0  # the command failed: there is no final count to wait for
        live.close()
        raise
    live.close(log=say)
