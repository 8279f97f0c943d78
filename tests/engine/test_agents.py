"""Growing agent trajectories: the context each hop carries, its cap, fan-out, tool messages per API."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterator

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions, Message
from loadgen.analysis.objectives import Objective, trajectory_block
from loadgen.engine.agents import capped
from loadgen.errors import ConfigError
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import ScriptedServer, run_engine, simple_chat
from loadgen.workload.plans import plan_work
from loadgen.workload.spec import load, loads

TASK, OUTPUT, TOOL = 200, 10, 50  # words: the task, each answer, each tool result


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with running_sim(["--speed", "20", "--max-batch", "64"]) as sim:
        yield sim.url


def agent_spec(extra: str = "", hops: int = 6, requests: int = 2, api: str = "openai-chat"):
    return loads(f"""name: agents
target: {{api: {api}, model: m}}
classes:
  agent:
    kind: agent
    arrival: {{process: constant, rate_per_s: 20}}
    requests: {requests}
    hops: {{dist: fixed, value: {hops}}}
    tool_time_s: {{dist: fixed, value: 0.01}}
    prompt_tokens: {{dist: fixed, value: {TASK}}}
    output_tokens: {{dist: fixed, value: {OUTPUT}}}
    tool_result_tokens: {{dist: fixed, value: {TOOL}}}
    slo: {{ttft_ms: 5000, percentile: 50}}
{extra}""", "agents.yaml")  # fmt: skip


def by_trajectory(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    result: dict[int, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.turn or 0, r.request_id)):
        assert record.session_id is not None
        result.setdefault(record.session_id, []).append(record)
    return result


def words(n: int) -> str:
    return " ".join(["w"] * n)


def test_capped_keeps_the_head_and_the_newest_steps_that_fit() -> None:
    """drop_oldest keeps the newest whole steps within the cap; summarize puts its summary in their place."""
    head: list[Message] = [("system", words(10)), ("user", words(100))]
    steps = [[("assistant", words(20)), ("tool", words(30))] for _ in range(4)]  # 50 each

    def count(text: str) -> int:
        return len(text.split())

    assert capped(head, steps, count, None, None) == (
        [*head, *functools.reduce(operator.iadd, steps, [])],
        0,
    )
    kept, dropped = capped(head, steps, count, 215, None)  # 110 + 2 × 50 fit, 3 do not
    assert (dropped, sum(count(t) for _, t in kept)) == (2, 210)
    kept, dropped = capped(head, steps, count, 210, None)  # exactly at the cap: still fits
    assert (dropped, sum(count(t) for _, t in kept)) == (2, 210)
    summary = ("user", words(20))
    kept, dropped = capped(head, steps, count, 215, summary)  # 110 + 20 + 50 + 50 = 230 > 215
    assert dropped == 3
    assert kept == [*head, summary, *steps[3]]
    assert capped(head, steps, count, 500, summary) == (
        [*head, *functools.reduce(operator.iadd, steps, [])],
        0,
    )


def test_each_hop_carries_the_whole_trajectory_so_far(sim_url: str) -> None:
    """Hop k sends the task plus k answers and k tool results: exactly, by the client and the server."""
    records = run_engine(plan_work(agent_spec(), seed=1), sim_url)
    assert len(records) == 12
    assert all(r.outcome is Outcome.OK for r in records)
    for hops in by_trajectory(records).values():
        for k, hop in enumerate(hops):
            assert hop.prompt_tokens_target == TASK + k * (OUTPUT + TOOL)
            assert hop.prompt_tokens == hop.prompt_tokens_target  # the simulator counted the same
    block = trajectory_block(to_frame(records), Objective.of(agent_spec().classes["agent"]))
    assert [h.prompt_tokens_mean for h in block.per_hop.values()] == [
        TASK + k * (OUTPUT + TOOL) for k in range(6)
    ]
    assert all(h.requests == 2 and h.ttft_ms.count == 2 for h in block.per_hop.values())


@pytest.mark.parametrize(
    ("context", "sizes"),
    [
        # cap 400: the task (200) and at most 3 steps of 60; then the oldest are dropped
        ("{max_tokens: 400}", [200, 260, 320, 380, 380, 380]),
        # summarize: the summary (5 + 40 words) replaces the dropped steps: 200 + 45 + 2 × 60
        ("{max_tokens: 400, overflow: summarize, summary_tokens: 40}",
         [200, 260, 320, 380, 365, 365]),
    ],
)  # fmt: skip
def test_a_context_cap_drops_or_summarises_the_oldest_hops(
    sim_url: str, context: str, sizes: list[int]
) -> None:
    """With `context.max_tokens`, every hop's context fits the cap and follows the policy."""
    records = run_engine(plan_work(agent_spec(f"    context: {context}\n"), seed=1), sim_url)
    assert all(r.outcome is Outcome.OK for r in records)
    for hops in by_trajectory(records).values():
        assert [h.prompt_tokens_target for h in hops] == sizes
        assert [h.prompt_tokens for h in hops] == sizes


def test_a_fan_out_hop_runs_its_branches_at_once_and_joins_them(sim_url: str) -> None:
    """fanout at hop 2 × 3: three concurrent requests, and hop 3 carries all three answers and results."""
    spec = agent_spec("    fanout: {at_hop: 2, branches: 3}\n", hops=4, requests=1)
    work = plan_work(spec, seed=1)
    assert len(work.plans) == 6
    assert [p.branch for p in work.plans] == [None, None, 0, 1, 2, None]
    records = run_engine(work, sim_url)
    assert all(r.outcome is Outcome.OK for r in records)
    (hops,) = by_trajectory(records).values()
    branches = [r for r in hops if r.turn == 2]
    assert len(branches) == 3
    # concurrent: every branch was sent before any of them ended
    assert max(r.sent_ns or 0 for r in branches) < min(r.end_ns or 0 for r in branches)
    step = OUTPUT + TOOL
    sub_task = 8  # words of "Sub-task 1 of 3: work on part 1."
    assert [r.prompt_tokens_target for r in branches] == [TASK + 2 * step + sub_task] * 3
    final = hops[-1]
    assert final.prompt_tokens_target == TASK + 2 * step + 3 * step
    # after the join: the tool time (10 ms) from the last branch's end
    assert final.intended_ns - max(r.end_ns or 0 for r in branches) == 10_000_000
    block = trajectory_block(to_frame(records), Objective.of(spec.classes["agent"]))
    assert block.per_hop["2"].requests == 3
    assert block.ok == 1
    assert block.time_split_s.tool >= 0  # the join's gap is measured from the last branch


def test_a_fixed_context_is_still_available() -> None:
    """`context: {grow: false}` plans no tool results (the older, fixed-context agent)."""
    work = plan_work(agent_spec("    context: {grow: false}\n"), seed=1)
    assert all(p.tool_result_tokens == 0 for p in work.plans)
    assert not work.flows[0].grow


CONVERSATION: list[Message] = [
    ("system", "sys"), ("user", "task"), ("assistant", "a0"), ("tool", "r0"),
    ("assistant", "a1"), ("tool", "r1"),
]  # fmt: skip


def body(api: str) -> dict:
    return adapter_for(api).build_body(CONVERSATION, 5, BodyOptions(model="m"))


def test_openai_chat_sends_tool_calls_and_tool_messages_with_matching_ids() -> None:
    """OpenAI chat: each answer is an assistant message with `tool_calls`, each result a `role: tool` reply to its id."""
    messages = body("openai-chat")["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    for call, result in ((messages[2], messages[3]), (messages[4], messages[5])):
        (tool_call,) = call["tool_calls"]
        assert tool_call["type"] == "function"
        assert tool_call["function"]["arguments"] == "{}"
        assert result["tool_call_id"] == tool_call["id"]
    assert messages[2]["tool_calls"][0]["id"] != messages[4]["tool_calls"][0]["id"]
    assert messages[3]["content"] == "r0"
    assert messages[2]["content"] == "a0"


def test_anthropic_sends_tool_use_and_tool_result_blocks() -> None:
    """Anthropic: tool_use blocks in the assistant turn, tool_result blocks in a user turn, system on top."""
    sent = body("anthropic")
    assert sent["system"] == "sys"
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    text, use = messages[1]["content"]
    assert text == {"type": "text", "text": "a0"}
    assert use["type"] == "tool_use"
    (result,) = messages[2]["content"]
    assert result == {"type": "tool_result", "tool_use_id": use["id"], "content": "r0"}


def test_responses_and_ollama_and_text_apis_carry_the_tool_results() -> None:
    """Responses: function_call + function_call_output; Ollama: role tool; text-in APIs: flattened."""
    items = body("openai-responses")["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]
    assert [o["output"] for o in outputs] == ["r0", "r1"]
    ollama = body("ollama-chat")["messages"]
    assert [m["role"] for m in ollama][-2:] == ["assistant", "tool"]
    assert "tool_calls" in ollama[-2]
    assert body("openai-completions")["prompt"] == "sys\n\ntask\n\na0\n\nr0\n\na1\n\nr1"


@pytest.mark.parametrize("api", ["anthropic", "openai-responses", "ollama-chat"])
def test_the_simulator_counts_every_tool_result_in_each_dialect(sim_url: str, api: str) -> None:
    """The simulator's prompt count equals the client's context size hop by hop, in each dialect's shape."""
    records = run_engine(
        plan_work(agent_spec(hops=3, requests=1, api=api), seed=1), sim_url, api=api
    )
    assert all(r.outcome is Outcome.OK for r in records)
    sizes = [r.prompt_tokens_target for r in sorted(records, key=lambda r: r.turn or 0)]
    assert sizes == [TASK, TASK + OUTPUT + TOOL, TASK + 2 * (OUTPUT + TOOL)]
    assert [r.prompt_tokens for r in sorted(records, key=lambda r: r.turn or 0)] == sizes


def test_a_failed_branch_skips_the_rest_of_its_trajectory() -> None:
    """A fan-out branch that fails ends the trajectory: later hops are skipped, none is lost."""
    spec = agent_spec("    fanout: {at_hop: 1, branches: 2}\n", hops=3, requests=1)

    def handler(request):  # the second branch (request id 2) fails
        if any("Sub-task 2 of 2" in str(m["content"]) for m in request.body["messages"]):
            return [b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"]
        return simple_chat(OUTPUT)

    with ScriptedServer(handler) as server:
        records = run_engine(plan_work(spec, seed=1), server.url)
    outcomes = {r.request_id: r.outcome for r in records}
    assert outcomes == {0: Outcome.OK, 1: Outcome.OK, 2: Outcome.HTTP_ERROR, 3: Outcome.SKIPPED}


@pytest.mark.slow
def test_ttft_grows_with_the_context_at_the_simulators_prefill_rate() -> None:
    """One trajectory alone: each hop's TTFT grows by (answer + tool result) / prefill rate (8000 tok/s)."""
    text = """name: slope
target: {api: openai-chat, model: m}
classes:
  agent:
    kind: agent
    arrival: {process: constant, rate_per_s: 1}
    requests: 1
    hops: {dist: fixed, value: 8}
    tool_time_s: {dist: fixed, value: 0.05}
    prompt_tokens: {dist: fixed, value: 500}
    output_tokens: {dist: fixed, value: 8}
    tool_result_tokens: {dist: fixed, value: 792}
"""  # each hop adds 800 words: 100 ms of prefill at 8000 tokens/s (whole prompts, no chunking)
    with running_sim(["--max-batch", "64"]) as sim:
        records = run_engine(plan_work(loads(text, "slope.yaml"), seed=1), sim.url)
    hops = sorted(records, key=lambda r: r.turn or 0)
    assert all(r.outcome is Outcome.OK for r in hops)
    ttft_ms = [((r.first_token_ns or 0) - r.intended_ns) / 1e6 for r in hops]
    slopes = [b - a for a, b in itertools.pairwise(ttft_ms)]
    median = sorted(slopes)[len(slopes) // 2]
    assert 80 <= median <= 130, (ttft_ms, slopes)


AGENT_TRACE = """\
{"trajectory": "t1", "hop": 0, "start_s": 0.0, "input_tokens": 500, "output_tokens": 20, "tool_s": 0.1}
{"trajectory": "t1", "hop": 1, "input_tokens": 620, "output_tokens": 30, "tool_s": 0.2}
{"trajectory": "t1", "hop": 2, "input_tokens": 900, "output_tokens": 10}
{"trajectory": "t1", "hop": 2, "input_tokens": 900, "output_tokens": 10}
{"trajectory": "t1", "hop": 3, "input_tokens": 1100, "output_tokens": 40}
{"trajectory": 7, "hop": 0, "start_s": 0.5, "input_tokens": 300, "output_tokens": 15, "parent": "t1", "tool_s": 0.05}
{"trajectory": 7, "hop": 1, "input_tokens": 400, "output_tokens": 15}
"""


def trace_spec(tmp_path, trace: str = AGENT_TRACE, arrival_extra: str = ""):
    (tmp_path / "agents.jsonl").write_text(trace)
    text = f"""name: replay
target: {{api: openai-chat, model: m}}
classes:
  agent:
    kind: agent
    arrival: {{process: trace, format: agent, path: agents.jsonl{arrival_extra}}}
    slo: {{ttft_ms: 5000, percentile: 50}}
"""
    path = tmp_path / "replay.yaml"
    path.write_text(text)
    return load(path)


def test_an_agent_trace_replays_each_trajectory_with_its_recorded_context(
    tmp_path, sim_url: str
) -> None:
    """Each hop sends the recorded input (a fan-out branch + its 8-word sub-task line), answers the recorded length."""
    spec = trace_spec(tmp_path)
    work = plan_work(spec)
    assert [len(f.plans) for f in work.flows] == [5, 2]
    assert work.flows[1].start_ns == 500_000_000
    records = run_engine(work, sim_url)
    assert all(r.outcome is Outcome.OK for r in records)
    sent = [(r.turn, r.prompt_tokens_target, r.prompt_tokens, r.output_tokens) for r in records]
    assert sent == [
        (0, 500, 500, 20), (1, 620, 620, 30), (2, 908, 908, 10), (2, 908, 908, 10),
        (3, 1100, 1100, 40), (0, 300, 300, 15), (1, 400, 400, 15),
    ]  # fmt: skip
    first = [r for r in records if r.session_id == 0]
    # the recorded tool times, from the end of the hop before (a fan-out's last branch)
    assert first[1].intended_ns - (first[0].end_ns or 0) == 100_000_000
    assert first[2].intended_ns - (first[1].end_ns or 0) == 200_000_000
    assert first[4].intended_ns == max(r.end_ns or 0 for r in first[2:4])


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ('{"trajectory": "a", "hop": 1, "start_s": 0, "input_tokens": 5, "output_tokens": 1}\n',
         "trajectory 'a': has no hop 0"),
        ('{"trajectory": "a", "hop": 0, "input_tokens": 5, "output_tokens": 1}\n',
         "line 1, start_s: must be a number of seconds"),
        ('{"trajectory": "a", "hop": 0, "start_s": 0, "input_tokens": 0, "output_tokens": 1}\n',
         "line 1, input_tokens: must be an integer >= 1"),
        ('{"trajectory": "a", "hop": 0, "start_s": 0, "input_tokens": 5, "output_tokens": 1, '
         '"parent": "zz"}\n', "line 1, parent: names trajectory 'zz'"),
        ("[1, 2]\n", "line 1: must be a JSON object"),
    ],
)  # fmt: skip
def test_a_bad_agent_trace_names_the_line_and_the_field(tmp_path, trace: str, message: str) -> None:
    """A malformed agent trace is a ConfigError naming the file, the line (or trajectory) and the field."""
    with pytest.raises(ConfigError, match=message):
        plan_work(trace_spec(tmp_path, trace))
