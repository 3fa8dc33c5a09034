"""workerpool client: enqueue jobs for workerpool workers, and write exec handlers.

Producer::

    from workerpool_client import Client

    with Client("redis://localhost:6379") as client:
        job_id = client.enqueue("emails", "send_email", {"to": "a@example.com"}, keep=3600)
        status = client.wait("emails", job_id, timeout=30)  # done, dead or cancelled

Handler (run by ``workerpool-worker --handler exec -- python3 -m myapp.worker``)::

    from workerpool_client import App

    app = App()

    @app.task("send_email")
    def send_email(data, job):
        ...

    app.run()
"""

from ._job import Job
from ._outcomes import JobStatus
from ._version import __version__
from .aio import AsyncClient
from .app import App, JobContext
from .client import Client
from .errors import (
    ConfigError,
    ConnectionError,
    InvalidJob,
    InvalidProgress,
    InvalidQueue,
    Permanent,
    RedisError,
    WaitTimeout,
    WorkerpoolError,
)

__all__ = [
    "App",
    "AsyncClient",
    "Client",
    "ConfigError",
    "ConnectionError",
    "InvalidJob",
    "InvalidProgress",
    "InvalidQueue",
    "Job",
    "JobContext",
    "JobStatus",
    "Permanent",
    "RedisError",
    "WaitTimeout",
    "WorkerpoolError",
    "__version__",
]
