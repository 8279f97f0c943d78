"""A virtual server for tests: the simulator's engine driven in virtual time, as records.

The engine (`loadgen.sim.engine`) is pure, so a schedule run through it gives every
token's emission time with no sleeping, no sockets and no noisy neighbours. These helpers
turn that into the records a run would have written (one per planned request, stamped
with a little client-side jitter), so capacity and planner tests can check their
verdicts against exact physics quickly.
"""

from __future__ import annotations

import heapq

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
