"""The project's own exceptions and exit codes: a bad input is an exception, a failed
request is data.

A `LoadgenError` carries a message that says what is wrong, where, and how to fix it;
the CLI prints it and exits with its `exit_code` (1, 3 for a `ClientFailure`, 6 for a
`RunBusy`), never with a traceback.

The exit codes are written here once: each value, what it means and what a CI job does
about it (`EXIT_CODES`), and which codes each command returns in its own words
(`COMMAND_EXITS`). `cli.exits` writes them into every command's help, and the README's and
docs/exit-codes.md's tables are generated from them (`scripts/exit_codes.py`; a test fails
when a page differs). A run's verdict picks one by precedence (`VERDICT_PRECEDENCE`): a
stop (130, 5, 4), then fell behind (3), then missed (2), then inconclusive (7), else 0.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass

# The values; what each means is `EXIT_CODES` below, what each command returns `COMMAND_EXITS`.
EXIT_OK = 0  # met; compare: no regression; capacity: passes; calibrate: calibrated
EXIT_USAGE = 1
EXIT_SLO_MISSED = 2  # missed; compare: regressed; capacity: fails; calibrate: no level met
EXIT_FELL_BEHIND = 3
EXIT_WATCHDOG = 4
EXIT_INCOMPLETE = 5
EXIT_BUSY = 6
EXIT_INCONCLUSIVE = 7
EXIT_INTERRUPTED = 130
# Which of several runs' codes speaks for them all (`run --repeats`): a stop, then the
# client's failure, then a miss, then an inconclusive verdict, then met; a run's own verdict
# follows the same order (`analysis.slo.verdict`).
VERDICT_PRECEDENCE = (
    EXIT_INTERRUPTED, EXIT_INCOMPLETE, EXIT_WATCHDOG, EXIT_FELL_BEHIND, EXIT_SLO_MISSED,
    EXIT_INCONCLUSIVE, EXIT_OK,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ExitCode:
    """One exit code: `summary` is its line in `loadgen --help` (and in a command's help
    where the command says no more); `meaning` and `in_ci` are its row of the exit-code
    tables (Markdown; links relative to docs/)."""

    code: int
    summary: str
    meaning: str
    in_ci: str


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(
        EXIT_OK,
        "every SLO of every class met",
        "every SLO of every class met (by default: each check's upper confidence bound meets "
        "its target)",
        "pass",
    ),
    ExitCode(
        EXIT_USAGE,
        "usage or configuration error",
        "usage or configuration error: bad workload file, bad flag, a plan over the memory "
        "cap, unreachable or non-streaming target, a TLS certificate that fails verification "
        "or a proxy that refuses the tunnel (with or without the preflight)",
        "fix the job, not the server",
    ),
    ExitCode(
        EXIT_SLO_MISSED,
        "an SLO was missed",
        "an SLO was missed",
        "the server regressed (or the SLO is wrong): fail the job",
    ),
    ExitCode(
        EXIT_FELL_BEHIND,
        "the generator fell behind (its own time could have changed the verdict), or the "
        "client failed (out of disk space, file descriptors or permission mid-run): its "
        "numbers are not the server's",
        "the generator fell behind: its own time could have changed the verdict (a MISSED "
        "within the send lag its requests carry, a TPOT or ITL verdict within its stamp "
        "error; see [the generator-health rule](metrics.md#the-generator-health-rule)), its "
        "sends kept less than 97 % of the scheduled rate on a run that did not miss anyway, "
        "its send-lag p99 passed `--lag-bound-ms` when one was given, requests failed in the "
        "client itself (`client_error`: out of file descriptors or local ports), or the "
        "client failed mid-run (no space left, permission denied, read-only file system, "
        "`ulimit -f`, open files): the numbers describe the load generator, not the server. "
        "After a client failure the records written so far are kept; `loadgen report "
        "--recover RUN_DIR` finishes them",
        "free space, fix permissions, raise `ulimit -n`, or rerun on a bigger or quieter machine",
    ),
    ExitCode(
        EXIT_WATCHDOG,
        "the watchdog stopped a run where nothing progressed; records are written",
        "the watchdog stopped the run: nothing progressed (no send, no byte, no completion) "
        "for `--watchdog` seconds (300) while requests were due; records and summary are "
        "written and say what it was waiting for",
        "investigate the endpoint or the runner; the run is not a verdict",
    ),
    ExitCode(
        EXIT_INCOMPLETE,
        "incomplete: the run was killed outright and report --recover finished it, or (run "
        "--ray) a shard's process was killed or its node lost; no verdict",
        "incomplete: the run was killed outright (SIGKILL, OOM, a lost runner) and `loadgen "
        "report --recover` finished it, or (`run --ray`) a shard's process was killed or its "
        "node lost, each named; every plan has a record (`cancelled`, `not_sent` for what it "
        "never finished or sent), the figures are partial",
        "treat as not run; rerun",
    ),
    ExitCode(
        EXIT_BUSY,
        "the run is still running: refused (--wait waits for it)",
        "the run is still running: `loadgen report`, `report --recover` and `compare` refuse "
        "a run folder a live run is writing (its `run.lock` held, or, where the lock cannot "
        "tell, a heartbeat touched in the last 3 s); `--wait` waits for it to end instead",
        "wait for the run (or add `--wait`), then report",
    ),
    ExitCode(
        EXIT_INCONCLUSIVE,
        "inconclusive: no SLO missed, but one could not be judged at the confidence asked (its "
        "target lies within its interval, or too few requests to bound it: the report says "
        "how many), or streams arrived coalesced so that their TPOT/ITL could not be judged; "
        "a miss anywhere is 2, a generator that fell behind 3",
        "inconclusive: no SLO was missed, but at least one could not be judged at its "
        "confidence (its target lies within its interval, or too few requests to bound the "
        "percentile: the run says how many; see [the "
        "verdict](metrics.md#the-verdict-and-its-confidence)), or streams arrived coalesced "
        "(held back between the server and loadgen) so that their TPOT/ITL could not be "
        "judged as the server's pace (see "
        "[buffering](network-path.md#buffering-compression-and-gateways)). A MISSED anywhere "
        "is 2 instead, a generator that fell behind 3",
        "run more requests (`loadgen check` says how many) or judge a lower percentile; "
        "`--verdict point` restores the point-estimate rule; measure the server where nothing "
        "buffers, or declare the path with `--path-buffers` to judge what its users see",
    ),
    ExitCode(
        EXIT_INTERRUPTED,
        "interrupted (Ctrl-C / SIGTERM)",
        "interrupted (Ctrl-C / SIGTERM); records (`not_sent`, `cancelled` for the rest) and "
        "summary are still written; no verdict. A second Ctrl-C exits at once and names the "
        "run folder: `loadgen report --recover RUN_DIR` finishes it, still interrupted (130)",
        "treat as not run",
    ),
)

# What each command returns: a code alone is said by its `summary`, (code, words) in the
# command's own (its help's rows and docs/exit-codes.md's table of the command).
COMMAND_EXITS: Mapping[str, tuple[int | tuple[int, str], ...]] = {
    "check": (
        (EXIT_OK, "the workload is valid and its plan printed; nothing is sent (a plan too "
                  "small to judge its SLOs is warned of, not refused)"),
        (EXIT_USAGE, "usage or configuration error (bad file, bad flag, a plan over the "
                     "memory cap)"),
    ),
    "run": (
        EXIT_OK,
        (EXIT_USAGE, "usage or configuration error (bad file, unreachable target)"),
        EXIT_SLO_MISSED,
        EXIT_FELL_BEHIND,
        EXIT_WATCHDOG,
        (EXIT_INCOMPLETE, "incomplete (--ray): a shard's process was killed or its node lost; "
                          "every plan recorded, no verdict"),
        EXIT_INCONCLUSIVE,
        (EXIT_INTERRUPTED, "interrupted (Ctrl-C / SIGTERM); records and summary are still "
                           "written (no verdict: the figures are partial); a second Ctrl-C "
                           "exits at once and names the folder: report --recover finishes "
                           "it, still 130"),
    ),
    "report": (  # a run folder's verdict as re-audited, or a results store's windows
        (EXIT_OK, "every SLO of every class met (a results store: the windows were written)"),
        (EXIT_USAGE, "usage error (bad flag, no run in PATH, --slo or --window unreadable)"),
        (EXIT_SLO_MISSED, "the run missed an SLO"),
        (EXIT_FELL_BEHIND, "the run's generator fell behind, or its client failed: its "
                           "numbers are not the server's"),
        (EXIT_WATCHDOG, "the run was stopped by the watchdog (no verdict)"),
        (EXIT_INCOMPLETE, "the run is incomplete: killed outright, finished by --recover (no "
                          "verdict)"),
        EXIT_BUSY,
        EXIT_INCONCLUSIVE,
        (EXIT_INTERRUPTED, "the run was interrupted (Ctrl-C / SIGTERM): its figures are "
                           "partial (no verdict)"),
    ),
    "compare": (
        (EXIT_OK, "no check regressed, or no baseline yet (the window holds no valid run of "
                  "the workload: the first night)"),
        (EXIT_USAGE, "usage error (missing run, no class in common, bad flag), runs of "
                     "different workloads (without --force), or a side that stopped early or "
                     "fell behind (without --include-incomplete)"),
        (EXIT_SLO_MISSED, "at least one check REGRESSED (or a server figure passed its "
                          "--server-threshold)"),
        (EXIT_BUSY, "BASELINE or CURRENT is still running: compare it once it ends"),
    ),
    "merge": (
        EXIT_OK,
        (EXIT_USAGE, "the folders are not the N shards of one run (or not run folders)"),
        EXIT_SLO_MISSED,
        (EXIT_FELL_BEHIND, "the generator fell behind, judged on every shard's records: its "
                           "numbers are not the server's"),
        (EXIT_WATCHDOG, "a shard was stopped by the watchdog: the merged run is no verdict"),
        (EXIT_INCOMPLETE, "a shard was killed outright and recovered: the merged run is "
                          "incomplete, no verdict"),
        EXIT_INCONCLUSIVE,
        (EXIT_INTERRUPTED, "a shard was interrupted: the merged run is interrupted, no "
                           "verdict"),
    ),
    "capacity": (
        (EXIT_OK, "the proposed limit passes; without --proposed-limit, the knee was found"),
        (EXIT_USAGE, "usage or configuration error (bad file, bad flag, unreachable target)"),
        (EXIT_SLO_MISSED, "the proposed limit fails; without it, no knee in range (no step "
                          "passed, or every step up to --max passed)"),
        (EXIT_FELL_BEHIND, "the generator fell behind before the answer was known: the "
                           "proposed limit is NOT JUDGED (a load that decided it was a step "
                           "the generator could not run), or, without one, no load above the "
                           "last pass was judged (the first step included: then no knee.png "
                           "is drawn): rerun on a bigger or quieter machine"),
        EXIT_INTERRUPTED,
    ),
    "calibrate": (
        (EXIT_OK, "calibrated: at least the lowest level met every threshold"),
        EXIT_USAGE,
        (EXIT_SLO_MISSED, "no level met the thresholds (this machine cannot measure even the "
                          "lowest)"),
        EXIT_INTERRUPTED,
    ),
    "plan": (
        (EXIT_OK, "the plan was printed"),
        (EXIT_USAGE, "usage error (bad flag, a --from-run folder unreadable)"),
    ),
}  # fmt: skip


def command_exits(command: str) -> list[tuple[int, str]]:
    """The codes `command` returns, each with its words (KeyError: no such command)."""
    summaries = {exit_code.code: exit_code.summary for exit_code in EXIT_CODES}
    return [row if isinstance(row, tuple) else (row, summaries[row])
            for row in COMMAND_EXITS[command]]  # fmt: skip


class LoadgenError(Exception):
    """Base of every error the CLI turns into a clear message and an exit code."""

    exit_code = EXIT_USAGE  # fix the job, not the server


class ConfigError(LoadgenError):
    """A workload or simulator configuration is invalid (file, key path, reason, fix)."""

    def __init__(self, source: str, key: str, problem: str, fix: str = "") -> None:
        self.source = source
        self.key = key
        self.problem = problem
        self.fix = fix
        where = f"{source}: {key}" if key else source
        message = f"{where}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


COMMAND_LINE = "command line"  # the source an option's error names


class OptionError(ConfigError):
    """A command-line option is invalid: `command line: --flag: problem (fix)`, named by
    the flag wherever it is checked (the CLI, or the stage that can tell)."""

    def __init__(self, flag: str, problem: str, fix: str = "") -> None:
        super().__init__(COMMAND_LINE, flag, problem, fix)


class TargetError(LoadgenError):
    """The target endpoint is unreachable or does not speak the expected streaming API."""


class ClientFailure(LoadgenError):
    """The client itself failed mid-run (no space left, permission denied, out of file
    descriptors): the run is not a measurement of the server, exit 3."""

    exit_code = EXIT_FELL_BEHIND


class RunBusy(LoadgenError):
    """A run folder is being written by a live run (`report --recover` refuses it): exit 6."""

    exit_code = EXIT_BUSY


TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EINTR})


def describe_os_error(exc: OSError, path: object) -> str:
    """One line naming what ran out and where: the path, or the limit and how to raise it."""
    code = exc.errno
    if code == errno.ENOSPC:
        return f"no space left on the device holding {path}"
    if code == errno.EDQUOT:
        return f"disk quota exceeded writing {path}"
    if code == errno.EFBIG:
        return f"file size limit exceeded writing {path}{_limit_text('RLIMIT_FSIZE', 'f')}"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied writing {path}"
    if code == errno.EROFS:
        return f"read-only file system: cannot write {path}"
    if code == errno.EMFILE:
        return f"too many open files writing {path}{_limit_text('RLIMIT_NOFILE', 'n')}"
    if code == errno.ENFILE:
        return f"the system's open-file table is full (fs.file-max) writing {path}"
    reason = exc.strerror or (os.strerror(code) if code else type(exc).__name__)
    return f"{reason} writing {path}"


def _limit_text(name: str, flag: str) -> str:
    """` (limit 1,024: ulimit -n)` for the soft limit `name`, where the platform has one."""
    try:
        import resource
    except ImportError:  # not on this platform
        return ""
    soft, _ = resource.getrlimit(getattr(resource, name))
    if soft == resource.RLIM_INFINITY:
        return f" (ulimit -{flag} is unlimited)"
    unit = " bytes" if flag == "f" else ""
    return f" (limit {soft:,}{unit}: raise it with ulimit -{flag})"
