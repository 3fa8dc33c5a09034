"""The library's exceptions. Every error it raises is a WorkerpoolError."""

from __future__ import annotations

import builtins


class WorkerpoolError(Exception):
    """Base class of every error this library raises."""


class ConfigError(WorkerpoolError, ValueError):
    """A bad URL or connection option: the message says what to change."""


class InvalidQueue(WorkerpoolError, ValueError):
    """A queue name the workers would refuse (or that a cluster cannot hold)."""


class InvalidJob(WorkerpoolError, ValueError):
    """A job that cannot be enqueued as given; nothing was enqueued."""


class InvalidProgress(WorkerpoolError, ValueError):
    """`job.progress(value)` got a value JSON cannot hold, or one whose JSON text is
    over contract.json's `max_progress_bytes`; nothing was sent."""


class ConnectionError(WorkerpoolError, builtins.ConnectionError):
    """Redis could not be reached (refused, timed out, TLS handshake failed)."""


class RedisError(WorkerpoolError):
    """Redis refused a command (a key of the wrong type, an ACL, out of memory)."""


class WaitTimeout(WorkerpoolError, TimeoutError):
    """`wait()` ran out of time before the job ended. `status` is the job's
    outcome as last read (a JobStatus), or None when none is kept: the job
    was not enqueued with `keep`, no worker has taken it yet, or its outcome
    expired."""

    def __init__(self, message: str, status: object = None) -> None:
        super().__init__(message)
        self.status = status


class Permanent(Exception):
    """Raise in a task to dead-letter the job at once, without further attempts."""

    def __init__(self, message: str = "permanent failure") -> None:
        super().__init__(message)
        self.message = message
