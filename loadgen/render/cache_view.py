"""Cache warmth in words: the line beside a run's verdict, `check`'s plan line, and what
`compare` says of two sides' warmth (docs/cache-warmth.md).

Reads only `CacheWarmth` values (summary.json's `cache`); printing is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.results.summary import CacheWarmth

# Two sides of one mode whose prefix-cache hit shares differ by at least this much (share
# points, 0.10 = 10 %) differ in warmth all the same: one found what an earlier run cached.
HIT_SHARE_GAP = 0.10


def cache_line(cache: CacheWarmth) -> str:
    """`cache: cold (nonce 3f2a9c1d), prefix-cache hit share 3.1% (server's counters)`: how
    the run stood to the server's prefix cache, and what share of its prompt tokens the
    server served from it (its /metrics when scraped, else the responses' usage)."""
    text = f"cache: {cache.mode}"
    if cache.nonce is not None:
        text += f" (nonce {cache.nonce})"
    elif cache.reset is not None:
        text += f" ({cache.reset})"
    if cache.server_hit_share is not None:
        text += f", prefix-cache hit share {cache.server_hit_share:.1%} (server's counters)"
    elif cache.usage_hit_share is not None:
        text += f", prefix-cache hit share {cache.usage_hit_share:.1%} (responses' usage)"
    return text


CACHE_PLAN = {
    "cold": "prompts start with a run nonce{nonce}: nothing is cached from an earlier run",
    "warm": "the same bytes as every run of this file and seed: an earlier run's prompts "
    "may be cached",
    "reset": "the same bytes as every run of this file and seed, after asking the server to "
    "empty its prefix cache",
}


def cache_plan_line(mode: str, nonce: str | None) -> str:
    """What `check` says of the cache mode a run would use."""
    given = f" ({nonce}, given)" if nonce else " (drawn per run, recorded in run.json)"
    return f"cache: {mode}: " + CACHE_PLAN[mode].format(nonce=given)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSide:
    """One side of a comparison: its runs' cache modes and mean hit share (None: unknown).

    A run recorded before cache modes (summary.json without `cache`) sent the same bytes
    every run: it counts as `warm`, and the side says how many such runs it holds."""

    modes: tuple[str, ...]  # sorted, distinct
    hit_share: float | None
    unrecorded: int = 0  # runs written before cache modes

    @classmethod
    def of(cls, caches: Sequence[CacheWarmth | None]) -> CacheSide:
        modes = tuple(sorted({c.mode if c is not None else "warm" for c in caches}))
        shares = [c.hit_share for c in caches if c is not None and c.hit_share is not None]
        return cls(modes=modes, hit_share=sum(shares) / len(shares) if shares else None,
                   unrecorded=sum(c is None for c in caches))  # fmt: skip

    def text(self) -> str:
        old = f" ({self.unrecorded} run(s) from before cache modes)" if self.unrecorded else ""
        share = "" if self.hit_share is None else f", prefix-cache hit share {self.hit_share:.1%}"
        return "/".join(self.modes) + old + share


def cache_contrast(baseline: CacheSide, current: CacheSide) -> str | None:
    """Why the two sides differ in cache warmth, or None when they do not (by what is known)."""
    if baseline.modes != current.modes:
        return "they ran in different cache modes"
    if baseline.hit_share is not None and current.hit_share is not None:
        gap = current.hit_share - baseline.hit_share
        if abs(gap) >= HIT_SHARE_GAP:
            return (f"their prefix-cache hit shares differ by {abs(gap):.0%} (>= "
                    f"{HIT_SHARE_GAP:.0%}): one found more already cached")  # fmt: skip
    return None


def compare_cache_line(baseline: CacheSide, current: CacheSide) -> tuple[str, bool]:
    """`cache: BASELINE cold, … · CURRENT warm, …`, and the warning when they differ; the
    flag says whether they do."""
    line = f"cache: BASELINE {baseline.text()} · CURRENT {current.text()}"
    why = cache_contrast(baseline, current)
    if why is None:
        return line, False
    return (f"{line}\n  the two differ in cache warmth: {why}; TTFT and throughput move with "
            "what is cached (docs/cache-warmth.md)"), True  # fmt: skip


def cache_json(side: CacheSide) -> dict[str, object]:
    """A side's cache warmth in `compare --format json`."""
    return {"modes": list(side.modes), "hit_share": side.hit_share,
            "runs_before_cache_modes": side.unrecorded}  # fmt: skip
