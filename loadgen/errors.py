"""The project's own exceptions and exit codes: a bad input is an exception, a failed
request is data.

A `LoadgenError` carries a message that says what is wrong, where, and how to fix it;
the CLI prints it and exits with its `exit_code` (1, 3 for a `ClientFailure`, 6 for a
`RunBusy`), never with a traceback. The exit codes below are every command's (README
"Exit codes"); each command's help lists those it uses (`cli.exits`). A run's verdict
picks one by precedence: a stop (130, 4, 5), then fell behind (3), then missed (2), then
inconclusive (7), else 0.
"""

from __future__ import annotations

import errno
import os

EXIT_OK = 0  # met; compare: no regression; capacity: passes; calibrate: calibrated
EXIT_USAGE = 1  # usage or configuration: fix the job, not the server
EXIT_SLO_MISSED = 2  # missed; compare: regressed; capacity: fails; calibrate: no level met
EXIT_FELL_BEHIND = 3  # the generator fell behind, or the client failed: not the server's figures
EXIT_WATCHDOG = 4  # nothing progressed for --watchdog seconds: no verdict
EXIT_INCOMPLETE = 5  # killed outright, finished by `report --recover`: no verdict
EXIT_BUSY = 6  # the run folder is being written by a live run
# no class missed, but a target could not be judged at the confidence asked: it lies within
# its interval, or too few requests bound the percentile (a MISSED anywhere is 2 instead;
# a generator that fell behind is 3 whatever the checks said)
EXIT_INCONCLUSIVE = 7
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM: no verdict
# Which of several runs' codes speaks for them all (`run --repeats`): a stop, then the
# client's failure, then a miss, then an inconclusive verdict, then met; a run's own verdict
# follows the same order (`analysis.slo.verdict`).
VERDICT_PRECEDENCE = (
    EXIT_INTERRUPTED, EXIT_INCOMPLETE, EXIT_WATCHDOG, EXIT_FELL_BEHIND, EXIT_SLO_MISSED,
    EXIT_INCONCLUSIVE, EXIT_OK,
)  # fmt: skip


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
