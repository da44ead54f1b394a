"""Exceptions the `bertkit` command turns into one-line messages, and the one a server answers
with a status (no torch import here, so the command can catch them without loading torch)."""

from __future__ import annotations

import os
import signal


class TrainingDiverged(ArithmeticError):
    """The loss, a gradient or a weight became NaN or infinite; the last good checkpoint stays."""


class TrainingInterrupted(Exception):
    """SIGTERM or Ctrl-C stopped the run after it saved a resumable checkpoint. `exit_code` is
    the shell's convention for the signal (128 + its number)."""

    def __init__(self, message: str, signal_name: str) -> None:
        super().__init__(message)
        number = getattr(signal, signal_name, None)
        self.exit_code = 128 + int(number) if number is not None else 1


class InputError(ValueError):
    """A request the server refuses: `status` 413 (too large) or 422 (not what it takes)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class JobFailed(RuntimeError):
    """A corpus job's worker (a local process, a Ray actor) failed past its retries; the shards
    written are kept, and `--resume` continues."""


class DataError(ValueError):
    """Malformed input, reported as `file:line: what is wrong (what was expected)`."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line
