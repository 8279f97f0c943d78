"""The project's own exceptions: a bad input is an exception, a failed request is data.

A `LoadgenError` carries a message that says what is wrong, where, and how to fix it;
the CLI prints it and exits with code 1, never with a traceback.
"""

from __future__ import annotations


class LoadgenError(Exception):
    """Base of every error the CLI turns into exit code 1 with a clear message."""


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


class TargetError(LoadgenError):
    """The target endpoint is unreachable or does not speak the expected streaming API."""
