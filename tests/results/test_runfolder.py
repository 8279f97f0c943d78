"""The run folder's run.json: read as a typed RunInfo and written back as the same JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.errors import LoadgenError
from loadgen.results.runfolder import RunInfo, read_run_info
from loadgen.results.write import write_run_info
from loadgen.workload.identity import identity_of_run
from loadgen.workload.spec import SloTargets

FINISHED: dict[str, Any] = {
    "run_id": "r",
    "schema_version": 5,
    "loadgen_version": "0.1.0",
    "seed": 7,
    "planned": 4,
    "workload": {
        "name": "chat",
        "source": "workloads/chat.yaml",
        "spec": {"classes": {"chat": {"kind": "chat", "turns": {"dist": "fixed", "value": 2},
                                      "slo": {"ttft_ms": 500, "percentile": 90.0}}}},
        "identity": {"name": "chat", "fingerprint": "f" * 16, "key": "chat@ffffffff",
                     "offered_rate_per_s": 2.0},
    },
    "target": {"url": "http://127.0.0.1:1/v1/chat/completions", "api": "openai-chat",
               "model": "m", "builtin_sim": True, "sim_args": ["--max-batch", "8"]},
    "options": {"max_in_flight": None, "lag_bound_ms": 5.0, "grace_s": 5.0},
    "shard": {"index": 1, "count": 2, "start_at_unix_ns": 10, "start_at_utc": "u",
              "t0_unix_ns": 11, "t0_skew_ms": 0.001},
    "host": {"hostname": "h", "platform": "p", "python": "3.11", "cpus": 2,
             "open_files_limit": 1024},
    "workers": {"count": 1, "chosen": "one process", "processes": [
        {"index": 0, "pid": 9, "exit_code": 0, "records": 4, "lag_ms_p99": 0.5,
         "late_share": 0.0, "fell_behind": False, "t0_skew_us": 0.0, "reached_late_ms": 0.1}]},
    "t0": {"perf_counter_ns": 1, "unix_ns": 11, "utc": "2026-11-29T10:00:00+00:00",
           "measured_unix_ns": 11, "reached_late_ms": 0.1},
    "interrupted": False,
    "finished": True,
    "stopped": None,
    "watchdog": None,
}  # fmt: skip
OLDEST = {  # what a schema-1 run.json held: no workers, shard, stop or identity
    "run_id": "old",
    "planned": 2,
    "workload": {"name": "chat", "source": "w.yaml", "spec": {"classes": {"chat": {}}}},
    "t0": {"perf_counter_ns": 1, "unix_ns": 5, "utc": "2026-01-01T00:00:00+00:00"},
    "interrupted": False,
    "finished": True,
}


def test_run_json_round_trips_key_for_key(tmp_path: Path) -> None:
    """Read and written back, a finished run's run.json is the same text: no key added, lost
    or moved."""
    (tmp_path / "run.json").write_text(json.dumps(FINISHED, indent=2) + "\n")
    info = read_run_info(tmp_path)
    write_run_info(tmp_path, info)
    assert (tmp_path / "run.json").read_text() == json.dumps(FINISHED, indent=2) + "\n"
    assert read_run_info(tmp_path) == info


def test_an_old_run_json_keeps_what_it_had(tmp_path: Path) -> None:
    """Rewritten (recovered, merged), an old run.json keeps its keys and values in order; the
    blocks it lacks stay out, and only shard, stopped and watchdog, which every run.json now
    has, are added as null."""
    (tmp_path / "run.json").write_text(json.dumps(OLDEST))
    write_run_info(tmp_path, read_run_info(tmp_path))
    written = json.loads((tmp_path / "run.json").read_text())
    assert [k for k in written if k in OLDEST] == list(OLDEST)
    assert {k: written[k] for k in OLDEST} == OLDEST
    assert {k: v for k, v in written.items() if k not in OLDEST} == {
        "shard": None,
        "stopped": None,
        "watchdog": None,
    }


def test_run_info_reads_typed_fields(tmp_path: Path) -> None:
    """The blocks are typed: the t0 anchor, the shard, the processes, each class as recorded."""
    (tmp_path / "run.json").write_text(json.dumps(FINISHED))
    info = read_run_info(tmp_path)
    assert info.t0 is not None
    assert (info.t0.unix_ns, info.t0.measured_unix_ns) == (11, 11)
    assert info.shard is not None
    assert (info.shard.index, info.shard.count) == (1, 2)
    assert info.workers is not None
    assert info.workers.processes[0].pid == 9
    assert info.target is not None
    assert info.target.sim_args == ("--max-batch", "8")
    chat = info.classes()["chat"]
    assert (chat.kind, chat.has_turns) == ("chat", True)
    assert info.slos() == {"chat": SloTargets(ttft_ms=500, percentile=90.0)}
    # Recorded before cache modes (no scheme 3): derived from the stored spec, as warm.
    assert info.identity()["key"] != "chat@ffffffff"

    def stored_as(cache: str) -> dict[str, Any]:
        spec = {**FINISHED["workload"]["spec"], "cache": cache}
        return {**FINISHED, "workload": {**FINISHED["workload"], "spec": spec}}

    assert info.identity() == identity_of_run(stored_as("warm")) != identity_of_run(
        stored_as("cold"))  # fmt: skip
    recorded = {**FINISHED["workload"]["identity"], "scheme": 3}
    (tmp_path / "run.json").write_text(json.dumps(
        {**FINISHED, "workload": {**FINISHED["workload"], "identity": recorded}}))  # fmt: skip
    assert read_run_info(tmp_path).identity()["key"] == "chat@ffffffff"  # kept as recorded
    # schema 5 recorded the older rule's 5 ms default: no strict bound on a re-audit
    assert (info.lag_bound_ms, info.stop) == (None, None)
    (tmp_path / "run.json").write_text(json.dumps({**FINISHED, "schema_version": 20}))
    assert read_run_info(tmp_path).lag_bound_ms == 5.0  # given, from schema 20 on


@pytest.mark.parametrize(
    ("fields", "stop"),
    [
        ({}, None),
        ({"interrupted": True}, "interrupted"),
        (
            {"interrupted": True, "stopped": "watchdog", "watchdog": "nothing progressed"},
            "watchdog",
        ),
        ({"watchdog": "nothing progressed"}, "watchdog"),  # written before `stopped` existed
        ({"finished": False}, "incomplete"),  # killed, never recovered
        ({"recovered": True, "stopped": "incomplete"}, "incomplete"),
    ],
)
def test_how_a_run_stopped(fields: dict[str, Any], stop: str | None) -> None:
    """`stop` reads how the run ended from its flags, old runs' too."""
    assert RunInfo(run_id="r", **fields).stop == stop


def test_a_folder_without_a_proper_run_json_is_refused(tmp_path: Path) -> None:
    """No run.json, a run.json that is not an object, or one with a malformed block: named."""
    with pytest.raises(LoadgenError, match="not a run folder"):
        read_run_info(tmp_path)
    (tmp_path / "run.json").write_text("[]")
    with pytest.raises(LoadgenError, match="does not hold a JSON object"):
        read_run_info(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({**OLDEST, "t0": {"utc": "x"}}))
    with pytest.raises(LoadgenError, match=r"t0\.unix_ns is missing"):
        read_run_info(tmp_path)
