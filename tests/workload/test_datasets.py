"""Prompt datasets from local files: formats, filters, sampling, errors, and what the server sees."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.errors import ConfigError
from loadgen.results.records import Outcome
from loadgen.testing import ScriptedServer, run_engine, simple_chat
from loadgen.workload.datasets import load_dataset, sample_rows
from loadgen.workload.plans import plan_work
from loadgen.workload.spec import DatasetSpec, load

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "workloads" / "datasets" / "serving-chat.sharegpt.json"

SHAREGPT = [
    {"conversations": [
        {"from": "system", "value": "You answer briefly."},
        {"from": "human", "value": "alpha one two"},
        {"from": "gpt", "value": "answer a b c d"},
        {"from": "human", "value": "alpha follow up"},
        {"from": "gpt", "value": "second answer e f"},
    ]},
    {"conversations": [
        {"from": "human", "value": "beta three four five"},
        {"from": "gpt", "value": "bb"},
    ]},
    {"conversations": [{"from": "gpt", "value": "the model speaks first and alone"}]},
    {"conversations": [
        {"from": "human", "value": "gamma six"},
        {"from": "gpt", "value": "g1 g2 g3 g4 g5 g6 g7"},
        {"from": "human", "value": "gamma again"},
        {"from": "gpt", "value": "g8"},
        {"from": "human", "value": "gamma last"},
    ]},
]  # fmt: skip


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def workload(tmp_path: Path, dataset: str, *, requests: int = 6, extra: str = "",
             output: str = "from_dataset") -> Path:  # fmt: skip
    text = f"""name: ds
target: {{api: openai-chat, model: m}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: 50}}
    requests: {requests}
    dataset: {dataset}
    output_tokens: {output}
{extra}"""
    return write(tmp_path, "ds.yaml", text)


def dataset_spec(path: Path, fmt: str, **options: object) -> DatasetSpec:
    return DatasetSpec(path=str(path), format=fmt, **options)  # type: ignore[arg-type]


def test_sharegpt_rows_are_read_with_their_turns_and_recorded_lengths(tmp_path: Path) -> None:
    """ShareGPT rows keep system prompt and human turns; lengths are the words of turn 1 and its answer."""
    path = write(tmp_path, "s.json", SHAREGPT)
    data = load_dataset(dataset_spec(path, "sharegpt"), None, True)
    assert data.rows == 4
    assert len(data.kept) == 3
    assert data.dropped == {"without a human turn": 1}
    first, second, third = data.kept
    assert first.system == "You answer briefly."
    assert first.turns == (
        ("alpha one two", "answer a b c d"),
        ("alpha follow up", "second answer e f"),
    )
    assert (first.prompt_tokens, first.output_tokens) == (3 + 3, 5)  # system 3 + turn 3 words
    assert (second.prompt_tokens, second.output_tokens) == (4, 1)
    assert third.turns[-1] == ("gamma last", None)
    assert third.row == 4


def test_single_turn_requests_send_the_first_human_turn_as_the_server_sees_it(
    tmp_path: Path,
) -> None:
    """Every body the server received is a row's system prompt and first human turn, capped at the recorded answer."""
    path = write(tmp_path, "s.json", SHAREGPT)
    spec = load(workload(tmp_path, "{path: s.json, format: sharegpt, sample: sequential}"))
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        records = run_engine(plan_work(spec), server.url)
    assert [r.outcome for r in records] == [Outcome.OK] * 6
    order = {r.request_id_sent: r.request_id for r in records}  # the id header each carried
    seen = [(tuple((m["role"], m["content"]) for m in r.body["messages"]), r.body["max_tokens"])
            for r in sorted(server.requests, key=lambda r: order[r.headers["x-request-id"]])]  # fmt: skip
    expected = [
        ((("system", "You answer briefly."), ("user", "alpha one two")), 5),
        ((("user", "beta three four five"),), 1),
        ((("user", "gamma six"),), 7),
    ]
    assert seen == expected * 2  # sequential: the kept rows in file order, cycled
    assert [r.prompt_tokens_target for r in records] == [6, 4, 2] * 2
    assert path.exists()


def test_turns_all_replays_each_conversation_with_the_models_real_answers(tmp_path: Path) -> None:
    """`turns: all`: turn k carries every earlier human turn and the server's own answers."""
    write(tmp_path, "s.json", SHAREGPT)
    spec = load(workload(tmp_path, "{path: s.json, format: sharegpt, sample: sequential, turns: all}",
                         requests=3))  # fmt: skip
    work = plan_work(spec)
    assert [len(f.plans) for f in work.flows] == [2, 1, 3]
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        records = run_engine(work, server.url)
    assert len(records) == 6
    assert all(r.outcome is Outcome.OK for r in records)
    bodies = [r.body["messages"] for r in server.requests]
    last = max(bodies, key=len)  # the third turn of the gamma conversation
    assert [(m["role"], m["content"]) for m in last] == [
        ("user", "gamma six"), ("assistant", " w0 w1 w2"),
        ("user", "gamma again"), ("assistant", " w0 w1 w2"), ("user", "gamma last"),
    ]  # fmt: skip
    gamma = [r for r in records if r.session_id == work.flows[2].session_id]
    assert [r.max_tokens for r in sorted(gamma, key=lambda r: r.turn or 0)][:2] == [7, 1]


def test_recorded_history_sends_the_datasets_answers_between_turns(tmp_path: Path) -> None:
    """`history: recorded`: the assistant turns sent are the dataset's, not the server's."""
    write(tmp_path, "s.json", SHAREGPT[:1])
    spec = load(workload(tmp_path, "{path: s.json, format: sharegpt, turns: all, history: recorded}",
                         requests=1))  # fmt: skip
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        run_engine(plan_work(spec), server.url)
    second = max((r.body["messages"] for r in server.requests), key=len)
    assert [(m["role"], m["content"]) for m in second] == [
        ("system", "You answer briefly."), ("user", "alpha one two"),
        ("assistant", "answer a b c d"), ("user", "alpha follow up"),
    ]  # fmt: skip


ROWS = [
    {"prompt": "one two three", "completion": "a b", "output_tokens": 9},
    {"prompt": "four five", "completion": "c d e"},
]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_table_formats_read_a_prompt_column_with_answers_and_lengths(
    tmp_path: Path, fmt: str
) -> None:
    """The same two rows as JSONL, JSON, CSV or Parquet read alike; a recorded length beats the answer's words."""
    path = tmp_path / f"rows.{fmt}"
    frame = pl.DataFrame(ROWS)
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "csv":
        frame.write_csv(path)
    else:
        frame.write_parquet(path)
    data = load_dataset(dataset_spec(path, fmt), None, True)
    assert [(c.turns, c.prompt_tokens, c.output_tokens) for c in data.kept] == [
        ((("one two three", "a b"),), 3, 9),
        ((("four five", "c d e"),), 2, 3),
    ]


def test_a_messages_column_and_openai_batch_lines_are_conversations(tmp_path: Path) -> None:
    """OpenAI `messages` rows (content as text or parts) and Batch API lines with their output cap."""
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
                {"role": "assistant", "content": "hi"}, {"role": "user", "content": "bye"}]  # fmt: skip
    path = write(tmp_path, "m.jsonl", json.dumps({"messages": messages}) + "\n")
    (row,) = load_dataset(dataset_spec(path, "jsonl"), None, False).kept
    assert row.system == "sys"
    assert row.turns == (("hello there", "hi"), ("bye", None))
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "x", "messages": messages[1:2], "max_completion_tokens": 77}}  # fmt: skip
    path = write(tmp_path, "b.jsonl", json.dumps(line) + "\n")
    (row,) = load_dataset(dataset_spec(path, "openai-batch"), None, True).kept
    assert row.turns == (("hello there", None),)
    assert row.output_tokens == 77


def test_limit_and_length_filters_drop_rows_and_count_why(tmp_path: Path) -> None:
    """`limit` reads the first rows; rows outside the length filters are dropped and counted."""
    path = write(tmp_path, "s.json", SHAREGPT)
    spec = dataset_spec(path, "sharegpt", limit=3, min_prompt_tokens=3, max_output_tokens=4)
    data = load_dataset(spec, None, True)
    assert data.rows == 3
    assert [c.row for c in data.kept] == [2]  # row 1: 5 output words; row 3: no human turn
    assert data.dropped == {"outside dataset.output_tokens": 1, "without a human turn": 1}


def test_sampling_is_seeded_and_without_replacement_covers_every_row_per_pass(
    tmp_path: Path,
) -> None:
    """random without replacement: each pass is a permutation; with replacement: repeats; both seeded."""
    rows = [{"prompt": f"p{i}"} for i in range(10)]
    path = write(tmp_path, "r.jsonl", "\n".join(json.dumps(r) for r in rows))
    data = load_dataset(dataset_spec(path, "jsonl"), None, False)
    spec = dataset_spec(path, "jsonl")
    picks = [c.row for c in sample_rows(data, spec, 30, np.random.default_rng(1))]
    assert all(sorted(picks[i : i + 10]) == list(range(1, 11)) for i in (0, 10, 20))
    again = [c.row for c in sample_rows(data, spec, 30, np.random.default_rng(1))]
    assert picks == again
    with_replacement = dataset_spec(path, "jsonl", replacement=True)
    drawn = [c.row for c in sample_rows(data, with_replacement, 30, np.random.default_rng(1))]
    assert max(Counter(drawn).values()) > 1 or sorted(drawn[:10]) != list(range(1, 11))


@pytest.mark.parametrize(
    ("fmt", "content", "where"),
    [
        ("sharegpt", [{"conversations": [{"from": "human", "value": "ok"}]}, {"conv": []}],
         "row 2: needs a 'conversations' list"),
        ("sharegpt", [{"conversations": [{"from": "human", "value": 5}]}],
         "row 1, conversations[0].value: must be a string"),
        ("sharegpt", [{"conversations": [{"from": "robot", "value": "x"}]}],
         "row 1, conversations[0]: unknown role 'robot'"),
        ("jsonl", '{"prompt": "a"}\n{"text_input": 3}\n', "row 2, text_input: must be a string"),
        ("jsonl", '{"prompt": "a"}\nnot json\n', "line 2: not valid JSON"),
        ("jsonl", '{"question": "a"}\n', "row 1: has no prompt"),
        ("jsonl", '{"prompt": "a", "output_tokens": -3}\n', "row 1, output_tokens: must be a whole"),
        ("openai-batch", '{"custom_id": "x", "body": {"input": "a"}}\n',
         "line 1, body: has neither 'messages' nor 'prompt'"),
    ],
)  # fmt: skip
def test_a_malformed_row_names_the_file_the_row_and_the_field(
    tmp_path: Path, fmt: str, content: object, where: str
) -> None:
    """A malformed row is a ConfigError naming the file, the row and the field."""
    path = write(tmp_path, "bad.data", content)
    with pytest.raises(ConfigError) as caught:
        load_dataset(dataset_spec(path, fmt), None, False)
    assert str(path) in str(caught.value)
    assert where in str(caught.value)


def test_spec_errors_name_the_key_and_the_fix(tmp_path: Path) -> None:
    """A missing file, a bad option, prompt_tokens beside a dataset, turns: all with turns."""
    write(tmp_path, "s.json", SHAREGPT)
    cases = [
        ("{path: nope.json, format: sharegpt}", "", "dataset.path: file .*nope.json not found"),
        ("{path: s.json, format: sharegpt, sample: shuffled}", "", "unknown value 'shuffled'"),
        ("{path: s.json, format: sharegpt}", "    prompt_tokens: {dist: fixed, value: 5}\n",
         "prompt_tokens would be ignored"),
        ("{path: s.json, format: sharegpt, turns: all}", "    turns: {dist: fixed, value: 2}\n",
         "dataset.turns: 'turns: all' replays each conversation"),
    ]  # fmt: skip
    for body, extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            load(workload(tmp_path, body, extra=extra))
    with pytest.raises(ConfigError, match="'from_dataset' needs a 'dataset'"):
        load(write(tmp_path, "x.yaml", "name: x\nclasses:\n  c:\n    arrival: {process: poisson, "
                   "rate_per_s: 1}\n    requests: 1\n    prompt_tokens: {dist: fixed, value: 1}\n"
                   "    output_tokens: from_dataset\n"))  # fmt: skip


def test_check_reports_rows_read_kept_and_the_length_distributions() -> None:
    """`loadgen check` on the shipped dataset workload prints the dataset's rows and lengths."""
    result = CliRunner().invoke(cli, ["check", str(ROOT / "workloads" / "dataset-chat.yaml")])
    assert result.exit_code == 0, result.output
    assert (
        "serving-chat.sharegpt.json (sharegpt, turns: first): 16 rows read, 16 kept"
        in result.output
    )
    assert "first-turn prompt words: min 8," in result.output
    assert "recorded output words:" in result.output


def test_the_shipped_dataset_is_sharegpt_with_multi_turn_conversations() -> None:
    """The shipped dataset reads as ShareGPT: 16 conversations, 22 human turns, each answered."""
    data = load_dataset(dataset_spec(SHIPPED, "sharegpt"), None, True)
    assert (data.rows, len(data.kept)) == (16, 16)
    assert sum(len(c.turns) for c in data.kept) == 22
    assert all(answer for c in data.kept for _, answer in c.turns)


def test_a_local_tokenizer_counts_the_dataset_and_filters_by_tokens(tmp_path: Path) -> None:
    """With target.tokenizer, lengths and filters are the tokenizer's counts, not words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # optional

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(["alpha beta gamma " * 20],
                                  trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]))  # fmt: skip
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    rows = write(tmp_path, "r.jsonl", '{"prompt": "zyxwv qrstu", "completion": "alpha"}\n'
                 '{"prompt": "alpha", "completion": "zyxwvutsr"}\n')  # fmt: skip

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    data = load_dataset(dataset_spec(rows, "jsonl"), str(path), True)
    assert [(c.prompt_tokens, c.output_tokens) for c in data.kept] == [
        (count("zyxwv qrstu"), count("alpha")), (count("alpha"), count("zyxwvutsr")),
    ]  # fmt: skip
    assert count("zyxwv qrstu") > 2  # unknown letters: more tokens than words
    short = load_dataset(dataset_spec(rows, "jsonl", max_prompt_tokens=2), str(path), True)
    assert [c.row for c in short.kept] == [2]


def test_a_summarization_batch_sends_the_datasets_documents(tmp_path: Path) -> None:
    """A closed-loop batch with a dataset sends its rows as documents, each capped at its recorded length."""
    rows = [{"prompt": f"document {i} " + "text " * i, "output_tokens": 3 + i} for i in range(4)]
    write(tmp_path, "docs.jsonl", "\n".join(json.dumps(r) for r in rows))
    text = """name: docs
target: {api: openai-chat, model: m}
classes:
  docs:
    kind: summarization
    arrival: {process: constant, rate_per_s: 1}
    requests: 4
    concurrency: 2
    dataset: {path: docs.jsonl, format: jsonl, sample: sequential}
    output_tokens: from_dataset
"""
    spec = load(write(tmp_path, "docs.yaml", text))
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        records = run_engine(plan_work(spec), server.url)
    assert all(r.outcome is Outcome.OK for r in records)
    sent = sorted((r.body["messages"][0]["content"], r.body["max_tokens"]) for r in server.requests)
    assert sent == sorted((r["prompt"], r["output_tokens"]) for r in rows)
