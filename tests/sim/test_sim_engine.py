"""The simulator's pure step model in virtual time: the seed's arithmetic, end to end."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from loadgen.sim.engine import (
    NS_PER_MS,
    SEED_DECODE_TABLE,
    DecodeTable,
    Engine,
    EngineConfig,
    SeqRequest,
    VirtualRun,
    requests_at,
    simulate,
)

SEED = EngineConfig()
FLAT_30 = DecodeTable(((1, 30.0),))


def _ms(ns: int) -> float:
    return ns / NS_PER_MS


def _req(seq_id: int, prompt: int, output: int, **kw: int) -> SeqRequest:
    return SeqRequest(seq_id=seq_id, prompt_tokens=prompt, output_tokens=output, **kw)


@pytest.mark.parametrize(
    ("batch", "step_ms"),
    [(0, 0.0), (1, 20.0), (16, 20.0), (24, 25.0), (32, 30.0), (48, 42.5), (64, 55.0), (500, 55.0)],
)
def test_decode_table_is_piecewise_linear_and_flat_beyond_ends(batch: int, step_ms: float) -> None:
    """The seed's decode table interpolates linearly between points and is flat outside."""
    assert SEED_DECODE_TABLE.step_ms(batch) == pytest.approx(step_ms)


def test_unqueued_prompt_first_token_is_pure_prefill() -> None:
    """An unqueued 2,000-token prompt's first token comes at 2000/8000 s = 250 ms exactly."""
    run = simulate(SEED, [(0, _req(1, 2000, 3))])
    assert [_ms(t) for t in run.token_ns[1]] == [250.0, 270.0, 290.0]


@pytest.mark.parametrize(("batch", "step_ms"), [(16, 20.0), (32, 30.0), (64, 55.0)])
def test_decode_steps_follow_the_batch_table(batch: int, step_ms: float) -> None:
    """With B sequences decoding, inter-token gaps equal decode_step_ms(B)."""
    config = dataclasses.replace(SEED, max_batch=batch)
    run = simulate(config, requests_at(0, [_req(i, 10, 5) for i in range(batch)]))
    times = run.token_ns[0]
    gaps = [_ms(b - a) for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([step_ms] * 4)
    assert _ms(times[0]) == pytest.approx(batch * 10 / 8000 * 1000)


def test_seed_e2e_is_9220_ms() -> None:
    """E2E = 250 + 299 × 30 = 9,220 ms for 2,000 prompt tokens, 300 outputs, 30 ms steps."""
    config = dataclasses.replace(SEED, decode_table=FLAT_30)
    run = simulate(config, [(0, _req(1, 2000, 300))])
    assert len(run.token_ns[1]) == 300
    assert _ms(run.token_ns[1][-1]) == pytest.approx(9220.0)


def _decoders(count: int, output: int) -> list[tuple[int, SeqRequest]]:
    return requests_at(0, [_req(i, 100, output) for i in range(count)])


def test_unchunked_long_prompt_makes_one_530_ms_step() -> None:
    """A 4,000-token prompt joining 32 decodes costs one 30 + 500 = 530 ms step."""
    config = dataclasses.replace(SEED, max_batch=64)
    arrivals = [*_decoders(32, 200), (1000 * NS_PER_MS, _req(99, 4000, 2))]
    run = simulate(config, arrivals)
    long_steps = [s for s in run.steps if s.prefill_tokens == 4000]
    assert len(long_steps) == 1
    assert long_steps[0].decode_batch == 32
    assert _ms(long_steps[0].end_ns - long_steps[0].start_ns) == pytest.approx(530.0)
    assert run.token_ns[99][0] == long_steps[0].end_ns


def test_chunked_prefill_bounds_steps_and_costs_ttft() -> None:
    """With 160-token chunks every step is <= 50 ms and a 4,000-token TTFT is 25 × 50 ms."""
    config = dataclasses.replace(SEED, max_batch=64, chunk_tokens=160)
    arrivals = [*_decoders(32, 200), (1000 * NS_PER_MS, _req(99, 4000, 2))]
    run = simulate(config, arrivals)
    assert max(_ms(s.end_ns - s.start_ns) for s in run.steps) <= 50.0 + 1e-6
    mine = [s for s in run.steps if s.prefill_tokens and s.start_ns >= 1000 * NS_PER_MS]
    assert len(mine) == 25
    assert _ms(run.token_ns[99][0] - mine[0].start_ns) == pytest.approx(1250.0)


def test_unchunked_prefill_takes_all_admitted_prompts_in_one_step() -> None:
    """Prompts admitted together are prefilled whole in the same step."""
    run = simulate(SEED, requests_at(0, [_req(1, 800, 1), _req(2, 1200, 1)]))
    assert _ms(run.token_ns[1][0]) == _ms(run.token_ns[2][0]) == pytest.approx(250.0)


def test_queue_cap_refuses_beyond_cap() -> None:
    """With one slot busy and queue_cap=2, the third waiting request is refused at once."""
    config = dataclasses.replace(SEED, max_batch=1, queue_cap=2)
    arrivals = [(0, _req(1, 10, 50)), *requests_at(NS_PER_MS, [_req(i, 10, 1) for i in (2, 3, 4)])]
    run = simulate(config, arrivals)
    assert run.rejected == {4}
    assert set(run.token_ns) == {1, 2, 3}


def test_priority_orders_the_waiting_queue() -> None:
    """Lower priority values are admitted first; equal priorities stay FIFO."""
    config = dataclasses.replace(SEED, max_batch=1)
    waiting = [
        _req(2, 10, 1),
        _req(3, 10, 1, priority=-1),
        _req(4, 10, 1),
        _req(5, 10, 1, priority=5),
    ]
    run = simulate(config, [(0, _req(1, 10, 3)), *requests_at(NS_PER_MS, waiting)])
    order = sorted(run.token_ns, key=lambda seq_id: run.token_ns[seq_id][0])
    assert order == [1, 3, 2, 4, 5]


def test_disaggregation_adds_prefill_pool_and_kv_transfer() -> None:
    """One prefill replica serialises prompts; decode starts kv_transfer_ms after prefill."""
    config = dataclasses.replace(SEED, prefill_replicas=1, kv_transfer_ms=10.0)
    run = simulate(config, requests_at(0, [_req(1, 2000, 3), _req(2, 2000, 2)]))
    assert [_ms(t) for t in run.token_ns[1]] == [250.0, 280.0, 300.0]
    assert [_ms(t) for t in run.token_ns[2]] == [500.0, 530.0]


def test_disaggregated_long_prefill_does_not_stall_decodes() -> None:
    """A 4,000-token prompt in the prefill pool leaves the decode pool's 30 ms steps intact."""
    config = dataclasses.replace(SEED, max_batch=64, prefill_replicas=2)
    arrivals = [*_decoders(32, 100), (1000 * NS_PER_MS, _req(99, 4000, 2))]
    run = simulate(config, arrivals)
    decode_steps = [s for s in run.steps if s.pool == "decode" and s.decode_batch == 32]
    assert max(_ms(s.end_ns - s.start_ns) for s in decode_steps) == pytest.approx(30.0)
    assert _ms(run.token_ns[99][0]) == pytest.approx(1500.0)


def test_stall_pauses_a_sequence_then_it_continues() -> None:
    """A stall after k tokens delays token k+1 by the stall (plus the wait for a step)."""
    request = _req(1, 0, 4, stall_after_tokens=2, stall_ns=100 * NS_PER_MS)
    run = simulate(SEED, [(0, request)])
    times = [_ms(t) for t in run.token_ns[1]]
    assert times == [0.0, 20.0, 140.0, 160.0]


def test_cancel_frees_the_slot_for_the_next_request() -> None:
    """A cancelled running sequence stops emitting and its slot goes to a waiting request."""
    engine = Engine(dataclasses.replace(SEED, max_batch=1))
    engine.submit(_req(1, 10, 100), 0)
    engine.submit(_req(2, 10, 1), 0)
    steps = engine.advance(50 * NS_PER_MS)
    engine.cancel(1)
    while (event_ns := engine.next_event_ns()) is not None:
        steps.extend(engine.advance(event_ns))
    emitted = [seq_id for s in steps for seq_id in s.emitted]
    assert emitted.count(2) == 1
    assert emitted.count(1) < 100


def test_an_idle_engine_wakes_at_the_earliest_eligible_waiting_request() -> None:
    """The next event of an idle engine is when its first waiting request becomes eligible,
    whichever the queue serves first: a stall before the first token holds the
    high-priority one to 300 ms, so the low-priority one (100 ms) is the event; a cancelled
    request no longer counts, and a newer arrival can be the earliest."""
    engine = Engine(SEED)
    engine.submit(_req(1, 10, 5, priority=0, stall_after_tokens=0, stall_ns=300 * NS_PER_MS), 0)
    engine.submit(_req(2, 10, 5, priority=1), 100 * NS_PER_MS)
    assert engine.next_event_ns() == 100 * NS_PER_MS
    engine.cancel(2)
    assert engine.next_event_ns() == 300 * NS_PER_MS
    engine.submit(_req(3, 10, 5, priority=2), 200 * NS_PER_MS)
    assert engine.next_event_ns() == 200 * NS_PER_MS
    engine.cancel(3)
    engine.cancel(1)
    assert engine.next_event_ns() is None


# -- the engine's own account of each request: queued, scheduled, first token ---------------


def _firsts(run: VirtualRun) -> dict[int, tuple[int, int, int]]:
    """Per request, (queued, scheduled, first token) from the steps that emitted its first."""
    return {
        seq_id: (queued, scheduled, step.end_ns)
        for step in run.steps
        for seq_id, queued, scheduled in step.first
    }


def test_first_tokens_say_when_each_request_was_queued_and_scheduled() -> None:
    """Three 800-token prompts at once on one slot: each is queued at 0 and scheduled when
    the one before retires (prefill 100 ms + 2 decode steps of 20 ms = 140 ms apart); its
    prefill (first token − scheduled) is 800 / 8000 s whatever it waited."""
    config = EngineConfig(max_batch=1)
    requests = [SeqRequest(seq_id=i, prompt_tokens=800, output_tokens=3) for i in range(3)]
    firsts = _firsts(simulate(config, requests_at(0, requests)))
    ms = NS_PER_MS
    assert firsts == {i: (0, i * 140 * ms, i * 140 * ms + 100 * ms) for i in range(3)}


def test_disaggregated_first_tokens_are_scheduled_by_the_prefill_pool() -> None:
    """One prefill replica, two 800-token prompts at once: the second is scheduled when the
    replica is free (100 ms), not when it reaches the decode pool; the decode pool's
    admission never moves it."""
    config = EngineConfig(prefill_replicas=1, kv_transfer_ms=5.0)
    requests = [SeqRequest(seq_id=i, prompt_tokens=800, output_tokens=3) for i in range(2)]
    firsts = _firsts(simulate(config, requests_at(0, requests)))
    ms = NS_PER_MS
    assert firsts == {0: (0, 0, 100 * ms), 1: (0, 100 * ms, 200 * ms)}
