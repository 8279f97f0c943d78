"""The audit of one run: its records and objectives → the summary, with its schema stamp.

`audit` is the one audit every command judges a run by (the end of `loadgen run`, a
capacity step, `loadgen report` and `loadgen merge`): each class's SLO audit
(`slo.audit_class`), its objective on top (`objectives.judge_by_objective`), the generator's
health and the verdict, as one typed `Summary`. `audit_run` re-audits a run folder from its
records and run.json (the SLOs come from run.json unless `--slo` replaces them), and
`reaudit` adds the histograms, for `results.write.write_audit` to write into the folder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from loadgen import __version__
from loadgen.analysis import metrics
from loadgen.analysis.confidence import INTERVAL
from loadgen.analysis.connections import connection_use
from loadgen.analysis.cost import Price, class_tokens, run_cost
from loadgen.analysis.delivery import delivery, unpaced
from loadgen.analysis.health import judge_client
from loadgen.analysis.join import anchor_unix_ns, server_fields, span_account
from loadgen.analysis.minutes import run_histograms
from loadgen.analysis.objectives import Objective, judge_by_objective
from loadgen.analysis.server import with_server
from loadgen.analysis.slo import NO_TARGETS, audit_class, per_request, verdict, withheld
from loadgen.analysis.split import ttft_split, with_split
from loadgen.errors import ConfigError, LoadgenError, OptionError
from loadgen.measures import SLO_MEASURES
from loadgen.results.recover import recovered_records
from loadgen.results.runfolder import (
    PARTS_DIR,
    RECORDS_FILE,
    SCHEMA_VERSION,
    SLO_FIELDS,
    RunInfo,
    has_records,
    read_records,
    read_run_info,
    read_server_metrics,
)
from loadgen.results.spans import read_spans
from loadgen.results.summary import (
    CacheWarmth,
    ClassAudit,
    Cost,
    ModelAudit,
    StreamEnds,
    Summary,
    TokensPerChunk,
)
from loadgen.workload.spec import SloTargets


def parse_slo_override(text: str) -> dict[str, float | None]:
    """`ttft_ms=800,tpot_ms=40,percentile=95` as fields of SloTargets (`none` clears one).

    The result is applied to every class with `apply_slo_override`: given fields replace
    the class's own, the others are kept.
    """
    fields: dict[str, float | None] = {}
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in SLO_FIELDS:
            raise _slo_error(f"{item!r} is not one of {'/'.join(SLO_FIELDS)}=<number>")
        if key in fields:
            raise _slo_error(f"{key} is given twice")
        fields[key] = _slo_value(key, value)
    try:
        SloTargets(**{k: v for k, v in fields.items() if v is not None})
    except ValueError as exc:
        raise _slo_error(str(exc)) from None
    return fields


def _slo_value(key: str, value: str) -> float | None:
    if value.lower() == "none" and key not in ("percentile", "confidence"):
        return None
    try:
        number = float(value)
    except ValueError:
        raise _slo_error(f"{key}={value!r} is not a number") from None
    if not (math.isfinite(number) and number > 0):
        raise _slo_error(f"{key} must be a finite number > 0 (got {value})")
    return number


def _slo_error(problem: str) -> ConfigError:
    return OptionError("--slo", problem, "e.g. --slo ttft_ms=800,tpot_ms=40,percentile=95")


def apply_slo_override(
    slos: Mapping[str, SloTargets], fields: Mapping[str, float | None]
) -> dict[str, SloTargets]:
    """Every class's targets with `fields` (from `parse_slo_override`) replacing its own."""
    merged = {}
    for name, targets in slos.items():
        current: dict[str, Any] = {k: getattr(targets, k) for k in SLO_FIELDS}
        current.update(fields)
        merged[name] = SloTargets(**{k: v for k, v in current.items() if v is not None})
    return merged


def audit(
    frame: pl.DataFrame,
    *,
    run_id: str,
    objectives: Mapping[str, Objective],
    planned: int,
    lag_bound_ms: float | None = None,
    stopped: str | None = None,
    price: Price | None = None,
    rule: str = INTERVAL,
    path_buffers: bool = False,
    joined: pl.DataFrame | None = None,
) -> Summary:
    """The run's summary: generator health, one audit per class, and the verdict.

    Every class of `objectives` appears (even with no records), then any other class found
    in the frame, audited without targets. `stopped` (a key of `runfolder.STOPS`) withholds
    the verdict: the figures are kept, as partial figures, and nothing is judged (see
    `slo.verdict`). With `price`, the summary has a `cost` block (`analysis.cost`). `rule`
    is how every check is judged (`interval`, `point`: see `analysis.slo`). `path_buffers`:
    the path is known to buffer (`target.path_buffers`), so streams that arrived coalesced
    are judged as observed, not as unknown (`analysis.delivery`). The generator falls
    behind only when its own time could have changed the verdict (`analysis.health`), or
    its lag p99 passed `lag_bound_ms` when one is given. `joined`: per record, the server's
    fields from its joined span, which each class's TTFT split prefers to the stream's
    (`analysis.split.with_split`).
    """
    duration_s = metrics.run_duration_s(frame)
    rates = [o.requested_rate_per_s for o in objectives.values()]
    requested = sum(r for r in rates if r is not None) if rates and None not in rates else None
    asked = {name: o.asked for name, o in objectives.items() if o.asked is not None}
    generator = metrics.generator_health(frame, planned=planned, lag_bound_ms=lag_bound_ms,
                                         requested_rate_per_s=requested, asked=asked)  # fmt: skip
    rows = per_request(frame, slos={name: o.slo for name, o in objectives.items()})
    if joined is not None:
        rows = with_split(rows, joined)
    classes = class_audits(frame, objectives, duration_s=duration_s, rule=rule, rows=rows,
                           path_buffers=path_buffers)  # fmt: skip
    if stopped is not None:
        classes = {name: withheld(block) for name, block in classes.items()}
    else:
        generator = judge_client(generator, rows, frame, classes, rule=rule,
                                 path_buffers=path_buffers)  # fmt: skip
    return Summary(
        schema_version=SCHEMA_VERSION,
        loadgen_version=__version__,
        run_id=run_id,
        interrupted=stopped is not None,
        duration_s=round(duration_s, 6),
        generator=generator,
        classes=classes,
        verdict=verdict(classes, fell_behind=generator.fell_behind, stopped=stopped, rule=rule),
        cost=None if price is None else _cost(frame, objectives, list(classes), price, duration_s),
        connections=connection_use(frame),
    )


def _cost(
    frame: pl.DataFrame, objectives: Mapping[str, Objective], classes: list[str], price: Price,
    duration_s: float,
) -> Cost:  # fmt: skip
    slos = {name: o.slo for name, o in objectives.items()}
    return run_cost(price, duration_s=duration_s, tokens=class_tokens(frame, slos, classes))


def recorded_price(info: RunInfo) -> Price | None:
    """The price run.json's options keep (`run --price-per-hour`, `--replicas`), if any."""
    options = info.options
    if options is None or options.price_per_hour is None:
        return None
    return Price(per_hour=options.price_per_hour, replicas=options.replicas or 1)


def class_audits(
    frame: pl.DataFrame,
    objectives: Mapping[str, Objective],
    *,
    duration_s: float,
    rule: str = INTERVAL,
    path_buffers: bool = False,
    rows: pl.DataFrame | None = None,
) -> dict[str, ClassAudit]:
    """Each class's block, judged by its objective and `rule`: `objectives`' classes first,
    in order; with its delivery, coalesced streams judged as unknown unless `path_buffers`.
    `rows`: `per_request`'s rows of `frame`, when the caller has them."""
    if rows is None:
        rows = per_request(frame, slos={name: o.slo for name, o in objectives.items()})
    by_class = {str(k[0]): part for k, part in rows.partition_by("class", as_dict=True).items()}
    chunking = metrics.tokens_per_chunk(frame)
    ends = metrics.stream_ends(frame)
    classes = {}
    for name in [*objectives, *sorted(set(by_class) - set(objectives))]:
        objective = objectives.get(name)
        mine = by_class.get(name, rows.clear())
        coalesced = bool(mine["coalesced"].any())
        part = frame.filter(pl.col("class") == name) if objective or coalesced else None
        block = audit_class(
            mine,
            metrics.itl_gaps_ms(frame, name),
            tokens_per_chunk=chunking.get(name, TokensPerChunk()),
            stream_ends=ends.get(name, StreamEnds()),
            targets=objective.slo if objective else NO_TARGETS,
            duration_s=duration_s,
            rule=rule,
            delivery=delivery(mine, path_buffers=path_buffers),
            unpaced=unpaced(mine, part, observed=path_buffers)
            if coalesced and part is not None
            else None,
        )
        if objective is not None:
            assert part is not None
            block = judge_by_objective(block, part, objective, rule=rule)
        models = model_audits(frame, mine, name, chunking,
                              objective.slo if objective else NO_TARGETS, duration_s,
                              rule=rule)  # fmt: skip
        classes[name] = replace(block, models=models) if models else block
    return classes


def model_audits(
    frame: pl.DataFrame, rows: pl.DataFrame, name: str, chunking: Mapping[str, TokensPerChunk],
    targets: SloTargets, duration_s: float, *, rule: str = INTERVAL,
) -> dict[str, ModelAudit]:  # fmt: skip
    """Per model of a class whose records name more than one (a model or LoRA mix): each
    model's requests audited on their own against the class's thresholds."""
    if "model" not in frame.columns:
        return {}
    mine = frame.filter(pl.col("class") == name)
    names = sorted(str(m) for m in mine.get_column("model").drop_nulls().unique())
    if len(names) < 2:
        return {}
    result = {}
    for model in names:
        part = mine.filter(pl.col("model") == model)
        ids = part.get_column("request_id")
        block = audit_class(
            rows.filter(pl.col("request_id").is_in(ids.implode())),
            metrics.itl_gaps_ms(part, name),
            tokens_per_chunk=chunking.get(name, TokensPerChunk()),
            targets=targets,
            duration_s=duration_s,
            rule=rule,
        )
        stats = {m.column: block.stats(m) for m in SLO_MEASURES}
        result[model] = ModelAudit(
            **stats, requests=block.requests, failed=block.failed,
            output_tokens=block.output_tokens, attainment=block.slo.attainment,
            met=block.slo.met, goodput=block.goodput, verdict=block.slo.verdict,
        )  # fmt: skip
    return result


def audit_run(
    run_dir: Path, *, slos: Mapping[str, SloTargets] | None = None, rule: str | None = None
) -> tuple[Summary, pl.DataFrame, dict[str, SloTargets]]:
    """Re-audit one run: (summary, records frame, the SLOs used), without figures.

    The SLOs are run.json's, with `slos` replacing whole classes' targets; the verdict
    rule is run.json's (`RunInfo.verdict_rule`) unless `rule` replaces it. planned, how
    the run stopped (`RunInfo.stop`) and the lag bound come from run.json, so without
    `slos` and `rule` the summary equals the one the run wrote. Raises LoadgenError when
    the folder has no run.json or records.
    """
    info = read_run_info(run_dir)
    if not has_records(run_dir):
        raise LoadgenError(f"{run_dir} has no {RECORDS_FILE} (nor {PARTS_DIR})")
    frame = records_as_recovered(run_dir, info)
    effective = {**info.slos(), **(slos or {})}
    spans = read_spans(run_dir)  # the server's spans, joined again
    summary = audit(
        frame,
        run_id=info.run_id,
        objectives=recorded_objectives(info, effective),
        planned=frame.height if info.planned is None else info.planned,
        stopped=info.stop,
        lag_bound_ms=info.lag_bound_ms,
        price=recorded_price(info),
        rule=rule or info.verdict_rule,
        path_buffers=info.path_buffers,
        joined=None if spans is None else joined_fields(frame, spans, info),
    )
    summary = with_server(summary, read_server_metrics(run_dir), info.server_metrics, frame)
    if spans is not None:
        summary = replace(summary, server_spans=span_account(frame, spans, info.t0))
    return with_cache(summary, info.cache), frame, effective


def joined_fields(frame: pl.DataFrame, spans: pl.DataFrame, info: RunInfo) -> pl.DataFrame:
    """Per record, the server's fields from its joined span (`analysis.join`), placed
    through the run's t0 anchor: what each class's TTFT split prefers to the stream's."""
    anchor = anchor_unix_ns(info.t0) if info.t0 is not None else None
    return server_fields(frame, spans, anchor_ns=anchor)


def run_joined_fields(run_dir: Path, frame: pl.DataFrame) -> pl.DataFrame | None:
    """`joined_fields` of a run folder's spans (None: it kept none)."""
    spans = read_spans(run_dir)
    return None if spans is None else joined_fields(frame, spans, read_run_info(run_dir))


def split_by_spans(summary: Summary, frame: pl.DataFrame, joined: pl.DataFrame) -> Summary:
    """`summary` with each class's TTFT split taken again, preferring the joined spans'
    fields (`analysis.split.with_split`), each class at its own TTFT target: for a run
    whose spans arrived after its audit (`--otlp-receiver` waits for them)."""
    rows = with_split(per_request(frame), joined)
    classes = {}
    for name, block in summary.classes.items():
        targets = block.slo.targets
        split = ttft_split(rows.filter(pl.col("class") == name), threshold_ms=targets.ttft_ms,
                           percentile=targets.percentile if targets.ttft_ms else None)  # fmt: skip
        classes[name] = replace(block, ttft_split=split)
    return replace(summary, classes=classes)


def records_as_recovered(run_dir: Path, info: RunInfo) -> pl.DataFrame:
    """The run's records; for a run that never wrote its end (interrupted twice, killed),
    its parts with every other plan recorded as `report --recover` will record it
    (`results.recover`: cancelled or not_sent), so `report` and `report --recover` of one
    folder say the same."""
    if info.finished or info.recovered:
        return read_records(run_dir)
    recovered = recovered_records(run_dir, info)
    return read_records(run_dir) if recovered is None else recovered[0]


def with_cache(summary: Summary, cache: CacheWarmth | None) -> Summary:
    """The summary with the run's cache block (run.json's: mode, nonce, reset) and the hit
    shares it came out at: the server's counters (when scraped), and cached / prompt tokens
    of every response that reported them, over all classes."""
    if cache is None:
        return summary
    server = summary.server.prefix_cache_hit_share if summary.server is not None else None
    shares = [c.prefix_cache for c in summary.classes.values() if c.prefix_cache is not None]
    prompt = sum(s.prompt_tokens for s in shares)
    usage = round(sum(s.cached_tokens for s in shares) / prompt, 6) if prompt else None
    cache = replace(cache, server_hit_share=server, usage_hit_share=usage)
    return replace(summary, cache=cache)


def reaudit(run_dir: Path) -> tuple[Summary, pl.DataFrame]:
    """`audit_run`, and the per-minute histograms of the same records and SLOs: what
    `results.write.write_audit` writes into a merged or recovered run folder (the end of
    `loadgen run` writes the same from memory)."""
    summary, frame, slos = audit_run(run_dir)
    return summary, run_histograms(run_dir, frame, slos)


def recorded_objectives(info: RunInfo, slos: Mapping[str, SloTargets]) -> dict[str, Objective]:
    """Each class of `slos` judged as run.json records it (its kind and limits), with the
    targets of `slos`; a class run.json does not know is judged by its targets alone."""
    recorded = info.classes()
    return {
        name: Objective.recorded(recorded[name], targets)
        if name in recorded
        else Objective(name=name, slo=targets)
        for name, targets in slos.items()
    }
