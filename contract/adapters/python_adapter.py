"""The Python client's conformance adapter (protocol in contract/README.md).

    python_adapter.py produce   JSON requests on stdin, one answer line each on stdout
    python_adapter.py handle    the exec handler run by workerpool-worker

Run with the library from the checkout: PYTHONPATH=sdk/python/src.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from workerpool_client import App, Client, Job, Permanent, WaitTimeout

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def job_of(spec: dict) -> Job:
    """A request's job with null mapped to "not given"."""
    delay = spec.get("delay_ms")
    run_at = spec.get("run_at_ms")
    return Job(
        task=spec["task"],
        data=spec.get("data"),
        id=spec.get("id"),
        delay=None if delay is None else timedelta(milliseconds=delay),
        run_at=None if run_at is None else EPOCH + timedelta(milliseconds=run_at),
        unique_key=spec.get("unique_key"),
        unique_for=spec.get("unique_for_s"),
        keep=spec.get("keep_s"),
    )


def outcome(status) -> dict | None:
    """A JobStatus as the protocol's outcome object (the queue crate's names)."""
    return None if status is None else dataclasses.asdict(status)


def ask(client: Client, request: dict) -> dict:
    """The answer to a status, wait or cancel request."""
    op, queue, id = request["op"], request["queue"], request["id"]
    if op == "status":
        return {"status": outcome(client.status(queue, id))}
    if op == "wait":
        try:
            return {"status": outcome(client.wait(queue, id, timeout=request["timeout_ms"] / 1000))}
        except WaitTimeout as e:
            return {"timeout": outcome(e.status)}
    if op == "cancel":
        return {"cancel": client.cancel(queue, id)}
    raise ValueError(f"unknown op {op!r}")


def produce() -> None:
    clients: dict = {}
    out = sys.stdout
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                tls = request.get("tls") or {}
                key = (request["url"], json.dumps(tls, sort_keys=True),
                       bool(request.get("cluster")))
                client = clients.get(key)
                if client is None:
                    client = Client(request["url"], ca=tls.get("ca"), cert=tls.get("cert"),
                                    key=tls.get("key"),
                                    cluster=True if request.get("cluster") else None)
                    clients[key] = client
                if "op" in request:
                    answer = ask(client, request)
                    out.write(json.dumps(answer) + "\n")
                    out.flush()
                    continue
                jobs = [job_of(spec) for spec in request["jobs"]]
                queue = request["queue"]
                if request.get("many"):
                    ids = client.enqueue_many(queue, jobs)
                else:
                    ids = [client.enqueue(queue, j.task, j.data, id=j.id, delay=j.delay,
                                          run_at=j.run_at, unique_key=j.unique_key,
                                          unique_for=j.unique_for, keep=j.keep) for j in jobs]
                answer = {"ids": ids}
            except Exception as e:  # every failure is an answer; the next request goes on
                answer = {"error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(answer) + "\n")
            out.flush()
    finally:
        for client in clients.values():
            client.close()


app = App()


def record(job) -> None:
    line = json.dumps({"id": job.id, "attempt": job.attempt, "task": job.task,
                       "data": job.data}, separators=(",", ":"), ensure_ascii=False)
    # One write of the whole line, so lines of concurrent handlers never mix.
    fd = os.open(os.environ["CONTRACT_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


@app.task("record")
def record_task(data, job):
    record(job)


@app.task("sleep")
async def sleep_task(data, job):
    await asyncio.sleep(data["ms"] / 1000)
    record(job)


@app.task("returning")
def returning_task(data, job):
    record(job)
    return data.get("value")


@app.task("progress")
async def progress_task(data, job):
    steps = data.get("steps", [])
    for i, value in enumerate(steps):
        if i:
            await asyncio.sleep(data.get("step_ms", 50) / 1000)
        job.progress(value)
    record(job)
    return data.get("value")


@app.task("hold")
def hold_task(data, job):
    # On a thread when the process holds several jobs: job.cancelled turns
    # True when a producer cancels the job (the worker's cancel line).
    record(job)
    until = time.monotonic() + data.get("ms", 10000) / 1000
    while not job.cancelled and time.monotonic() < until:
        time.sleep(0.01)
    if job.cancelled:
        raise RuntimeError("stopped as asked")


@app.task("print")
def print_task(data, job):
    print("stray output")
    record(job)


@app.task("fail")
def fail_task(data, job):
    raise RuntimeError(data["message"])


@app.task("permanent")
def permanent_task(data, job):
    raise Permanent(data["message"])


_met: dict = {}


@app.task("meet")
async def meet_task(data, job):
    # Recorded only once data["n"] jobs of data["group"] are in this process
    # at the same time: one process running them one by one never gets there.
    group = _met.setdefault(data["group"], {"arrived": 0, "all": asyncio.Event()})
    group["arrived"] += 1
    if group["arrived"] >= data["n"]:
        group["all"].set()
    try:
        await asyncio.wait_for(group["all"].wait(), data.get("within_ms", 5000) / 1000)
    except asyncio.TimeoutError:
        raise RuntimeError(f"only {group['arrived']} of {data['n']} jobs met in one process") from None
    record(job)


@app.task("crash")
def crash_task(data, job):
    if "attempts" in data and job.attempt > data["attempts"]:
        record(job)
        return
    sys.stderr.write(data["message"] + "\n")
    sys.stderr.flush()
    os._exit(3)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "produce":
        produce()
    elif mode == "handle":
        app.run()
    else:
        sys.exit("usage: python_adapter.py produce|handle")


if __name__ == "__main__":
    main()
