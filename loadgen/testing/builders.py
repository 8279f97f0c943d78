"""Records, run folders and workload files for tests, shaped like the real ones.

`streamed_record` and `failed_record` build the two kinds of request record the suites
need (times in ms, relative to t0), `split_record` an ok one whose TTFT splits as given
(`analysis.split`); `write_run` writes a run folder (run.json with t0 and the workload's
classes, records.parquet, and the per-minute histograms if asked) that the results store,
rolling windows and `compare` read as they read a real one.
`chat_workload` is the one-class workload most command tests run, as YAML, and
`workload_file` writes any workload text into a test's folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from loadgen.analysis.audit import audit
from loadgen.analysis.minutes import run_histograms
from loadgen.analysis.objectives import Objective
from loadgen.codec import to_json
from loadgen.results.records import Outcome, RequestRecord, ServerTimings, to_frame
from loadgen.results.runfolder import RECORDS_FILE, RUN_FILE, SUMMARY_FILE, read_records
from loadgen.results.write import write_histograms
from loadgen.workload.spec import SloTargets

MS = 1_000_000


def streamed_record(
    request_id: int,
    *,
    intended_ms: float = 0.0,
    ttft_ms: float = 100.0,
    gaps_ms: Sequence[float] = (10.0, 10.0),
    lag_ms: float = 0.0,
    class_name: str = "chat",
    outcome: Outcome = Outcome.OK,
    from_send: bool = False,
    end_after_ms: float = 1.0,
    sent: bool = True,
    content: bool = False,
    **fields: Any,
) -> RequestRecord:
    """A record with one token per chunk: sent `lag_ms` late, its first chunk `ttft_ms` after
    the intended time (after the send with `from_send`), then one chunk per gap, and its end
    `end_after_ms` after the last chunk. `sent=False` leaves the dispatch and send times
    out, `content` stamps the first chunk as the first visible token too, and `fields` set
    any other field of the record. Chunks at one time arrived in one read (a gap of 0: the
    reads counted are the distinct times)."""
    intended = int(intended_ms * MS)
    send = intended + int(lag_ms * MS)
    chunks = [(send if from_send else intended) + int(ttft_ms * MS)]
    for gap in gaps_ms:
        chunks.append(chunks[-1] + int(gap * MS))
    return RequestRecord(
        request_id=request_id,
        class_name=class_name,
        intended_ns=intended,
        outcome=outcome,
        dispatched_ns=send if sent else None,
        sent_ns=send if sent else None,
        first_token_ns=chunks[0],
        first_content_ns=chunks[0] if content else None,
        last_token_ns=chunks[-1],
        end_ns=chunks[-1] + int(end_after_ms * MS),
        chunk_ns=tuple(chunks),
        chunk_tokens=(1,) * len(chunks),
        output_tokens=len(chunks),
        **{"output_events": len(chunks), "output_reads": len(set(chunks)), **fields},
    )


def split_record(
    request_id: int,
    *,
    queue_ms: float,
    prefill_ms: float,
    outside_ms: float = 0.0,
    intake_ms: float | None = None,
    send_lag_ms: float = 0.0,
    **fields: Any,
) -> RequestRecord:
    """An ok record whose TTFT splits exactly into the parts given (`analysis.split`): sent
    `send_lag_ms` late, its first token `outside_ms` + the server's TTFT after the send,
    the server saying `queue_ms` and `prefill_ms`, and its arrival-based TTFT (queue +
    prefill + `intake_ms`) only when `intake_ms` is given (as vLLM's span says it; the
    stream's in-band account says no TTFT of its own). `fields` go to `streamed_record`."""
    server_ttft = queue_ms + prefill_ms + (intake_ms or 0.0)
    said = ServerTimings(queue_ms=queue_ms, prefill_ms=prefill_ms,
                         ttft_ms=None if intake_ms is None else server_ttft)  # fmt: skip
    return streamed_record(request_id, ttft_ms=outside_ms + server_ttft, lag_ms=send_lag_ms,
                           from_send=True, server_timings=said, **fields)  # fmt: skip


def failed_record(
    request_id: int,
    *,
    intended_ms: float = 0.0,
    outcome: Outcome = Outcome.REJECTED,
    lag_ms: float = 0.0,
    end_after_ms: float = 1.0,
    class_name: str = "chat",
    sent: bool = True,
    **fields: Any,
) -> RequestRecord:
    """A request that produced nothing: sent `lag_ms` late and ended `end_after_ms` after
    the send (never sent with `sent=False`: it ended `end_after_ms` after its intended
    time); `fields` set any other field of the record."""
    intended = int(intended_ms * MS)
    send = intended + int(lag_ms * MS)
    return RequestRecord(
        request_id=request_id,
        class_name=class_name,
        intended_ns=intended,
        outcome=outcome,
        dispatched_ns=send if sent else None,
        sent_ns=send if sent else None,
        end_ns=(send if sent else intended) + int(end_after_ms * MS),
        **fields,
    )


SLO_KEYS = ("ttft_ms", "tpot_ms", "percentile")  # what a run.json's class SLO holds by default


def write_run(
    store: Path,
    t0: datetime,
    records: Sequence[RequestRecord],
    *,
    slos: Mapping[str, SloTargets] | SloTargets,
    slo_keys: Sequence[str] = SLO_KEYS,
    run_id: str | None = None,
    workload: str = "chat",
    rate_per_s: float | None = None,
    stopped: str | None = None,
    histograms: bool = False,
    fell_behind: str | None = None,
    **info: Any,
) -> Path:
    """A run folder in `store`, as `loadgen run` leaves one: run.json and records.parquet,
    plus the per-minute histograms with `histograms`.

    run.json holds t0, the planned count and the workload: its name, and each class's SLO
    (`slo_keys` of the targets in `slos`; one `SloTargets` is every class of the records)
    with, given `rate_per_s`, a Poisson arrival rate: the identity the store pools runs
    by. The run id defaults to `<t0>-<workload>-<rate>`; `stopped` marks the run stopped
    early (`interrupted`, `incomplete`, `watchdog`); `fell_behind` writes its summary.json
    with the generator fallen behind for that reason (exit 3); `info` adds run.json keys.
    """
    if isinstance(slos, SloTargets):
        slos = dict.fromkeys(sorted({r.class_name for r in records}), slos)
    arrival = {} if rate_per_s is None else {"arrival": {"process": "poisson",
                                                         "rate_per_s": rate_per_s}}  # fmt: skip
    classes = {name: {"slo": {k: getattr(slo, k) for k in slo_keys}, **arrival}
               for name, slo in slos.items()}  # fmt: skip
    run_id = run_id or t0.strftime(f"%Y%m%dT%H%M%SZ-{workload}-{rate_per_s or 0:g}")
    run_info = {
        "run_id": run_id,
        "planned": len(records),
        "workload": {"name": workload, "spec": {"classes": classes}},
        "t0": {"perf_counter_ns": 1, "unix_ns": int(t0.timestamp() * 1e9), "utc": t0.isoformat()},
        "interrupted": stopped is not None,
        "finished": True,
        "stopped": stopped,
        **info,
    }
    run_dir = store / run_id
    run_dir.mkdir(parents=True)
    (run_dir / RUN_FILE).write_text(json.dumps(run_info), encoding="utf-8")
    to_frame(records).write_parquet(run_dir / RECORDS_FILE)
    if histograms:
        write_histograms(run_dir, run_histograms(run_dir))
    if fell_behind is not None:
        write_fell_behind_summary(run_dir, slos, fell_behind)
    return run_dir


def write_fell_behind_summary(run_dir: Path, slos: Mapping[str, SloTargets], why: str) -> None:
    """The run's summary.json as its audit writes it, with its generator fallen behind for
    `why` (exit 3): how the results store knows the run is no measure of the server."""
    objectives = {name: Objective(name=name, slo=slo) for name, slo in slos.items()}
    frame = read_records(run_dir)
    summary = audit(frame, run_id=run_dir.name, objectives=objectives, planned=frame.height)
    summary = replace(
        summary,
        generator=replace(summary.generator, fell_behind=True, reason=why),
        verdict=replace(summary.verdict, status="fell_behind", fell_behind=True, exit_code=3),
    )
    (run_dir / SUMMARY_FILE).write_text(json.dumps(to_json(summary)), encoding="utf-8")


def chat_workload(
    name: str = "tiny",
    *,
    target: str | None = "{api: openai-chat, model: m}",
    rate_per_s: float = 50,
    requests: int = 20,
    prompt_tokens: int = 5,
    output_tokens: int = 3,
    slo: str | None = "{ttft_ms: 2000, tpot_ms: 1000, percentile: 50}",
    deadlines: str | None = "{first_token_s: 5, stall_s: 5, total_s: 10}",
) -> str:
    """The workload most command tests need, as YAML: one class `chat` at a constant rate
    with fixed prompt and output sizes, and loose targets at the median, which five
    requests judge at 95 % (`confidence.samples_needed`): a test of something else gets a
    verdict, not INCONCLUSIVE. A section given as None is left out (its defaults apply);
    tests edit the text further with `str.replace`."""
    lines = [f"name: {name}"]
    if target is not None:
        lines.append(f"target: {target}")
    lines += [
        "classes:",
        "  chat:",
        f"    arrival: {{process: constant, rate_per_s: {rate_per_s:g}}}",
        f"    requests: {requests}",
        f"    prompt_tokens: {{dist: fixed, value: {prompt_tokens}}}",
        f"    output_tokens: {{dist: fixed, value: {output_tokens}}}",
    ]
    if slo is not None:
        lines.append(f"    slo: {slo}")
    if deadlines is not None:
        lines.append(f"    deadlines: {deadlines}")
    return "\n".join(lines) + "\n"


def workload_file(folder: Path, text: str, name: str = "w.yaml") -> Path:
    """`text` written as the workload file `name` in `folder`; its path."""
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path
