"""The blocks a run report is made of, which both renderers share, and their text helpers.

Blocks hold plain text; `html` and `markdown` escape it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.results.summary import SloAudit


@dataclass(frozen=True, slots=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True, slots=True)
class Para:
    text: str
    tone: str = ""  # "", "warn" or "bad": a banner


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    caption: str


@dataclass(frozen=True, slots=True)
class Details:
    summary: str
    blocks: Sequence[Block]
    is_open: bool


Block = Heading | Para | Table | Figure | Details


def verdict_word(slo: SloAudit) -> str:
    """A class's verdict: MET / MISSED / INCONCLUSIVE / partial, or "no SLO" for a class
    without targets."""
    if not slo.checks and slo.met is not None and not slo.judged_by:
        return "no SLO"
    judged = slo.judged
    return "partial" if judged is None else judged.upper()


def met_word(met: bool | None) -> str:
    """MET / MISSED; "partial" where nothing was judged (a run that stopped early)."""
    return "partial" if met is None else ("MET" if met else "MISSED")


def pct(value: float | None) -> str:
    """A share as a percentage with one decimal ("—" when missing)."""
    return f"{value * 100:.1f}%" if value is not None else "—"


def count(value: int | None) -> str:
    """A count with thousands separators, as every table and line shows one ("—" when
    missing): `5,680`, never `5680` beside `5,736`."""
    return "—" if value is None else f"{value:,}"


def num(value: float | None, unit: str = "") -> str:
    """A number as people read it: whole with thousands separators, else two decimals (none
    from 1,000 up), with its unit ("—" when missing)."""
    if value is None:
        return "—"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}{unit}"
    return f"{value:,.2f}{unit}" if abs(value) < 1000 else f"{value:,.0f}{unit}"
