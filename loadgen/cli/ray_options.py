"""`--ray [ADDRESS]`, `--shards N`, `--max-clock-skew-ms`: the options `run` and `capacity`
share to shard a run over a Ray cluster (`run.scale.raycluster`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from loadgen.cli.options import CLUSTER, FiniteFloat, option
from loadgen.errors import OptionError
from loadgen.run.scale.cluster import MAX_CLOCK_SKEW_MS, RayOptions

F = TypeVar("F", bound=Callable[..., Any])
LOCAL = "local"  # `--ray` without a value: a local Ray started for the run


def ray_options(func: F) -> F:
    """--ray, --shards, --max-clock-skew-ms."""
    for decorator in reversed(
        [
            option(
                CLUSTER, "--ray", "ray_address", metavar="[ADDRESS]", is_flag=False,
                flag_value=LOCAL, default=None,
                help="Shard the run over a Ray cluster: `auto`, the head's HOST:PORT, or no "
                "value to start a local Ray for the run. Each shard runs on its own node, "
                "all start at one agreed time, their folders come back and are merged "
                "(needs pip install 'loadgen[ray]'). Put it after WORKLOAD, or give a value.",
            ),
            option(
                CLUSTER, "--shards", "ray_shards", type=click.IntRange(min=1, max=4096),
                help="With --ray: how many shards (default: one per alive node; more shards "
                "than nodes are placed with SPREAD, and said).",
            ),
            option(
                CLUSTER, "--max-clock-skew-ms", "max_clock_skew_ms",
                type=FiniteFloat(0, 60_000), default=MAX_CLOCK_SKEW_MS, show_default=True,
                help="With --ray: refuse the run, before any traffic, when a node's clock is "
                "further than this from the driver's (measured before the start).",
            ),
        ]
    ):  # fmt: skip
        func = decorator(func)
    return func


def ray_settings(
    ray_address: str | None, ray_shards: int | None, max_clock_skew_ms: float, **conflicts: Any
) -> RayOptions | None:
    """The Ray settings, or None without --ray; `conflicts`: options --ray replaces
    (flag name: value given), refused with the reason."""
    if ray_address is None:
        if ray_shards is not None:
            raise OptionError("--shards", "needs --ray", "add --ray (or --ray HOST:PORT)")
        return None
    for flag, value in conflicts.items():
        if value:
            raise OptionError(flag, "does not combine with --ray",
                              "--ray places and starts the shards itself; drop it")  # fmt: skip
    address = None if ray_address == LOCAL else ray_address
    return RayOptions(address=address, shards=ray_shards, max_clock_skew_ms=max_clock_skew_ms)
