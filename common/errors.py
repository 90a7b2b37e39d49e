"""Exceptions that the CLI turns into clear one-screen messages instead of tracebacks."""

from pathlib import Path


class KvbenchError(Exception):
    """Base for errors a user can act on; the message is shown as is."""


class ScenarioError(KvbenchError):
    """A scenario file is missing, unreadable or invalid (message names file, field and allowed values)."""


class EngineStartError(KvbenchError):
    """An engine process did not become healthy; the message carries the tail of its log."""


class RunDirError(KvbenchError):
    """A run directory is missing files or was written by an incompatible schema version."""


class RunInterrupted(KvbenchError):
    """The run was stopped (Ctrl-C, SIGTERM); its records are kept and it can be resumed."""

    def __init__(self, message: str, run_dir: Path) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        """The stopped run's directory (its result and reports can be rebuilt from what it kept)."""


class CalibrationError(KvbenchError, ValueError):
    """A simulator calibration cannot be fitted, read or used (e.g. it is for another deployment).

    A ValueError too, so a pydantic validator that raises it reports it as a validation error.
    """
