"""Model mixes and shared-prefix workloads: what is planned, what is sent, how it is reported."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.errors import ConfigError
from loadgen.results.runfolder import read_records
from loadgen.testing import ScriptedServer, run_engine, simple_chat
from loadgen.testing.builders import workload_file
from loadgen.workload.plans import plan_work
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.spec import loads

MIX = """name: mix
target: {api: openai-chat, model: base}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 100}
    requests: REQUESTS
    prompt_tokens: {dist: fixed, value: 20}
    output_tokens: {dist: fixed, value: 4}
    models: [{name: base, weight: 3}, {name: lora-fast, weight: 1}]
    slo: {ttft_ms: 150, percentile: 90}
"""


def test_a_weighted_mix_draws_each_model_in_proportion() -> None:
    """4,000 requests at weights 3:1: lora-fast's share is 1/4 within 4 binomial standard deviations."""
    work = plan_work(loads(MIX.replace("REQUESTS", "4000"), "mix.yaml"), seed=3)
    share = sum(p.model == "lora-fast" for p in work.plans) / 4000
    sigma = math.sqrt(0.25 * 0.75 / 4000)
    assert abs(share - 0.25) < 4 * sigma
    assert {p.model for p in work.plans} == {"base", "lora-fast"}


def test_a_session_keeps_one_model_and_model_alone_names_one() -> None:
    """A chat session sticks to the model drawn for it; `model:` gives a class one model."""
    text = MIX.replace("REQUESTS", "50").replace(
        "    models:", "    turns: {dist: fixed, value: 3}\n    models:"
    )
    work = plan_work(loads(text, "mix.yaml"), seed=1)
    assert all(len({p.model for p in flow.plans}) == 1 for flow in work.flows)
    single = MIX.replace("REQUESTS", "5").replace(
        "    models: [{name: base, weight: 3}, {name: lora-fast, weight: 1}]", "    model: other"
    )
    assert {p.model for p in plan_work(loads(single, "m.yaml")).plans} == {"other"}


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ("[]", "must be a non-empty list"),
        ("[{name: a}, {name: a}]", "listed twice"),
        ("[{name: a, weight: 0}]", "must be > 0"),
        ("[{name: a, wieght: 1}]", "did you mean 'weight'"),
    ],
)
def test_a_bad_mix_is_a_clear_error(models: str, message: str) -> None:
    """An empty list, a repeated name, a zero weight, a typo: each names the key."""
    text = MIX.replace("REQUESTS", "5").replace(
        "[{name: base, weight: 3}, {name: lora-fast, weight: 1}]", models
    )
    with pytest.raises(ConfigError, match=message):
        loads(text, "mix.yaml")


def test_each_model_is_sent_recorded_and_reported_on_its_own(tmp_path: Path) -> None:
    """The slow adapter (300 ms before its first token) misses alone; the summary says so per
    model: base's ~30 requests show its p90 over the target, lora-fast's ~10 are all under
    it but too few to bound a p90 (29 would): inconclusive, not met."""

    def handler(request):
        slow = request.body.get("model") == "base"
        return simple_chat(4, first_delay_s=0.3 if slow else 0.0)

    workload = workload_file(tmp_path, MIX.replace("REQUESTS", "40"))
    with ScriptedServer(handler) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "--lag-bound-ms",
                                          "1000"])  # fmt: skip
    sent = {r.body["model"] for r in server.requests}
    assert sent == {"base", "lora-fast"}
    frame = read_records(tmp_path / "r")
    assert set(frame["model"].unique()) == {"base", "lora-fast"}
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    models = summary["classes"]["chat"]["models"]
    assert set(models) == {"base", "lora-fast"}
    base, fast = models["base"], models["lora-fast"]
    assert base["requests"] + fast["requests"] == 40
    assert base["ttft_ms"]["p50"] >= 300 > fast["ttft_ms"]["p99"]
    assert (base["met"], fast["met"], base["attainment"], fast["attainment"]) == (
        False,
        False,
        0,
        1,
    )
    assert (base["verdict"], fast["verdict"]) == ("missed", "inconclusive")
    assert "└ base" in result.output
    assert "└ lora-fast" in result.output
    check = CliRunner().invoke(cli, ["check", str(workload)])
    planned = f"base {base['requests'] / 40:.0%} ({base['requests']}), lora-fast"
    assert f"chat: models {planned}" in check.output  # the plan's mix is the one that ran


SHARED = """name: shared
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 100}
    requests: 60
    prompt: {shared_prefix_tokens: 300, groups: 4, suffix_tokens: {dist: fixed, value: 50}}
    output_tokens: {dist: fixed, value: 4}
"""


def test_a_shared_prefix_set_sends_each_groups_prefix_then_a_fresh_suffix() -> None:
    """Requests of one group share their first 300 words exactly; groups and suffixes differ."""
    work = plan_work(loads(SHARED, "shared.yaml"), seed=2)
    groups = {p.shared_prefix for p in work.plans}
    assert {g for g, _ in groups} == {0, 1, 2, 3}
    assert {t for _, t in groups} == {300}
    assert {p.prompt_tokens for p in work.plans} == {350}
    maker = PromptMaker(2)
    texts = {p.request_id: maker.shared(p.request_id, p.shared_prefix[0], 300, 350).split()
             for p in work.plans if p.shared_prefix}  # fmt: skip
    assert all(len(t) == 350 for t in texts.values())
    by_group: dict[int, set[tuple[str, ...]]] = {}
    suffixes = set()
    for plan in work.plans:
        assert plan.shared_prefix is not None
        by_group.setdefault(plan.shared_prefix[0], set()).add(tuple(texts[plan.request_id][:300]))
        suffixes.add(tuple(texts[plan.request_id][300:]))
    assert all(len(prefixes) == 1 for prefixes in by_group.values())
    assert len({next(iter(p)) for p in by_group.values()}) == 4
    assert len(suffixes) == 60


def test_the_server_receives_the_shared_prefix_text(tmp_path: Path) -> None:
    """What the server saw: 4 distinct 300-word prefixes over 60 requests, 60 distinct suffixes."""
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        run_engine(plan_work(loads(SHARED, "shared.yaml"), seed=2), server.url)
    prompts = [r.body["messages"][0]["content"].split() for r in server.requests]
    assert len(prompts) == 60
    assert all(len(p) == 350 for p in prompts)
    assert len({tuple(p[:300]) for p in prompts}) == 4
    assert len({tuple(p[300:]) for p in prompts}) == 60
    assert tmp_path.exists()
