"""The simulator's physics: a pure, iteration-level model of a continuous-batching engine.

Nothing here sleeps or reads a clock. Time is integer *simulated* nanoseconds; the
asyncio driver (`loadgen.sim.server`) maps it onto the monotonic clock, and tests drive
it in virtual time (`simulate`).

Colocated engine (`Engine`), one step at a time:

* Admission: at a step's start, waiting requests whose arrival time is <= the start are
  admitted in (priority, arrival) order while fewer than `max_batch` sequences run.
  Lower `priority` is served first (vLLM semantics); equal priorities are FIFO.
* Decode: every admitted sequence whose prompt is fully prefilled (and which is not
  stalled) decodes one token in the step.
* Prefill: with `chunk_tokens == 0` every admitted prompt that is not yet prefilled is
  prefilled *whole* in this step (several prompts admitted together share one long step);
  with `chunk_tokens > 0` the step prefills at most `chunk_tokens` prompt tokens, shared
  FIFO in admission order (the budget excludes the decode tokens, unlike vLLM's
  `max_num_batched_tokens`; this is the planner's C = (TPOT_slo − t_decode) × prefill_rate).
* Duration (an additive, conservative model):
  step_ns = decode_step_ms(B) + prefill_tokens / prefill_tokens_per_s, with B the number of
  sequences decoding in the step (0 ms when B = 0), decode_step_ms piecewise linear in B
  between table points and flat beyond the table's ends.
* Emission: every decoding sequence emits one token at the step's end; a sequence whose
  prefill completes in the step emits its first token at the step's end too. A sequence is
  removed when it has emitted all its output tokens, freeing its slot for the next step.
* A request arriving while a step runs (or exactly at a step boundary) joins a later step.

Disaggregated engine (`DisaggregatedEngine`, DistServe-style): a pool of
`prefill_replicas` replicas each prefills one whole prompt at a time (FIFO by priority) at
`prefill_tokens_per_s` and emits the first token when done; after `kv_transfer_ms` the
sequence joins a colocated engine used as the decode pool (decode-only steps).

Queue cap: `submit` refuses a request when `queue_cap > 0` requests already wait
(admitted sequences do not count), so the server can answer 429 at once.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Sequence
from typing import Protocol

# loadgen.units' factors, copied: the simulator imports nothing of the client it checks
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeTable:
    """Decode step time (ms) as a piecewise-linear function of the decode batch size."""

    points: tuple[tuple[int, float], ...]

    def step_ms(self, batch: int) -> float:
        """Step time in ms for `batch` decoding sequences; 0 when nothing decodes."""
        if batch <= 0:
            return 0.0
        pts = self.points
        if batch <= pts[0][0]:
            return pts[0][1]
        if batch >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_left(pts, (batch, float("-inf")))
        (b0, ms0), (b1, ms1) = pts[i - 1], pts[i]
        return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)


SEED_DECODE_TABLE = DecodeTable(((16, 20.0), (32, 30.0), (64, 55.0)))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Serving physics; the defaults are the simulator's default parameter set."""

    prefill_tokens_per_s: float = 8000.0
    decode_table: DecodeTable = SEED_DECODE_TABLE
    max_batch: int = 32
    chunk_tokens: int = 0  # prefill budget per step; 0 = whole prompts
    queue_cap: int = 0  # waiting requests beyond this are refused; 0 = no cap
    prefill_replicas: int = 0  # > 0 = disaggregated prefill pool of this many replicas
    kv_transfer_ms: float = 0.0  # prefill pool → decode pool hand-off (disaggregated only)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SeqRequest:
    """One request as the engine sees it: sizes, priority and an optional stall."""

    seq_id: int
    prompt_tokens: int
    output_tokens: int  # >= 1
    priority: int = 0
    stall_after_tokens: int = -1  # after this many emitted tokens pause; -1 = never
    stall_ns: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache: not prefilled


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EngineState:
    """What the engine holds at one instant (what `/metrics` reports).

    `kv_tokens` counts, per sequence holding a slot, its prefilled prompt tokens and its
    emitted tokens (the KV entries it needs); shared cached blocks count once per sequence.
    """

    waiting: int
    running: int
    kv_tokens: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One finished step (or one finished prefill in the disaggregated pool)."""

    start_ns: int
    end_ns: int
    decode_batch: int
    prefill_tokens: int
    emitted: tuple[int, ...]  # seq ids that emit one token at end_ns
    pool: str = "engine"  # "engine" (colocated), "prefill" or "decode"
    # The sequences emitting their first token at end_ns: (seq id, when it was queued, when
    # it was scheduled: admitted to a batch slot or a prefill replica), the engine's own
    # account of its queue (scheduled − queued) and prefill (end_ns − scheduled).
    first: tuple[tuple[int, int, int], ...] = ()


class StepModel(Protocol):
    """What the driver needs from an engine: submit, cancel, and step through events."""

    def submit(self, request: SeqRequest, at_ns: int) -> bool: ...

    def cancel(self, seq_id: int) -> None: ...

    def next_event_ns(self) -> int | None: ...

    def advance(self, now_ns: int) -> list[StepResult]: ...

    def waiting_count(self) -> int: ...

    def state(self) -> EngineState: ...


class _Seq:
    """Mutable engine-internal state of one sequence."""

    __slots__ = (
        "admitted",
        "arrival_ns",
        "cancelled",
        "eligible_ns",
        "emitted",
        "order",
        "output_tokens",
        "prefilled",
        "priority",
        "prompt_tokens",
        "resume_ns",
        "scheduled_ns",
        "seq_id",
        "stall_after",
        "stall_ns",
    )

    def __init__(self, request: SeqRequest, at_ns: int, order: int) -> None:
        self.seq_id = request.seq_id
        self.prompt_tokens = max(0, request.prompt_tokens)
        self.output_tokens = max(1, request.output_tokens)
        self.priority = request.priority
        self.stall_after = request.stall_after_tokens
        self.stall_ns = request.stall_ns
        self.arrival_ns = at_ns
        self.order = order
        self.prefilled = min(max(0, request.cached_tokens), self.prompt_tokens)
        self.emitted = 0
        self.admitted = False
        self.cancelled = False
        self.resume_ns = 0
        self.scheduled_ns = -1  # when first admitted (the decode pool's admission keeps it)
        # A stall before the first token delays the request's entry into the engine.
        self.eligible_ns = at_ns + (self.stall_ns if self.stall_after == 0 else 0)

    def key(self) -> tuple[int, int, int]:
        """Queue order: priority first (lower is served first), then arrival (FIFO)."""
        return (self.priority, self.arrival_ns, self.order)

    def emit(self, at_ns: int) -> bool:
        """Record one token emitted at `at_ns`; True when the sequence is finished."""
        self.emitted += 1
        if self.emitted == self.stall_after:
            self.resume_ns = at_ns + self.stall_ns
        return self.emitted >= self.output_tokens


_QueueItem = tuple[tuple[int, int, int], _Seq]


class _WaitQueue:
    """Waiting requests ordered by (priority, arrival), with lazy cancellation."""

    def __init__(self) -> None:
        self._heap: list[_QueueItem] = []
        # The same requests by the time each becomes eligible, for `earliest_eligible_ns`
        # (a scan of the queue per arrival made a burst of n arrivals cost O(n²): ~19 ms
        # for 512 at once). Entries of requests admitted, cancelled or queued again with
        # another time are stale and dropped when they reach the top.
        self._by_time: list[tuple[int, int, _Seq]] = []
        self.count = 0

    def push(self, seq: _Seq) -> None:
        heapq.heappush(self._heap, (seq.key(), seq))
        heapq.heappush(self._by_time, (seq.eligible_ns, seq.order, seq))
        self.count += 1

    def cancel(self, seq: _Seq) -> None:
        seq.cancelled = True
        self.count -= 1

    def pop_eligible(self, at_ns: int, limit: int) -> list[_Seq]:
        """Remove and return up to `limit` live requests eligible at `at_ns`, in order."""
        taken: list[_Seq] = []
        skipped: list[_QueueItem] = []
        heap = self._heap
        while heap and len(taken) < limit:
            item = heapq.heappop(heap)
            seq = item[1]
            if seq.cancelled:
                continue
            if seq.eligible_ns > at_ns:
                skipped.append(item)
                continue
            seq.admitted = True
            if seq.scheduled_ns < 0:
                seq.scheduled_ns = at_ns
            taken.append(seq)
        for item in skipped:
            heapq.heappush(heap, item)
        self.count -= len(taken)
        return taken

    def earliest_eligible_ns(self, clock_ns: int) -> int | None:
        """Earliest time (>= clock_ns) a live waiting request is eligible; None if none wait."""
        if self.count == 0:
            return None
        head = self._heap[0][1]
        if not head.cancelled and head.eligible_ns <= clock_ns:
            return clock_ns
        by_time = self._by_time
        while by_time:
            eligible_ns, _, seq = by_time[0]
            if seq.admitted or seq.cancelled or seq.eligible_ns != eligible_ns:
                heapq.heappop(by_time)  # stale: no longer waiting at this time
                continue
            return max(eligible_ns, clock_ns)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """A step's composition, fixed at its start."""

    start_ns: int
    end_ns: int
    decoding: tuple[_Seq, ...]
    prefill_tokens: int
    first_tokens: tuple[_Seq, ...]  # sequences whose prefill completes in this step


class Engine:
    """Colocated continuous-batching engine (see the module docstring for the rules)."""

    def __init__(self, config: EngineConfig, *, pool: str = "engine") -> None:
        self._config = config
        self._pool = pool
        self._ns_per_prefill_token = NS_PER_S / config.prefill_tokens_per_s
        self._waiting = _WaitQueue()
        self._running: list[_Seq] = []
        self._by_id: dict[int, _Seq] = {}
        self._order = itertools.count()
        self._clock_ns = 0
        self._plan: _Plan | None = None

    def waiting_count(self) -> int:
        """Requests submitted but not yet admitted to a batch slot."""
        return self._waiting.count

    def running_count(self) -> int:
        """Sequences holding a batch slot (prefilling, decoding or stalled)."""
        return sum(1 for s in self._running if not s.cancelled)

    def state(self) -> EngineState:
        """Waiting, running and KV tokens held now (see `EngineState`)."""
        live = [s for s in self._running if not s.cancelled]
        kv = sum(s.prefilled + s.emitted for s in live)
        return EngineState(waiting=self._waiting.count, running=len(live), kv_tokens=kv)

    def submit(self, request: SeqRequest, at_ns: int) -> bool:
        """Queue a request arriving at `at_ns` (clamped to the engine clock); False = refused."""
        cap = self._config.queue_cap
        if cap > 0 and self._waiting.count >= cap:
            return False
        self._enqueue(_Seq(request, max(at_ns, self._clock_ns), next(self._order)))
        return True

    def submit_prefilled(self, seq: _Seq, at_ns: int) -> None:
        """Queue a sequence whose prompt was prefilled elsewhere (disaggregated decode pool)."""
        seq.eligible_ns = max(at_ns, seq.resume_ns, self._clock_ns)
        seq.admitted = False
        self._enqueue(seq)

    def _enqueue(self, seq: _Seq) -> None:
        self._by_id[seq.seq_id] = seq
        self._waiting.push(seq)

    def cancel(self, seq_id: int) -> None:
        """Abort a sequence (its client went away); its slot frees at the next step start."""
        seq = self._by_id.pop(seq_id, None)
        if seq is None or seq.cancelled:
            return
        if seq.admitted:
            seq.cancelled = True
        else:
            self._waiting.cancel(seq)

    def next_event_ns(self) -> int | None:
        """When the running step ends, or when an idle engine can start one; None = no work."""
        if self._plan is not None:
            return self._plan.end_ns
        clock = self._clock_ns
        soonest: int | None = None
        live = 0
        for seq in self._running:
            if seq.cancelled:
                continue
            if seq.emitted == 0 or seq.resume_ns <= clock:
                return clock
            live += 1
            if soonest is None or seq.resume_ns < soonest:
                soonest = seq.resume_ns  # every running sequence is stalled
        if live < self._config.max_batch:
            earliest = self._waiting.earliest_eligible_ns(clock)
            if earliest is not None and (soonest is None or earliest < soonest):
                soonest = earliest
        return soonest

    def advance(self, now_ns: int) -> list[StepResult]:
        """Finish every step ending at or before `now_ns`, starting new ones as work allows."""
        results: list[StepResult] = []
        while True:
            event_ns = self.next_event_ns()
            if event_ns is None or event_ns > now_ns:
                return results
            result = self.advance_one()
            if result is not None:
                results.append(result)

    def advance_one(self) -> StepResult | None:
        """Process the next event: finish the running step, or start one (returns None)."""
        plan = self._plan
        if plan is not None:
            self._plan = None
            self._clock_ns = plan.end_ns
            return self._finish(plan)
        event_ns = self.next_event_ns()
        if event_ns is None:
            return None
        self._clock_ns = event_ns
        self._plan = self._compose(event_ns)
        if self._plan is None and self.next_event_ns() == event_ns:
            raise RuntimeError(f"engine made no progress at {event_ns} ns")  # a bug
        return None

    def _compose(self, start_ns: int) -> _Plan | None:
        """Fix the step starting at `start_ns`: admissions, decodes, prefill and duration."""
        running = [s for s in self._running if not s.cancelled]
        free = self._config.max_batch - len(running)
        if free > 0:
            running.extend(self._waiting.pop_eligible(start_ns, free))
        self._running = running
        decoding = tuple(s for s in running if s.emitted > 0 and s.resume_ns <= start_ns)
        prefill_tokens, first_tokens = self._prefill(running)
        if not decoding and not first_tokens and prefill_tokens == 0:
            return None
        duration_ns = round(
            self._config.decode_table.step_ms(len(decoding)) * NS_PER_MS
            + prefill_tokens * self._ns_per_prefill_token
        )
        return _Plan(start_ns, start_ns + duration_ns, decoding, prefill_tokens, first_tokens)

    def _prefill(self, running: list[_Seq]) -> tuple[int, tuple[_Seq, ...]]:
        """Spend this step's prefill budget FIFO; returns (tokens, sequences completing)."""
        budget = self._config.chunk_tokens or -1  # -1: unlimited, whole prompts
        total = 0
        completing: list[_Seq] = []
        for seq in running:
            if seq.emitted > 0:
                continue
            if budget == 0:
                break
            remaining = seq.prompt_tokens - seq.prefilled
            if 0 < budget < remaining:
                seq.prefilled += budget
                total += budget
                break
            seq.prefilled = seq.prompt_tokens
            total += remaining
            completing.append(seq)
            if budget > 0:
                budget -= remaining
        return total, tuple(completing)

    def _finish(self, plan: _Plan) -> StepResult:
        """Emit the step's tokens at its end and retire finished sequences."""
        end_ns = plan.end_ns
        emitted: list[int] = []
        first: list[tuple[int, int, int]] = []
        for seq in itertools.chain(plan.decoding, plan.first_tokens):
            if seq.cancelled:
                continue
            emitted.append(seq.seq_id)
            if seq.emitted == 0:
                first.append((seq.seq_id, seq.arrival_ns, seq.scheduled_ns))
            if seq.emit(end_ns):
                seq.cancelled = True  # retired; dropped from the batch at the next compose
                del self._by_id[seq.seq_id]
        return StepResult(
            start_ns=plan.start_ns,
            end_ns=end_ns,
            decode_batch=len(plan.decoding),
            prefill_tokens=plan.prefill_tokens,
            emitted=tuple(emitted),
            pool=self._pool,
            first=tuple(first),
        )


class DisaggregatedEngine:
    """A prefill pool of whole-prompt replicas, a KV-transfer delay, then a decode pool."""

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._ns_per_prefill_token = NS_PER_S / config.prefill_tokens_per_s
        self._kv_ns = round(config.kv_transfer_ms * NS_PER_MS)
        self._waiting = _WaitQueue()
        self._busy: list[tuple[int, _Seq] | None] = [None] * config.prefill_replicas
        self._by_id: dict[int, _Seq] = {}
        self._order = itertools.count()
        self._clock_ns = 0
        self._decode = Engine(dataclasses.replace(config, queue_cap=0), pool="decode")

    def waiting_count(self) -> int:
        """Requests waiting for a prefill replica."""
        return self._waiting.count

    def state(self) -> EngineState:
        """Waiting for a replica or a decode slot; prefilling or decoding; their KV tokens."""
        decode = self._decode.state()
        busy = [b[1] for b in self._busy if b is not None and not b[1].cancelled]
        return EngineState(
            waiting=self._waiting.count + decode.waiting,
            running=len(busy) + decode.running,
            kv_tokens=decode.kv_tokens + sum(s.prompt_tokens for s in busy),
        )

    def submit(self, request: SeqRequest, at_ns: int) -> bool:
        """Queue a request for the prefill pool; False = refused by the queue cap."""
        cap = self._config.queue_cap
        if cap > 0 and self._waiting.count >= cap:
            return False
        seq = _Seq(request, max(at_ns, self._clock_ns), next(self._order))
        self._by_id[seq.seq_id] = seq
        self._waiting.push(seq)
        return True

    def cancel(self, seq_id: int) -> None:
        """Abort a sequence wherever it is; a replica already prefilling it still finishes."""
        seq = self._by_id.pop(seq_id, None)
        if seq is None:
            self._decode.cancel(seq_id)
        elif seq.admitted:
            seq.cancelled = True
        elif not seq.cancelled:
            self._waiting.cancel(seq)

    def _pool_event_ns(self) -> int | None:
        """Next prefill completion, or the next prefill start if a replica is idle."""
        ends = [busy[0] for busy in self._busy if busy is not None]
        if len(ends) < len(self._busy):
            start = self._waiting.earliest_eligible_ns(self._clock_ns)
            if start is not None:
                ends.append(start)
        return min(ends) if ends else None

    def next_event_ns(self) -> int | None:
        """The earlier of the prefill pool's and the decode pool's next events."""
        pool_ns = self._pool_event_ns()
        decode_ns = self._decode.next_event_ns()
        if pool_ns is None:
            return decode_ns
        return pool_ns if decode_ns is None else min(pool_ns, decode_ns)

    def advance(self, now_ns: int) -> list[StepResult]:
        """Process every event at or before `now_ns`, prefill-pool events first on ties."""
        results: list[StepResult] = []
        while True:
            pool_ns = self._pool_event_ns()
            decode_ns = self._decode.next_event_ns()
            if (
                pool_ns is not None
                and pool_ns <= now_ns
                and (decode_ns is None or pool_ns <= decode_ns)
            ):
                result = self._pool_event(pool_ns)
            elif decode_ns is not None and decode_ns <= now_ns:
                result = self._decode.advance_one()
            else:
                return results
            if result is not None:
                results.append(result)

    def _pool_event(self, at_ns: int) -> StepResult | None:
        """Finish a replica's prefill due at `at_ns`, or start one on an idle replica."""
        self._clock_ns = at_ns
        for i, busy in enumerate(self._busy):
            if busy is not None and busy[0] == at_ns:
                self._busy[i] = None
                return self._prefilled(busy[1], at_ns)
        i = self._busy.index(None)
        (seq,) = self._waiting.pop_eligible(at_ns, 1)
        duration_ns = round((seq.prompt_tokens - seq.prefilled) * self._ns_per_prefill_token)
        self._busy[i] = (at_ns + duration_ns, seq)
        return None

    def _prefilled(self, seq: _Seq, end_ns: int) -> StepResult:
        """Emit the first token and hand the sequence to the decode pool after the KV transfer."""
        self._by_id.pop(seq.seq_id, None)
        computed = seq.prompt_tokens - seq.prefilled
        emitted: tuple[int, ...] = ()
        first: tuple[tuple[int, int, int], ...] = ()
        if not seq.cancelled:
            seq.prefilled = seq.prompt_tokens
            emitted = (seq.seq_id,)
            first = ((seq.seq_id, seq.arrival_ns, seq.scheduled_ns),)
            if not seq.emit(end_ns):
                self._decode.submit_prefilled(seq, end_ns + self._kv_ns)
        return StepResult(
            start_ns=end_ns - round(computed * self._ns_per_prefill_token),
            end_ns=end_ns,
            decode_batch=0,
            prefill_tokens=computed,
            emitted=emitted,
            pool="prefill",
            first=first,
        )


def build_engine(config: EngineConfig) -> Engine | DisaggregatedEngine:
    """The colocated engine, or the disaggregated one when a prefill pool is configured."""
    return DisaggregatedEngine(config) if config.prefill_replicas > 0 else Engine(config)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VirtualRun:
    """Outcome of `simulate`: token emission times per request, refusals, and steps."""

    token_ns: dict[int, list[int]]
    rejected: frozenset[int]
    steps: tuple[StepResult, ...]


def simulate(config: EngineConfig, arrivals: Iterable[tuple[int, SeqRequest]]) -> VirtualRun:
    """Run the model in virtual time; arrivals at time t are queued before events at t."""
    engine = build_engine(config)
    steps: list[StepResult] = []
    rejected: set[int] = set()
    for at_ns, request in sorted(arrivals, key=lambda arrival: arrival[0]):
        steps.extend(engine.advance(at_ns - 1))
        if not engine.submit(request, at_ns):
            rejected.add(request.seq_id)
    while (event_ns := engine.next_event_ns()) is not None:
        steps.extend(engine.advance(event_ns))
    token_ns: dict[int, list[int]] = {}
    for step in steps:
        for seq_id in step.emitted:
            token_ns.setdefault(seq_id, []).append(step.end_ns)
    return VirtualRun(token_ns=token_ns, rejected=frozenset(rejected), steps=tuple(steps))


def requests_at(at_ns: int, requests: Sequence[SeqRequest]) -> list[tuple[int, SeqRequest]]:
    """Arrivals of several requests at the same instant (a test convenience)."""
    return [(at_ns, r) for r in requests]
