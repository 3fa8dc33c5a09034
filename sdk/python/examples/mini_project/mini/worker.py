"""The worker's handler: run it as

    workerpool-worker --redis-url redis://localhost:6379 --queue mini --concurrency 3 \
        --handler exec -- python3 -m mini.worker

Each task notes when it starts and ends (to the file named by MINI_RECORD,
when set, and to the log), so a run shows how the three slots share the work.
"""

from __future__ import annotations

import json
import logging
import os
import time

from workerpool_client import App, JobContext, Permanent

log = logging.getLogger("mini")
app = App()


def note(event: str, job: JobContext) -> None:
    entry = {"event": event, "id": job.id, "task": job.task, "seq": (job.data or {}).get("seq"),
             "at": time.time(), "pid": os.getpid()}
    log.info("%s %s %s", event, job.task, job.id)
    path = os.environ.get("MINI_RECORD")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)


@app.task("email")
def email(data: dict, job: JobContext) -> None:
    note("start", job)
    if "@" not in data.get("to", ""):
        raise Permanent(f"not an email address: {data.get('to')!r}")
    time.sleep(data.get("ms", 500) / 1000)  # stands for talking to the mail server
    note("end", job)


@app.task("report")
def report(data: dict, job: JobContext) -> None:
    note("start", job)
    time.sleep(data.get("ms", 500) / 1000)  # stands for building the report
    note("end", job)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    app.run()
