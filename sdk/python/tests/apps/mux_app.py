"""A handler for the multiplexed protocol's tests, driven through pipes without a
worker (tests/test_mux.py). Tasks report what they saw through their answers:
a Permanent's message is the answer's error.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from workerpool_client import App, Permanent

app = App()
# Passes only when MUX_BARRIER threads wait on it at once.
barrier = threading.Barrier(int(os.environ.get("MUX_BARRIER", "4")))


@app.task("sleep")
async def sleep(data):
    await asyncio.sleep(data["ms"] / 1000)


@app.task("sync_sleep")
def sync_sleep(data):
    time.sleep(data["ms"] / 1000)


@app.task("barrier")
def barrier_task(data):
    barrier.wait(timeout=10)


@app.task("wait_forever")
async def wait_forever(data):
    await asyncio.sleep(3600)


@app.task("poll_cancel")
def poll_cancel(data, job):
    print(f"{job.id} polling", flush=True)  # stdout is stderr here
    deadline = time.monotonic() + (data or {}).get("s", 10)
    while not job.cancelled:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    raise Permanent("saw the cancel")


@app.task("async_poll_cancel")
async def async_poll_cancel(data, job):
    print(f"{job.id} polling", flush=True)  # stdout is stderr here
    deadline = time.monotonic() + (data or {}).get("s", 10)
    while not job.cancelled:
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.01)
    raise Permanent("saw the cancel")


@app.task("fail")
async def fail(data):
    raise ValueError(data["message"])


@app.task("permanent")
def permanent(data):
    raise Permanent(data["message"])


@app.task("mixed")
async def mixed(data):
    await asyncio.sleep(data["ms"] / 1000)
    outcome(data)


@app.task("mixed_sync")
def mixed_sync(data):
    time.sleep(data["ms"] / 1000)
    outcome(data)


def outcome(data):
    if data["kind"] == "fail":
        raise RuntimeError("failed on purpose")
    if data["kind"] == "permanent":
        raise Permanent("permanent on purpose")


@app.task("trace_id")
async def trace_id(data):
    # The trace the task runs in, after a pause that lets other jobs run.
    from opentelemetry import trace

    await asyncio.sleep(0.05)
    raise Permanent(f"{trace.get_current_span().get_span_context().trace_id:032x}")


@app.task("trace_id_sync")
def trace_id_sync(data):
    from opentelemetry import trace

    time.sleep(0.05)
    raise Permanent(f"{trace.get_current_span().get_span_context().trace_id:032x}")



@app.task("progress")
def progress(data, job):
    for value in data["values"]:
        job.progress(value)
    return "reported"


@app.task("async_progress")
async def async_progress(data, job):
    for value in data["values"]:
        job.progress(value)
        await asyncio.sleep(0.01)
    return "reported"


@app.task("progress_from_a_thread")
def progress_from_a_thread(data, job):
    t = threading.Thread(target=job.progress, args=(data["value"],))
    t.start()
    t.join()


@app.task("progress_too_big")
def progress_too_big(data, job):
    job.progress("x" * data["size"])


if __name__ == "__main__":
    app.run()
