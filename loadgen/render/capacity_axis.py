"""The load axis of a capacity search: what one load is on the terminal, in capacity.json
and on knee.png. In rate mode a load multiplies the workload's open-loop rate
(`workload.spec.offered_rate`, the one definition `--rate` uses too), shown with its total
in its unit (`6x (12 req/s)`); with `--param max_in_flight` it is a cap."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.workload.spec import WorkloadSpec, offered_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadAxis:
    """What a load of the search is on the page: in rate mode a multiplier of the file's
    open-loop rate (`workload.spec.offered_rate`) shown with its total, else a cap."""

    param: str
    scale: float  # the unit per load: the file's open-loop rate (1.0 when unknown or a cap)
    unit: str  # `req/s`, `sessions/s`, ...; "" when the total is unknown (a trace replay)
    title: str  # the plot's axis title

    def text(self, load: float) -> str:
        """A load as the user gave it: `4 in flight`, `6x (12 req/s)`, or `2x`."""
        if self.param == "max_in_flight":
            return f"{load:g} in flight"
        return f"{load:.3g}x ({load * self.scale:.3g} {self.unit})" if self.unit else f"{load:.3g}x"

    def value(self, load: float) -> float:
        """The load on the axis's own scale (its total in `unit`, or the cap)."""
        return load * self.scale


def load_axis(spec: WorkloadSpec, param: str) -> LoadAxis:
    """The axis of a search over `param` for this workload."""
    if param == "max_in_flight":
        return LoadAxis(param=param, scale=1.0, unit="",
                        title="max in flight (concurrent requests)")  # fmt: skip
    offered = offered_rate(spec)
    if offered.per_s is None:
        return LoadAxis(param=param, scale=1.0, unit="",
                        title="load (× the workload's open-loop rates)")  # fmt: skip
    outside = (f"; {', '.join(offered.closed_loop)} closed-loop, outside it"
               if offered.closed_loop else "")  # fmt: skip
    title = f"offered load ({offered.unit}: {', '.join(offered.open_loop)}{outside})"
    return LoadAxis(param=param, scale=offered.per_s, unit=offered.unit, title=title)
