"""The handler the tests run under workerpool-worker --handler exec.

Each task appends a record (one JSON line) to the file named by
HANDLER_RECORD, so the test sees what ran, with which id and attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from workerpool_client import App, Permanent

app = App()


def record(job, **extra):
    line = json.dumps({"id": job.id, "attempt": job.attempt, "task": job.task,
                       "data": job.data, "pid": os.getpid(), **extra})
    with open(os.environ["HANDLER_RECORD"], "a") as f:
        f.write(line + "\n")


@app.task("record")
def record_task(data, job):
    record(job)


@app.task("data_only")
def data_only(data):
    # A task that takes only the data: the job's id is not at hand here.
    with open(os.environ["HANDLER_RECORD"], "a") as f:
        f.write(json.dumps({"task": "data_only", "data": data}) + "\n")


@app.task("fail")
def fail(data, job):
    record(job)
    raise ValueError(data["message"])


@app.task("permanent")
def permanent(data, job):
    record(job)
    raise Permanent(data["message"])


@app.task("stray")
def stray(data, job):
    # Everything that could write to the process's stdout.
    print("stray print from a task")
    sys.stdout.write("stray write\n")
    os.write(1, b"stray bytes on fd 1\n")
    subprocess.run(["echo", "stray output of a subprocess"], check=True)
    subprocess.run(["sh", "-c", "cat > /dev/null"], check=True)  # must not eat the next job
    record(job)


@app.task("async_sleep")
async def async_sleep(data, job):
    started = time.time()
    await asyncio.sleep(data["ms"] / 1000)
    record(job, slept=time.time() - started, loop=id(asyncio.get_running_loop()))


@app.task("double")
def double(data):
    return {"doubled": data["n"] * 2}


@app.task("async_double")
async def async_double(data):
    await asyncio.sleep(data.get("ms", 0) / 1000)
    return {"doubled": data["n"] * 2}


@app.task("sleep_then_done")
def sleep_then_done(data):
    time.sleep(data["ms"] / 1000)
    return "slept"


@app.task("unencodable")
def unencodable(data):
    return {"when": object()}


@app.task("until_cancelled")
def until_cancelled(data, job):
    # Says it runs, then waits for a producer's cancel (or gives up after data["s"]).
    job.progress("waiting for a cancel")
    deadline = time.time() + data["s"]
    while not job.cancelled:
        if time.time() > deadline:
            return "never cancelled"
        time.sleep(0.02)
    raise RuntimeError("stopped: job.cancelled")


@app.task("async_until_cancelled")
async def async_until_cancelled(data, job):
    job.progress("waiting for a cancel")
    deadline = time.time() + data["s"]
    while not job.cancelled:
        if time.time() > deadline:
            return "never cancelled"
        await asyncio.sleep(0.02)
    raise RuntimeError("stopped: job.cancelled")


if __name__ == "__main__":
    app.run()
