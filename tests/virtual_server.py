"""A virtual server for tests: the simulator's engine driven in virtual time, as records.

The engine (`loadgen.sim.engine`) is pure, so a schedule run through it gives every
token's emission time with no sleeping, no sockets and no noisy neighbours. These helpers
turn that into the records a run would have written (one per planned request, stamped
with a little client-side jitter), so capacity and planner tests can check their
verdicts against exact physics quickly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import polars as pl

from loadgen.results.records import Outcome, RequestRecord, TokenSource, to_frame
from loadgen.sim.config import config_from_mapping
from loadgen.sim.engine import EngineConfig, SeqRequest, build_engine, simulate
from loadgen.workload.plans import plan_run
from loadgen.workload.spec import WorkloadSpec

JITTER_MS = 0.3  # client-side stamping noise added to every token time (exponential mean)


def _record(plan_id: int, cls: str, intended: int, tokens: list[int], rng: np.random.Generator,
            *, prompt: int = 16) -> RequestRecord:  # fmt: skip
    jitter = rng.exponential(JITTER_MS * 1e6, len(tokens))
    chunks = np.maximum.accumulate(np.array(tokens, dtype=np.float64) + jitter).astype(np.int64)
    ch = [int(c) for c in chunks]
    return RequestRecord(
        request_id=plan_id, class_name=cls, intended_ns=intended, outcome=Outcome.OK,
        dispatched_ns=intended, sent_ns=intended, first_token_ns=ch[0],
        first_content_ns=ch[0], last_token_ns=ch[-1], end_ns=ch[-1], chunk_ns=tuple(ch),
        chunk_tokens=(1,) * len(ch), output_tokens=len(ch), token_source=TokenSource.USAGE,
        prompt_tokens=prompt, prompt_tokens_target=prompt, max_tokens=len(ch),
    )  # fmt: skip


def open_loop_frame(spec: WorkloadSpec, seed: int) -> pl.DataFrame:
    """Every planned request sent at its intended time to the virtual engine."""
    engine = config_from_mapping(spec.sim, spec.source).engine
    plans = plan_run(spec, seed)
    arrivals = [
        (p.intended_ns, SeqRequest(seq_id=p.request_id, prompt_tokens=p.prompt_tokens,
                                   output_tokens=p.output_tokens))
        for p in plans
    ]  # fmt: skip
    run = simulate(engine, arrivals)
    rng = np.random.default_rng(seed)
    records = [
        _record(
            p.request_id,
            p.class_name,
            p.intended_ns,
            run.token_ns[p.request_id],
            rng,
            prompt=p.prompt_tokens,
        )
        for p in plans
    ]
    return to_frame(records)


def closed_loop_frame(engine_config: EngineConfig, cap: int, count: int, tokens: int,
                      seed: int, *, prompt: int = 16) -> pl.DataFrame:  # fmt: skip
    """`cap` clients, each sending its next request (`prompt` tokens in, `tokens` out) the
    moment its last one ends."""
    engine = build_engine(engine_config)
    rng = np.random.default_rng(seed)
    emitted: dict[int, list[int]] = {}
    sent_at: dict[int, int] = {}
    pending: list[tuple[int, int]] = [(0, i) for i in range(min(cap, count))]  # (time, id)
    next_id = len(pending)
    records = []
    while pending or engine.next_event_ns() is not None:
        due = pending[0][0] if pending else None
        event = engine.next_event_ns()
        if due is not None and (event is None or due <= event):
            at, seq = heapq.heappop(pending)
            engine.advance(at - 1)
            engine.submit(SeqRequest(seq_id=seq, prompt_tokens=prompt, output_tokens=tokens), at)
            sent_at[seq] = at
            continue
        assert event is not None
        for step in engine.advance(event):
            for seq in step.emitted:
                emitted.setdefault(seq, []).append(step.end_ns)
                if len(emitted[seq]) == tokens:
                    records.append(
                        _record(seq, "chat", sent_at[seq], emitted[seq], rng, prompt=prompt)
                    )
                    if next_id < count:
                        heapq.heappush(pending, (step.end_ns, next_id))
                        next_id += 1
    return to_frame(records)


def busy_client(period_ms: float, blocked_ms: float) -> Callable[[int], int]:
    """A client whose event loop is taken from it for `blocked_ms` of every `period_ms` (busy
    neighbours on its cores): anything due at t inside a block happens at the block's end.
    Returns t ↦ how late (ns) something due at t (a send, a chunk's read) happens."""
    period, blocked = round(period_ms * 1e6), round(blocked_ms * 1e6)

    def late_ns(t_ns: int) -> int:
        phase = t_ns % period
        return blocked - phase if phase < blocked else 0

    return late_ns


def lagged_frame(
    spec: WorkloadSpec, seed: int, late_ns: Callable[[int], int],
    stamp_late_ns: Callable[[int], int] | None = None,
) -> pl.DataFrame:  # fmt: skip
    """Every planned request sent by a client that is `late_ns(t)` late at t: it dispatches
    at intended + late(intended), the virtual engine sees the request then (the server's
    own physics, bunched arrivals included), and every chunk is stamped late(t) after the
    engine emitted it (`stamp_late_ns(t)` when given). One token per chunk, usage-counted,
    as `open_loop_frame`."""
    stamp = stamp_late_ns or late_ns
    engine = config_from_mapping(spec.sim, spec.source).engine
    plans = plan_run(spec, seed)
    starts = {p.request_id: p.intended_ns + late_ns(p.intended_ns) for p in plans}
    arrivals = [
        (starts[p.request_id], SeqRequest(seq_id=p.request_id, prompt_tokens=p.prompt_tokens,
                                          output_tokens=p.output_tokens))
        for p in plans
    ]  # fmt: skip
    run = simulate(engine, arrivals)
    records = []
    for p in plans:
        stamps = [t + stamp(t) for t in run.token_ns[p.request_id]]
        chunks = tuple(int(c) for c in np.maximum.accumulate(np.array(stamps)))
        records.append(RequestRecord(
            request_id=p.request_id, class_name=p.class_name, intended_ns=p.intended_ns,
            outcome=Outcome.OK, dispatched_ns=starts[p.request_id], sent_ns=starts[p.request_id],
            first_token_ns=chunks[0], first_content_ns=chunks[0], last_token_ns=chunks[-1],
            end_ns=chunks[-1], chunk_ns=chunks, chunk_tokens=(1,) * len(chunks),
            output_tokens=len(chunks), token_source=TokenSource.USAGE,
            prompt_tokens=p.prompt_tokens, prompt_tokens_target=p.prompt_tokens,
            max_tokens=len(chunks),
        ))  # fmt: skip
    return to_frame(records)
