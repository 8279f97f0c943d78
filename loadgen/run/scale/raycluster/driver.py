"""`run --ray`: connect, place N shards one per node, measure each node's clock, launch
them, agree one start once all are ready, watch them, bring their folders back, merge.

`RayRunner` is the runner `run.execute` chooses for `--ray`. The driver is the process the
user started; it owns the target (the built-in simulator is
started here, once, as `--workers` does), the run folder and the exit code. Faults are
outcomes: a shard whose node or actor stops answering for `LOST_AFTER_S` is lost (its plans
recorded as recovery records them, exit 5); a shard process killed outright is recovered
on its node (exit 5); Ctrl-C stops every shard as Ctrl-C stops a run (exit 130). Every
actor, placement group and the local Ray this run started are gone when it returns.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.results.runfolder import RayInfo, RayShard, read_run_info
from loadgen.results.write import keep_shards, unpack_run_folder, write_run_info
from loadgen.run.context import RunContext
from loadgen.run.merge import merge_shards
from loadgen.run.prepare import Prepared
from loadgen.run.processes.child import READY_TIMEOUT_S
from loadgen.run.processes.simulator import target_url
from loadgen.run.record import RunResult
from loadgen.run.scale.cluster import (
    CLOCK_SAMPLES,
    INTERRUPTED,
    LOST,
    LOST_AFTER_S,
    OK,
    ClockSample,
    RayOptions,
    agree_start,
    clock_offset,
    outcome_of,
    plan_placement,
    shard_options,
    skew_problems,
    write_lost_shard,
)
from loadgen.run.scale.raycluster import INSTALL_HINT
from loadgen.run.terminal import Terminal
from loadgen.workload.shards import Share

POLL_S = 0.5  # how often the driver looks at its shards
PROGRESS_S = 5.0  # a progress line this often (not on a terminal: it would scroll)


LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's switch: "0" keeps a node on 127.0.0.1
# Ray's token authentication: the mode, and the token itself (or a file holding it), which
# Ray's processes read from the environment before ~/.ray/auth_token.
RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH = (
    "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
)  # fmt: skip


def import_ray(address: str | None) -> Any:
    """Ray, or a usage error that says how to install it. A local Ray started for one run
    (no address) serves only this host: it is kept on loopback (Ray's own switch, read when
    Ray is imported) rather than listening on this host's network address, and its token
    authentication gets a token of this process's own, in its environment (which Ray's
    processes inherit): left to itself, Ray writes a new token to ~/.ray/auth_token, which
    every later `ray start` on this host then enforces, refusing nodes that lack it
    ("InvalidAuthToken"). A token or mode the user set is kept."""
    if address is None:
        os.environ.setdefault(LOOPBACK_ONLY, "0")
        if not (os.environ.get(RAY_AUTH_TOKEN) or os.environ.get(RAY_AUTH_TOKEN_PATH)):
            os.environ.setdefault(RAY_AUTH_MODE, "token")
            os.environ[RAY_AUTH_TOKEN] = secrets.token_hex(32)  # Ray's own: 256 random bits
    try:
        import ray  # optional: only a Ray run needs it
    except ImportError:
        raise LoadgenError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass(slots=True)
class Shard:
    """The driver's view of one shard."""

    index: int
    actor: Any
    where: dict[str, Any] = field(default_factory=dict)
    offset_ns: int = 0
    rtt_ns: int = 0
    finish_ref: Any = None
    last_heard_ns: int = 0
    ended: dict[str, Any] | None = None  # what `finish` returned
    lost: str | None = None  # why it is lost
    records: int = 0
    ended_ns: int = 0

    @property
    def done(self) -> bool:
        return self.ended is not None or self.lost is not None


@dataclass(frozen=True, slots=True)
class RayRunner:
    """Send the run from shards on a Ray cluster (see the module docstring). Made with
    `for_run` as the run begins, so that a missing Ray is said before anything else and the
    time before t0 counts from then."""

    options: RayOptions
    ray: Any  # the module, imported
    began: float  # time.monotonic() as the run began

    @classmethod
    def for_run(cls, options: RayOptions) -> RayRunner:
        return cls(options=options, ray=import_ray(options.address), began=time.monotonic())

    def run(self, run: RunContext, prepared: Prepared) -> RunResult:
        """Connect, place, launch, start, watch, collect, merge into `run.run_dir`."""
        ray, ray_options, terminal = self.ray, self.options, run.terminal
        started_local = _connect(ray, ray_options.address, terminal)
        pg = None
        shards: list[Shard] = []
        try:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            placement = plan_placement(ray_options.shards, len(alive))
            terminal.say(f"ray: {len(alive)} alive node(s), {placement.shards} shards, "
                         f"placement {placement.strategy}")  # fmt: skip
            if placement.note is not None:
                terminal.warn(f"warning: {placement.note}")
            pg, shards = _place(ray, placement.shards, placement.strategy)
            _measure_clocks(ray, shards)
            _say_placement(terminal, shards)
            problems = skew_problems({s.index: s.offset_ns for s in shards},
                                     ray_options.max_clock_skew_ms)  # fmt: skip
            if problems:
                raise LoadgenError(
                    "refused before any traffic: node clocks too far apart:\n  "
                    + "\n  ".join(problems)
                    + "\nsync the nodes' clocks (chrony/NTP), or raise --max-clock-skew-ms"
                )
            with target_url(run.options.url, run.spec) as (url, sim_args):
                if sim_args is not None:
                    terminal.say(f"no --url given: started the built-in simulator at {url}")
                try:
                    start_ns = _launch_and_start(ray, run, shards, url)
                except KeyboardInterrupt:
                    terminal.warn("\ninterrupted before the start: nothing was sent; stopping "
                                  "every shard")  # fmt: skip
                    raise
                before_t0_s = (start_ns - time.time_ns()) / 1e9 + (time.monotonic() - self.began)
                terminal.say(f"ray: every shard ready; agreed start in "
                             f"{(start_ns - time.time_ns()) / 1e9:.2f} s")  # fmt: skip
                interrupted = _watch(ray, shards, run)
            ended = time.monotonic()
            info = RayInfo(address=ray_options.address or "local", started_local=started_local,
                           strategy=placement.strategy, nodes_alive=len(alive),
                           max_clock_skew_ms=ray_options.max_clock_skew_ms,
                           before_t0_s=round(before_t0_s, 3))  # fmt: skip
            return _collect_and_merge(run, shards, start_ns=start_ns, interrupted=interrupted,
                                      info=info, ended=ended)  # fmt: skip
        finally:
            _clean_up(ray, shards, pg, started_local)


@contextmanager
def ray_session(ray_options: RayOptions, *, quiet: bool = False) -> Iterator[None]:
    """Connected to the cluster for several runs (a capacity search's steps): each run on
    Ray inside uses this connection, and a local Ray started here is stopped at the end,
    not after every run."""
    ray = import_ray(ray_options.address)
    started = _connect(ray, ray_options.address, Terminal(sys.stderr, quiet=quiet))
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _connect(ray: Any, address: str | None, terminal: Terminal) -> bool:
    """Join the cluster at `address` (`auto`, host:port, ray://...), or start a local Ray for
    this run (None); True when this run started it (and so stops it)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False,
                              "include_dashboard": False, "configure_logging": True}  # fmt: skip
    try:
        if address is None:  # `local`: a new Ray, even with one running here already
            ray.init(address="local", **kwargs)
            if not terminal.quiet:
                terminal.say(f"ray: started a local Ray for this run (one node, on loopback; its "
                             f"logs and state in {_session_dir(ray)}, its auth token in this "
                             "process's environment only: nothing in your home)")  # fmt: skip
            return True
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise LoadgenError(
            f"--ray {address or ''}: cannot connect to a Ray cluster: {exc}. Give the head's "
            "address (host:6379), `auto` on a cluster node, or no value to start a local one"
        ) from None
    return False


def _session_dir(ray: Any) -> str:
    """Where the local Ray keeps its logs and state (its session folder, under Ray's temp
    folder: /tmp/ray unless RAY_TMPDIR says otherwise); Ray's own, left for reading after."""
    try:
        return str(ray._private.worker._global_node.get_session_dir_path())
    except AttributeError:  # a Ray that moved it: say where it is by default
        return "Ray's temp folder (/tmp/ray unless RAY_TMPDIR)"


def _place(ray: Any, count: int, strategy: str) -> tuple[Any, list[Shard]]:
    """A placement group of `count` one-CPU bundles, and one actor pinned to each."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from loadgen.run.scale.raycluster.actor import ShardActor  # defers ray (actor imports it)

    pg = placement_group([{"CPU": 1}] * count, strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=READY_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise LoadgenError(
            f"refused before any traffic: Ray could not place {count} shards ({strategy}, one "
            f"CPU each) in {READY_TIMEOUT_S:g} s; the cluster's free CPUs: "
            f"{ray.available_resources().get('CPU', 0):g}. Use fewer --shards or add nodes"
        )
    remote = ray.remote(max_concurrency=4)(ShardActor)
    shards = []
    for index in range(count):
        where = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                 placement_group_bundle_index=index)  # fmt: skip
        actor = remote.options(num_cpus=1, scheduling_strategy=where).remote(index)
        shards.append(Shard(index=index, actor=actor))
    for shard, where_it_is in zip(shards, ray.get([s.actor.where.remote() for s in shards]),
                                  strict=True):  # fmt: skip
        shard.where = where_it_is
    return pg, shards


def _measure_clocks(ray: Any, shards: Sequence[Shard]) -> None:
    """Each node's clock offset against the driver's (`cluster.clock_offset`)."""
    for shard in shards:
        samples = []
        for _ in range(CLOCK_SAMPLES):
            sent = time.time_ns()
            remote = ray.get(shard.actor.clock.remote())
            samples.append(ClockSample(sent, remote, time.time_ns()))
        shard.offset_ns, shard.rtt_ns = clock_offset(samples)


def _say_placement(terminal: Terminal, shards: Sequence[Shard]) -> None:
    for s in shards:
        terminal.say(f"  shard {s.index}/{len(shards)} → node {s.where['node_ip']} "
                     f"({s.where['node_id'][:12]}), clock offset {s.offset_ns / 1e6:+.3f} "
                     f"ms (round trip {s.rtt_ns / 1e6:.3f} ms)")  # fmt: skip


def _launch_and_start(ray: Any, run: RunContext, shards: Sequence[Shard], url: str) -> int:
    """Launch every shard's process, wait until each is ready, tell them one start; a shard
    not ready by `READY_TIMEOUT_S` (any child's: `processes.child`) refuses the run before
    any traffic."""
    count = len(shards)
    each = [shard_options(run.options, Share(s.index, count), Path("."), url) for s in shards]
    ray.get([s.actor.launch.remote(run.spec, o) for s, o in zip(shards, each, strict=True)])
    reasons = ray.get([s.actor.wait_ready.remote(READY_TIMEOUT_S) for s in shards])
    not_ready = [(s, why) for s, why in zip(shards, reasons, strict=True) if why is not None]
    if not_ready:
        said = "; ".join(f"shard {s.index} not ready: {why}" for s, why in not_ready)
        ray.get([s.actor.refuse.remote(said) for s in shards])
        raise LoadgenError(f"refused before any traffic: {said}")
    start_ns = agree_start(time.time_ns())
    ray.get([s.actor.start.remote(start_ns, s.offset_ns) for s in shards])
    now = time.time_ns()
    for s in shards:
        s.finish_ref = s.actor.finish.remote()
        s.last_heard_ns = now
    return start_ns


def _watch(ray: Any, shards: Sequence[Shard], run: RunContext) -> bool:
    """Until every shard ended or is lost: collect each end, ask each running one how it
    goes (a shard silent for `LOST_AFTER_S` is lost), draw progress. Ctrl-C (and SIGTERM,
    as the command maps it) stops every shard; True when it did."""
    interrupted = False
    last_line = time.monotonic()
    while not all(s.done for s in shards):
        try:
            _poll(ray, shards)
            if time.monotonic() - last_line >= PROGRESS_S:
                last_line = time.monotonic()
                run.terminal.say(_progress_line(shards))
        except KeyboardInterrupt:
            if interrupted:
                continue  # already stopping every shard
            interrupted = True
            run.terminal.warn("\ninterrupted: stopping every shard (records kept)")
            for s in shards:
                if not s.done:
                    s.actor.interrupt.remote(run.options.grace_s)
    return interrupted


def _poll(ray: Any, shards: Sequence[Shard]) -> None:
    """One look at the shards (about `POLL_S`). An actor that is unavailable (its node
    unreachable for the moment) is silence, not yet loss: its `finish` is asked again and it
    is lost only once silent for `LOST_AFTER_S`; an actor that died is lost at once."""
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError

    pending = {s.finish_ref: s for s in shards if not s.done}
    done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
    for ref in done:
        shard = pending[ref]
        try:
            shard.ended = ray.get(ref)
            shard.ended_ns = time.time_ns()
        except ActorUnavailableError:
            shard.finish_ref = shard.actor.finish.remote()  # it waits for the same process
        except RayError as exc:
            _lose(shard, f"its actor died ({_first_words(exc)})")
    for shard in (s for s in shards if not s.done):
        try:
            _, shard.records = ray.get(shard.actor.progress.remote(), timeout=POLL_S * 2)
            shard.last_heard_ns = time.time_ns()
        except (GetTimeoutError, ActorUnavailableError):
            silent_s = (time.time_ns() - shard.last_heard_ns) / 1e9
            if silent_s > LOST_AFTER_S:
                _lose(shard, f"its node {shard.where.get('node_ip')} silent for {silent_s:.0f} s")
                ray.kill(shard.actor)
        except RayError as exc:
            _lose(shard, f"its actor died ({_first_words(exc)})")


def _lose(shard: Shard, why: str) -> None:
    shard.lost = why
    shard.ended_ns = time.time_ns()


def _first_words(exc: Exception) -> str:
    """An exception's kind and the start of its first line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:120]}"


def _progress_line(shards: Sequence[Shard]) -> str:
    running = sum(not s.done for s in shards)
    lost = [str(s.index) for s in shards if s.lost]
    records = sum(s.records for s in shards if not s.done)
    text = f"ray: {running}/{len(shards)} shards running, {records:,} records spilled"
    return text + (f", lost: shard {', '.join(lost)}" if lost else "")


def _collect_and_merge(
    run: RunContext, shards: Sequence[Shard], *, start_ns: int, interrupted: bool,
    info: RayInfo, ended: float,
) -> RunResult:  # fmt: skip
    """Every shard's folder into a staging folder (a lost one's made from its plan), merged
    into the run folder, the staging folder kept under it as `shards/`."""
    options, terminal = run.options, run.terminal
    run_id = run.run_dir.name
    staging = options.out_dir / f".{run_id}.shards"
    staging.mkdir(parents=True, exist_ok=True)
    rows: list[RayShard] = []
    lost: list[Shard] = []
    for s in shards:
        folder = s.ended.get("folder") if s.ended else None
        if folder is None:
            if s.lost is None:
                assert s.ended is not None
                s.lost = f"its process left no run folder (exit {s.ended['exit_code']}): " + (
                    s.ended.get("said") or "nothing said"
                )
            lost.append(s)
            continue
        unpack_run_folder(staging / str(s.index), folder)
    unpacked = sorted(p for p in staging.iterdir() if not p.name.startswith("."))
    if not unpacked:
        shutil.rmtree(staging, ignore_errors=True)
        said = "; ".join(f"shard {s.index}: {s.lost}" for s in lost)
        raise LoadgenError(f"no shard came back, nothing to merge: {said}")
    template = read_run_info(unpacked[0])
    for s in lost:
        alive_ns = max(0, s.last_heard_ns - start_ns)
        write_lost_shard(staging / str(s.index), template, Share(s.index, len(shards)),
                         start_at_unix_ns=start_ns, clock_offset_ns=s.offset_ns,
                         alive_ns=alive_ns, reason=s.lost or "lost")  # fmt: skip
        terminal.warn(f"shard {s.index} lost: {s.lost}; its plans are recorded "
                      "cancelled/not_sent (exit 5)")  # fmt: skip
    for s in shards:
        code = s.ended.get("exit_code") if s.ended else None
        outcome = LOST if s.lost else outcome_of(code, bool(s.ended and s.ended["recovered"]))
        reason = s.lost
        if outcome not in (OK, INTERRUPTED) and reason is None and s.ended:
            reason = f"its process ended with exit {code}; recovered on its node"
            terminal.warn(f"shard {s.index} killed: {reason} (exit 5)")
        rows.append(RayShard(
            index=s.index, node_id=s.where.get("node_id"), node_ip=s.where.get("node_ip"),
            clock_offset_ms=round(s.offset_ns / 1e6, 6), clock_rtt_ms=round(s.rtt_ns / 1e6, 6),
            outcome=outcome, reason=reason, exit_code=code,
        ))  # fmt: skip
    dirs = [staging / str(s.index) for s in shards]
    ray_info = replace(info, shards=tuple(rows))
    merged = merge_shards(dirs, options.out_dir, run_id, ray=ray_info)
    keep_shards(merged.run_dir, staging)
    final = replace(merged.run_info, ray=replace(ray_info, after_run_s=round(
        time.monotonic() - ended, 3)))  # fmt: skip
    write_run_info(merged.run_dir, final)
    terminal.say(f"ray: merged {len(shards)} shards into {merged.run_dir} "
                 f"({info.before_t0_s:.2f} s before t0, {final.ray.after_run_s:.2f} s "  # type: ignore[union-attr]
                 "after the run)")  # fmt: skip
    return RunResult(run_dir=merged.run_dir, summary=merged.summary,
                     interrupted=interrupted or merged.run_info.interrupted,
                     run_info=final)  # fmt: skip


def _clean_up(ray: Any, shards: Sequence[Shard], pg: Any, started_local: bool) -> None:
    """Every shard's process and temp folder, its actor, the placement group, and the local
    Ray this run started: gone (what cannot be reached, a lost node's, went with it)."""
    from ray.exceptions import RayError

    closes = [s.actor.close.remote() for s in shards if not s.lost]
    if closes:
        ray.wait(closes, num_returns=len(closes), timeout=30)
    for s in shards:
        with contextlib.suppress(RayError, ValueError):
            ray.kill(s.actor)
    if pg is not None:
        with contextlib.suppress(RayError, ValueError):
            ray.util.remove_placement_group(pg)
    if started_local:
        ray.shutdown()
