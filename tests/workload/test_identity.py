"""Workload identity (what the store pools by) and the spec rebuilt from run.json (recovery)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loadgen.errors import LoadgenError
from loadgen.results.records import RequestRecord
from loadgen.results.store import discover_runs
from loadgen.testing import builders
from loadgen.workload.identity import (
    SettingDifference,
    fingerprint,
    identity,
    identity_of_run,
    spec_from_resolved,
    workload_differences,
)
from loadgen.workload.plans import plan_work
from loadgen.workload.spec import (
    ContextSpec,
    Deadlines,
    LengthDist,
    WorkloadSpec,
    load,
    loads,
    override,
)

WORKLOADS = sorted((Path(__file__).parents[2] / "workloads").glob("*.yaml"))
CHAT = """
name: chat
target: {api: openai-chat, model: m, url: "http://a:8000"}
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 4}
    requests: 40
    prompt_tokens: {dist: fixed, value: 200}
    output_tokens: {dist: fixed, value: 32}
    slo: {ttft_ms: 1000, tpot_ms: 50, percentile: 99}
"""


def stored(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as run.json keeps it (`run._run_info`): asdict, no raw, header names only."""
    data = dataclasses.asdict(spec)
    data.pop("raw")
    data["target"]["headers"] = sorted(spec.target.headers)
    return dict(json.loads(json.dumps(data)))


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_every_shipped_workload_is_rebuilt_from_run_json_with_the_same_plan(path: Path) -> None:
    """spec → run.json form → spec plans exactly the same requests (what --recover relies on)."""
    spec = load(path)
    rebuilt = spec_from_resolved(stored(spec))
    assert rebuilt.classes == spec.classes
    assert plan_work(rebuilt, 7).plans == plan_work(spec, 7).plans


FULL = """
name: full
target:
  url: "http://a:8000"
  headers: {X-Team: infra}
  server_metrics_url: /metrics
  server_metrics_headers: {X-Scope: lab}
classes:
  ramp:
    arrival: {process: ramp, steps: [{rate_per_s: 2, duration_s: 10}, {rate_per_s: 4, duration_s: 10}]}
    models: [{name: a, weight: 3}, {name: b}]
    prompt_tokens: {dist: fixed, value: 20}
    output_tokens: {dist: fixed, value: 8}
"""


def test_a_stored_spec_comes_back_field_for_field_and_a_broken_one_is_named_where() -> None:
    """run.json's spec is rebuilt whole (nested tuples, model mixes, a generic mapping),
    header values aside: run.json keeps their names only, rebuilt with empty values. A
    malformed stored value is refused with its place in run.json, not rebuilt wrong."""
    spec = loads(FULL)
    data = stored(spec)
    data["target"]["server_metrics_headers"] = sorted(spec.target.server_metrics_headers)
    rebuilt = spec_from_resolved(data)
    names_only = dataclasses.replace(
        spec.target, headers={"X-Team": ""}, server_metrics_headers={"X-Scope": ""}
    )
    assert rebuilt == dataclasses.replace(spec, raw={}, target=names_only)
    assert rebuilt.classes["ramp"].arrival.steps == ((2.0, 10.0), (4.0, 10.0))
    data["classes"]["ramp"]["arrival"]["steps"][1] = [4.0]
    with pytest.raises(LoadgenError, match=r"classes\.ramp\.arrival\.steps\[\] has 1 items, not 2"):
        spec_from_resolved(data)
    data["classes"]["ramp"]["arrival"] = "ramp"
    with pytest.raises(
        LoadgenError, match=r"workload\.spec\.classes\.ramp\.arrival is not an object"
    ):
        spec_from_resolved(data)


def test_seed_run_length_url_and_path_leave_the_identity_alone() -> None:
    """A nightly job that varies the seed, --requests/--duration, the URL or where the file
    lies runs one workload."""
    spec = loads(CHAT, "workloads/chat.yaml")
    same = [
        dataclasses.replace(spec, seed=9),
        override(spec, requests=500),
        override(spec, duration_s=120),
        dataclasses.replace(spec, target=dataclasses.replace(spec.target, url="http://b:9000")),
        loads(CHAT, "/elsewhere/chat.yaml"),
    ]
    assert {fingerprint(s) for s in same} == {fingerprint(spec)}


def test_rate_slo_model_cap_and_simulator_make_another_workload() -> None:
    """--rate 3x, another SLO, model, --max-in-flight or simulator profile: another workload."""
    spec = loads(CHAT)
    chat = spec.classes["chat"]
    stricter = dataclasses.replace(chat, slo=dataclasses.replace(chat.slo, ttft_ms=500))
    other = [
        override(spec, rate="3x"),
        override(spec, rate="8"),
        override(spec, model="big"),
        dataclasses.replace(spec, classes={"chat": stricter}),
        dataclasses.replace(spec, sim={"max_batch": 8}),
        dataclasses.replace(spec, name="chat-2"),
    ]
    prints = [fingerprint(s) for s in other] + [fingerprint(spec, max_in_flight=4)]
    assert len(set(prints)) == len(prints)
    assert fingerprint(spec) not in prints
    assert identity(override(spec, rate="3x"))["offered_rate_per_s"] == 12.0


def test_an_older_run_gets_the_identity_a_new_one_records() -> None:
    """A run.json without workload.identity (an older loadgen) derives the same key from its
    stored spec, also when the stored spec lacks a setting added since (at its default)."""
    spec = loads(CHAT)
    recorded = identity(spec)
    info = {"workload": {"name": "chat", "spec": stored(spec)}, "options": {}}
    assert identity_of_run(info) == recorded
    del info["workload"]["spec"]["classes"]["chat"]["priority"]  # a key an older loadgen lacked
    assert identity_of_run(info)["key"] == recorded["key"]
    assert identity_of_run({**info, "options": {"max_in_flight": 4}})["key"] != recorded["key"]


def test_each_cache_mode_is_another_workload_and_cold_keeps_the_key_it_had() -> None:
    """`cache: warm` and `reset` hash apart from each other and from cold; cold, the
    default, hashes as the file did before cache modes (the fingerprint main computed for
    CHAT before them), so new cold runs key as old runs recorded; an old run's stored spec
    (no `cache`) is warm, and the difference is named with its remedy."""
    spec = loads(CHAT)
    modes = {m: fingerprint(override(spec, cache=m)) for m in ("cold", "warm", "reset")}
    assert len(set(modes.values())) == 3
    assert modes["cold"] == fingerprint(spec) == OLD_CHAT_FINGERPRINT
    old = stored(spec)
    del old["cache"]
    assert spec_from_resolved(old).cache == "warm"
    info = {"workload": {"name": "chat", "spec": old}}
    assert identity_of_run(info) == identity(override(spec, cache="warm"))
    now = {"workload": {"name": "chat", "spec": stored(spec)}}
    (difference,) = workload_differences(info, now)
    assert difference.path == "cache"
    assert difference.describe().startswith('cache: "warm" vs "cold" (default)')
    assert "--cache" in difference.remedy()


OLD_CHAT_FINGERPRINT = "e5155fd109214867"  # main computed it before cache modes


def test_a_stored_spec_that_cannot_be_rebuilt_still_has_a_stable_identity() -> None:
    """A partial spec (hand-written, or of a loadgen this one cannot read) is hashed as stored:
    equal specs share a key, a different rate does not."""
    partial = {"classes": {"chat": {"slo": {"ttft_ms": 400}, "arrival": {"rate_per_s": 4}}}}
    faster = {"classes": {"chat": {"slo": {"ttft_ms": 400}, "arrival": {"rate_per_s": 12}}}}
    a = identity_of_run({"workload": {"name": "chat", "spec": partial}})
    b = identity_of_run({"workload": {"name": "chat", "spec": json.loads(json.dumps(partial))}})
    c = identity_of_run({"workload": {"name": "chat", "spec": faster}})
    assert a["key"] == b["key"] != c["key"]
    assert a["key"].startswith("chat@")


def test_a_dataset_counts_by_file_name_and_a_mix_or_prefix_set_is_another_workload(
    tmp_path: Path,
) -> None:
    """The same dataset in two folders is one workload; a model mix or a prefix set is another."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rows.jsonl").write_text('{"prompt": "hello there"}\n')
    dataset = CHAT.replace("    prompt_tokens: {dist: fixed, value: 200}\n",
                           "    dataset: {path: rows.jsonl, format: jsonl}\n")  # fmt: skip
    here, there = (loads(dataset, str(tmp_path / f / "w.yaml")) for f in ("a", "b"))
    assert fingerprint(here) == fingerprint(there)
    base = loads(CHAT)
    mixed = loads(CHAT.replace("    slo:", "    models: [{name: a}, {name: b}]\n    slo:"))
    shared = loads(CHAT.replace(
        "    prompt_tokens: {dist: fixed, value: 200}\n",
        "    prompt: {shared_prefix_tokens: 100, groups: 2, suffix_tokens: {dist: fixed, value: 100}}\n",
    ))  # fmt: skip
    prints = {fingerprint(s) for s in (base, mixed, shared, here)}
    assert len(prints) == 4


# -- agent context (what `kind: agent` sends changed: a growing context is now the default) --
AGENT = Path(__file__).parents[2] / "workloads" / "agent.yaml"
# A run.json of schema 8, written by a loadgen from before agents grew their context (its
# "how" entry says which and how), with the plan that loadgen made.
OLD_AGENT_RUN = Path(__file__).parents[1] / "schema" / "run-v8-agent.json"
# Fingerprints of the workloads shipped without an agent class and of CHAT, computed at
# main fd111d6 (before agent classes hashed their context mode): they must not move. Since
# then the files' SLO percentiles were lowered to ones their sizes can judge at 95 %
# confidence (and dataset-chat's conversations doubled their rate): a new series, as any
# change of SLO is; `at_pin` puts those values back, so the rule is what is pinned.
PINNED = {
    "chat-smoke.yaml": ("12d9a38bdad73bd3", "8444d46819fcfd57"),
    "chat.yaml": ("bda632f6a680b3f6", "5c38e2da54711187"),
    "dataset-chat.yaml": ("bf3fac13cc329bd6", "c69bb7c394564adf"),
    "generic-sse.yaml": ("37f5d06cded0e2af", "320c116e7cfd7ac7"),
    "mixed.yaml": ("51ead8ec8b5f46af", "60934f11c497286b"),
    "shared-prefix.yaml": ("2c6a24e585c883ef", "86c2c05b800b4e7d"),
    "summarization.yaml": ("fba273cb105c7a4a", "b905e0dfe3a6e74f"),
    "trace-azure-conv.yaml": ("4b2e10a238912d79", "9d502deac10f8cd6"),
}


# What the shipped files held at the pin, where they changed since: per file, per class,
# the SLO percentile (and an arrival rate).
AT_PIN: dict[str, dict[str, dict[str, float]]] = {
    "agent.yaml": {"agent": {"percentile": 90}},
    "chat-smoke.yaml": {"chat": {"percentile": 99}},
    "chat.yaml": {"chat": {"percentile": 99}},
    "dataset-chat.yaml": {"conversations": {"percentile": 95, "rate_per_s": 0.5}},
    "generic-sse.yaml": {"chat": {"percentile": 99}},
    "mixed.yaml": {"chat": {"percentile": 99}},
    "shared-prefix.yaml": {"chat": {"percentile": 95}},
    "trace-azure-conv.yaml": {"conversation": {"percentile": 99}},
}


def at_pin(name: str, spec: WorkloadSpec) -> WorkloadSpec:
    """The shipped file `name` as it was at the pin (`AT_PIN`)."""
    classes = dict(spec.classes)
    for cls_name, then in AT_PIN.get(name, {}).items():
        cls = classes[cls_name]
        slo = dataclasses.replace(cls.slo, percentile=then["percentile"])
        arrival = cls.arrival
        if "rate_per_s" in then:
            arrival = dataclasses.replace(arrival, rate_per_s=then["rate_per_s"])
        classes[cls_name] = dataclasses.replace(cls, slo=slo, arrival=arrival)
    return dataclasses.replace(spec, classes=classes)


def test_every_shipped_workload_without_an_agent_class_keeps_its_fingerprint() -> None:
    """The fingerprints (without and with --max-in-flight 8) of every shipped workload that
    has no agent class, as it was then (`at_pin`), are the ones main computed before the
    agent rule, and so is CHAT's."""
    shipped = {p.name: at_pin(p.name, load(p)) for p in WORKLOADS}
    plain = {n for n, s in shipped.items() if all(c.kind != "agent" for c in s.classes.values())}
    assert plain == set(PINNED)  # a new non-agent workload: pin it here
    now = {n: (fingerprint(shipped[n]), fingerprint(shipped[n], max_in_flight=8)) for n in plain}
    assert now == PINNED
    assert fingerprint(loads(CHAT)) == "e5155fd109214867"


def agent_with(**context: Any) -> WorkloadSpec:
    """workloads/agent.yaml with its agent class's `context` (and `tool_result_tokens`,
    given as `tool_result_tokens=`) replaced."""
    spec = load(AGENT)
    cls = spec.classes["agent"]
    tools = context.pop("tool_result_tokens", cls.tool_result_tokens)
    cls = dataclasses.replace(cls, context=ContextSpec(**context), tool_result_tokens=tools)
    return dataclasses.replace(spec, classes={"agent": cls})


def test_a_growing_and_a_fixed_context_are_two_workloads_and_each_is_stable() -> None:
    """grow true (the default) vs false: two fingerprints; either, built twice, one. A cap,
    its overflow and summary size, and the tool result's length are each another workload;
    the default written out is the default, and a setting the mode ignores splits nothing."""
    spec = load(AGENT)
    grow, fixed = agent_with(grow=True), agent_with(grow=False)
    assert fingerprint(grow) == fingerprint(spec) == fingerprint(load(AGENT))
    assert fingerprint(fixed) == fingerprint(agent_with(grow=False))
    assert fingerprint(grow) != fingerprint(fixed)
    no_tools = agent_with(grow=True, tool_result_tokens=None)  # the plans' default: 100 tokens
    assert fingerprint(no_tools) == fingerprint(grow)  # agent.yaml writes that default out
    variants = [
        grow,
        fixed,
        agent_with(grow=True, max_tokens=4000),
        agent_with(grow=True, max_tokens=3000),
        agent_with(grow=True, max_tokens=4000, overflow="summarize"),
        agent_with(grow=True, max_tokens=4000, overflow="summarize", summary_tokens=300),
        agent_with(grow=True, tool_result_tokens=LengthDist(dist="fixed", value=200)),
    ]
    prints = [fingerprint(s) for s in variants]
    assert len(set(prints)) == len(prints)
    ignored = [agent_with(grow=True, summary_tokens=300), agent_with(grow=True, overflow="summarize"),
               agent_with(grow=False, tool_result_tokens=None)]  # fmt: skip
    assert [fingerprint(s) for s in ignored] == [prints[0], prints[0], prints[1]]


def test_an_explicit_fixed_context_keeps_the_key_it_had_before_the_agent_rule() -> None:
    """`context: {grow: false}` hashes as the default-dropping rule hashed it before (the
    fingerprint main computed for that file at fd111d6), so such runs stay one series."""
    pinned = at_pin(AGENT.name, agent_with(grow=False, tool_result_tokens=None))
    assert fingerprint(pinned) == "8ac1b096d320aa36"


def old_agent_run() -> dict[str, Any]:
    return dict(json.loads(OLD_AGENT_RUN.read_text(encoding="utf-8")))


def test_an_old_shape_run_json_is_the_fixed_context_workload() -> None:
    """A schema-8 agent run (no `context` in its stored spec; the identity it recorded,
    agent@14281b2b, is what a growing run of that file also recorded before the agent rule)
    is identified as the fixed-context workload, not as today's growing default, and (no
    `cache` either: it sent the same bytes every run) as a warm one."""
    info = old_agent_run()
    assert info["schema_version"] == 8
    assert "context" not in info["workload"]["spec"]["classes"]["agent"]
    assert info["workload"]["identity"]["key"] == "agent@14281b2b"
    rebuilt = spec_from_resolved(info["workload"]["spec"])
    assert rebuilt.classes["agent"].context == ContextSpec(grow=False)
    assert rebuilt.cache == "warm"
    fixed = dataclasses.replace(
        at_pin(AGENT.name, agent_with(grow=False, tool_result_tokens=None)), seed=0
    )  # the file as that run ran it (its SLO, since lowered)
    assert identity_of_run(info) == identity(dataclasses.replace(fixed, cache="warm"))
    assert identity_of_run(info) != identity(fixed)  # not the cold default's
    assert identity_of_run(info)["key"] != identity(load(AGENT))["key"]
    # What a run of that same file records today (it grows its context) is not the key the
    # old run recorded, so nothing that reads recorded keys (a dashboard's workload_key
    # label) pools them either; before the agent rule it recorded agent@14281b2b too.
    as_written = agent_with(grow=True, tool_result_tokens=None)
    assert identity(as_written)["key"] not in ("agent@14281b2b", identity_of_run(info)["key"])


def test_recover_rebuilds_the_fixed_context_plan_an_old_run_made() -> None:
    """spec_from_resolved of the schema-8 run plans exactly what that loadgen planned: the
    same hops, times and lengths, as fixed-context trajectories without tool results."""
    info = old_agent_run()
    work = plan_work(spec_from_resolved(info["workload"]["spec"]), info["seed"])
    assert not work.singles
    got = [{"kind": f.kind, "session_id": f.session_id, "start_ns": f.start_ns,
            "plans": [[p.request_id, p.intended_ns, p.prompt_tokens, p.output_tokens, p.turn,
                       p.delay_s] for p in f.plans]} for f in work.flows]  # fmt: skip
    assert got == info["planned_flows"]
    assert [f.grow for f in work.flows] == [False] * 3
    assert {p.tool_result_tokens for f in work.flows for p in f.plans} == {0}


def test_a_growing_run_recorded_before_the_agent_rule_gets_the_growing_identity() -> None:
    """A run written between the change of default and the agent rule: its stored spec grows
    the context, its recorded identity is the ambiguous one; it is identified by its spec.
    A run this loadgen writes keeps the identity it recorded."""
    spec = load(AGENT)
    recorded = identity(spec)
    window = {"workload": {"name": "agent", "spec": stored(spec),
                           "identity": old_agent_run()["workload"]["identity"]}}  # fmt: skip
    assert identity_of_run(window) == recorded
    now = {"workload": {"name": "agent", "spec": stored(spec), "identity": recorded}}
    assert identity_of_run(now) == recorded


def test_an_agent_identity_that_names_the_agent_rule_is_kept_as_recorded() -> None:
    """A recorded identity of scheme 3 (this rule; a newer loadgen may hash settings this one
    cannot rebuild) is kept even where the stored spec hashes otherwise here; the same
    identity without its scheme (an older loadgen's) is re-derived from the spec, an agent's
    or not (before scheme 3 a key did not say the run was warm)."""
    spec = load(AGENT)
    newer = {**identity(spec), "fingerprint": "f" * 16, "key": "agent@ffffffff"}
    run = {"workload": {"name": "agent", "spec": stored(spec), "identity": newer}}
    assert identity_of_run(run)["key"] == "agent@ffffffff"
    older = {k: v for k, v in newer.items() if k != "scheme"}
    run = {"workload": {"name": "agent", "spec": stored(spec), "identity": older}}
    assert identity_of_run(run) == identity(spec)
    chat = {"workload": {"name": "chat", "spec": stored(loads(CHAT)), "identity": older}}
    assert identity_of_run(chat) == identity(loads(CHAT))
    scheme_2 = {**newer, "scheme": 2}  # the agent rule's, recorded before cache modes
    run = {"workload": {"name": "agent", "spec": stored(spec), "identity": scheme_2}}
    assert identity_of_run(run) == identity(spec)


def test_the_store_does_not_pool_an_old_fixed_context_run_with_a_growing_one(
    tmp_path: Path,
) -> None:
    """A store of the schema-8 fixed-context run (TTFT 100 ms), a growing run recorded before
    the agent rule (300 ms) and one recorded after (300 ms): `report STORE` shows two
    workloads, the fixed one with its 1 run and p50 100 ms, the growing one with 2 and 300."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    def records(n: int, ttft_ms: float) -> list[RequestRecord]:
        return [builders.streamed_record(i, intended_ms=100.0 * i, ttft_ms=ttft_ms,
                                         class_name="agent") for i in range(n)]  # fmt: skip

    def write(hour: int, ttft_ms: float, n: int, run_id: str, workload: dict[str, Any]) -> None:
        run_dir = builders.write_run(tmp_path, datetime(2026, 3, 1, hour, tzinfo=UTC),
                                     records(n, ttft_ms), slos={"agent": slo}, run_id=run_id)  # fmt: skip
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        (run_dir / "run.json").write_text(json.dumps({**info, "workload": workload}))

    old, spec = old_agent_run(), load(AGENT)
    slo = spec.classes["agent"].slo
    growing = {"name": "agent", "spec": stored(spec)}
    write(1, 100.0, 24, "old", old["workload"])
    write(2, 300.0, 20, "window", {**growing, "identity": old["workload"]["identity"]})
    write(3, 300.0, 16, "new", {**growing, "identity": identity(spec)})
    keys = {e.run_id: e.workload_key for e in discover_runs(tmp_path)}
    assert keys["window"] == keys["new"] != keys["old"]
    args = ["report", str(tmp_path), "--window", "1d", "--step", "1d", "--format", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = {r["workload"]: r for r in json.loads(result.stdout)}
    assert sorted(rows) == sorted({keys["old"], keys["new"]})
    assert (rows[keys["old"]]["runs"], rows[keys["old"]]["requests"]) == (1, 24)
    assert (rows[keys["new"]]["runs"], rows[keys["new"]]["requests"]) == (2, 36)
    assert rows[keys["old"]]["ttft_ms_p50"] == pytest.approx(100.0, rel=1e-3)
    assert rows[keys["new"]]["ttft_ms_p50"] == pytest.approx(300.0, rel=1e-3)


# -- what differs between two runs' workloads (compare's refusal names it) --------------------


def run_of(spec: WorkloadSpec, *, max_in_flight: int | None = None) -> dict[str, Any]:
    """The run.json keys the identity reads, as `loadgen run` writes them."""
    return {"workload": {"name": spec.name, "spec": stored(spec),
                         "identity": identity(spec, max_in_flight=max_in_flight)},
            "options": {"max_in_flight": max_in_flight}}  # fmt: skip


def test_a_fixed_and_a_growing_context_differ_in_the_context_mode_alone() -> None:
    """grow true vs false is one difference, named as the class's context mode; the tool
    results a growing context sends (and a fixed one ignores) are not listed beside it."""
    differences = workload_differences(
        run_of(agent_with(grow=True)), run_of(agent_with(grow=False))
    )
    assert differences == [SettingDifference(path="classes.agent.context.grow", first="true",
                                             second="false")]  # fmt: skip
    assert differences[0].describe() == (
        "classes.agent.context.grow: true vs false (class agent's context: growing vs fixed)"
    )
    assert "context: {grow: false}" in differences[0].remedy()
    capped = agent_with(grow=True, max_tokens=4000)
    assert [d.describe() for d in workload_differences(run_of(agent_with(grow=True)), run_of(capped))] == [
        "classes.agent.context.max_tokens: (default) vs 4000"
    ]  # fmt: skip


def test_every_hashed_setting_that_differs_is_named_with_both_values() -> None:
    """Rate, a deadline set on one side only (the other's default value shown), an SLO
    target dropped, the name and --max-in-flight; seed, URL and run length are not."""
    base = loads(CHAT)
    other = loads(CHAT.replace("rate_per_s: 4", "rate_per_s: 12").replace("tpot_ms: 50, ", "")
                  .replace("requests: 40", "requests: 400\n    deadlines: {first_token_s: 3}")
                  .replace("name: chat", "name: chat-3x").replace("http://a:8000", "http://b:9"))  # fmt: skip
    got = [d.describe() for d in workload_differences(run_of(base), run_of(other, max_in_flight=8))]
    assert got == [
        "classes.chat.arrival.rate_per_s: 4 vs 12",
        f"classes.chat.deadlines.first_token_s: {Deadlines().first_token_s:g} (default) vs 3",
        "classes.chat.slo.tpot_ms: 50 vs (default)",
        "max_in_flight: (default) vs 8",
        'name: "chat" vs "chat-3x"',
    ]
    same = loads(
        CHAT.replace("http://a:8000", "http://c:1").replace("requests: 40", "duration_s: 9")
    )
    assert workload_differences(run_of(base), run_of(dataclasses.replace(same, seed=7))) == []
    assert identity(same)["key"] == identity(base)["key"]  # the rule the list follows
