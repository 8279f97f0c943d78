"""The rules of `run --ray` that need no cluster (`run.scale.cluster`), and `--ray` without Ray."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.errors import LoadgenError
from loadgen.results.runfolder import T0, RunInfo, WorkloadInfo, read_run_info
from loadgen.run.scale.cluster import (
    SPREAD,
    STRICT_SPREAD,
    ClockSample,
    agree_start,
    clock_offset,
    outcome_of,
    plan_placement,
    skew_problems,
    write_lost_shard,
)
from loadgen.run.scale.raycluster.driver import (
    LOOPBACK_ONLY,
    RAY_AUTH_MODE,
    RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH,
    import_ray,
)
from loadgen.testing.builders import workload_file
from loadgen.workload.plans import plan_work
from loadgen.workload.shards import Share, split_work
from loadgen.workload.spec import load

WORKLOAD = """
name: lost
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 10}
    requests: 30
    prompt_tokens: {dist: fixed, value: 16}
    output_tokens: {dist: fixed, value: 8}
"""


@pytest.mark.parametrize(
    ("requested", "alive", "shards", "strategy"),
    [(None, 3, 3, STRICT_SPREAD), (2, 3, 2, STRICT_SPREAD), (3, 3, 3, STRICT_SPREAD),
     (4, 3, 4, SPREAD), (None, 1, 1, STRICT_SPREAD)],
)  # fmt: skip
def test_placement_is_one_shard_per_node_unless_there_are_too_few_nodes(
    requested: int | None, alive: int, shards: int, strategy: str
) -> None:
    """STRICT_SPREAD while nodes suffice; SPREAD with a note that says so otherwise."""
    placement = plan_placement(requested, alive)
    assert (placement.shards, placement.strategy) == (shards, strategy)
    assert (placement.note is not None) == (strategy == SPREAD)


def test_a_cluster_without_nodes_is_refused() -> None:
    """No alive node: a clear error, not an empty run."""
    with pytest.raises(LoadgenError, match="no alive node"):
        plan_placement(None, 0)


def test_the_clock_offset_comes_from_the_fastest_round_trip() -> None:
    """A node 5 ms ahead: the 2 ms round trip's midpoint gives +5 ms; the slow one is ignored."""
    samples = [
        ClockSample(sent_ns=0, remote_ns=40_000_000, received_ns=50_000_000),  # delayed reply
        ClockSample(sent_ns=100_000_000, remote_ns=106_000_000, received_ns=102_000_000),
    ]
    assert clock_offset(samples) == (5_000_000, 2_000_000)


def test_a_node_beyond_the_skew_bound_is_named() -> None:
    """Only offsets beyond the bound (either sign) are problems, each with its shard."""
    found = skew_problems({0: 1_000_000, 1: -12_000_000, 2: 10_000_000}, 10.0)
    assert len(found) == 1
    assert found[0].startswith("shard 1: its node's clock is -12.000 ms")


def test_the_start_is_agreed_a_lead_ahead_and_a_shard_end_is_named() -> None:
    """T = now + lead; an exit code maps to ok / interrupted / killed."""
    assert agree_start(10**18, 1.5) == 10**18 + 1_500_000_000
    assert [outcome_of(0, False), outcome_of(130, False), outcome_of(-9, False),
            outcome_of(5, True), outcome_of(None, False)] == [
        "ok", "interrupted", "killed", "killed", "killed"]  # fmt: skip


def test_a_lost_shard_gets_one_record_per_plan_cancelled_before_it_was_last_heard(
    tmp_path: Path,
) -> None:
    """Shard 1 of 2 lost 1.05 s after t0: its plans due by then are cancelled, the rest
    not_sent, every plan of its share has one record, and run.json marks it recovered."""
    path = workload_file(tmp_path, WORKLOAD)
    spec = load(path)
    resolved = dataclasses.asdict(spec)
    resolved.pop("raw", None)
    template = RunInfo(run_id="shard-0", seed=spec.seed, t0=T0(unix_ns=0),
                       workload=WorkloadInfo(name=spec.name, spec=resolved))  # fmt: skip
    planned = write_lost_shard(
        tmp_path / "1", template, Share(1, 2), start_at_unix_ns=10**18, clock_offset_ns=7,
        alive_ns=1_050_000_000, reason="its node went silent",
    )  # fmt: skip
    share = split_work(plan_work(spec, spec.seed), Share(1, 2))
    frame = pl.read_parquet(tmp_path / "1" / "records.parquet")
    assert planned == frame.height == len(share.plans) == 15
    due = {p.request_id for p in share.plans if p.intended_ns <= 1_050_000_000}
    for rid, outcome in frame.select("request_id", "outcome").iter_rows():
        assert outcome == ("cancelled" if rid in due else "not_sent")
    info = read_run_info(tmp_path / "1")
    assert (info.stop, info.shard.clock_offset_ns if info.shard else None) == ("incomplete", 7)
    assert isinstance(info.workload, WorkloadInfo)


def test_ray_without_the_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--ray` when Ray is not importable: exit 1, the pip line, no traceback, no folder."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    path = workload_file(tmp_path, WORKLOAD)
    result = CliRunner().invoke(cli, ["run", str(path), "--ray", "--out", str(tmp_path),
                                      "--run-id", "r"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "pip install 'loadgen[ray]'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_a_local_ray_gets_a_token_of_the_run_and_a_cluster_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--ray` alone: token auth with a fresh 256-bit token in the environment Ray's processes
    inherit (left to itself Ray saved one to ~/.ray/auth_token); a token or token file the
    user set is kept; `--ray ADDRESS` joins a cluster with whatever token it has."""
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # no Ray is started
    for name in (RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, LOOPBACK_ONLY):
        monkeypatch.setenv(name, "")  # recorded, so what import_ray sets is undone after
        monkeypatch.delenv(name)
    import_ray("auto")
    assert RAY_AUTH_TOKEN not in os.environ
    assert RAY_AUTH_MODE not in os.environ
    import_ray(None)
    token = os.environ[RAY_AUTH_TOKEN]
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert os.environ[RAY_AUTH_MODE] == "token"
    monkeypatch.delenv(RAY_AUTH_TOKEN)
    monkeypatch.setenv(RAY_AUTH_TOKEN_PATH, "/somewhere/token")
    import_ray(None)
    assert RAY_AUTH_TOKEN not in os.environ


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["--shards", "2"], "--shards"), (["--ray", "auto", "--shard", "0/2", "--start-at", "1"],
     "--shard"), (["--ray", "auto", "--repeats", "2"], "--repeats")],
)  # fmt: skip
def test_ray_options_that_do_not_combine_are_refused(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    """--shards needs --ray; --ray replaces --shard and --repeats: exit 1 naming the flag."""
    path = workload_file(tmp_path, WORKLOAD)
    result = CliRunner().invoke(cli, ["run", str(path), *args])
    assert result.exit_code == 1, result.output
    assert flag in result.output
