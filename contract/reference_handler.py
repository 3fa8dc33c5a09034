"""The handler the producer runs are checked with: the worker's exec protocol
(docs/worker.md, "Writing a handler (exec)", and "Many jobs in one child"
when WORKERPOOL_JOBS_PER_CHILD is above 1) in the Python standard library
alone, so a producer is judged by what the worker hands a handler, not by a
client library's handler.

Tasks, as the adapters' `handle` mode: `record` (and any task not below)
appends {"id", "attempt", "task", "data"} to the file named by
CONTRACT_RECORD; `fail` answers a retryable error data.message; `permanent`
answers a permanent one; `returning` records and answers data.value as the
result; `progress` writes a progress line for each of data.steps
(data.step_ms, default 50, apart), then records and answers data.value;
`hold` records, then waits until the worker's cancel line (several jobs per
child only: with one job at a time this handler never says it accepts a
cancel line, so the worker sends none) or data.ms (default 10000) passes,
failing "stopped as asked" when cancelled.
"""

import json
import os
import sys
import threading
import time

RECORD = os.environ["CONTRACT_RECORD"]
LOCK = threading.Lock()


def say(message):
    """One line to the worker, whole."""
    with LOCK:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def record(job, task, data):
    entry = {"id": job.get("id"), "attempt": job.get("attempt"), "task": task, "data": data}
    # One write of one line, so records of concurrent children never interleave.
    with LOCK, open(RECORD, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")


def run(job, cancelled, named):
    """The answer to `job`; `cancelled` is set when the worker cancels it,
    `named` says whether lines name their job (several jobs per child)."""
    task = job.get("task")
    data = job.get("data")
    if task == "fail":
        return {"ok": False, "error": str(data["message"])}
    if task == "permanent":
        return {"ok": False, "error": str(data["message"]), "retry": False}
    if task == "progress":
        for i, value in enumerate(data.get("steps", [])):
            if i:
                time.sleep(data.get("step_ms", 50) / 1000)
            say({"id": job["id"], "progress": value} if named else {"progress": value})
    record(job, task, data)
    if task in ("returning", "progress"):
        value = data.get("value")
        return {"ok": True} if value is None else {"ok": True, "result": value}
    if task == "hold":
        if cancelled.wait(data.get("ms", 10000) / 1000):
            return {"ok": False, "error": "stopped as asked"}
    return {"ok": True}


def main():
    if int(os.environ.get("WORKERPOOL_JOBS_PER_CHILD", "1")) <= 1:
        for line in sys.stdin:
            say(run(json.loads(line), threading.Event(), False))
        return
    # Several jobs at once: each on a thread, answered by id, any order.
    cancels = {}

    def serve(job, cancelled):
        answer = run(job, cancelled, True)
        cancels.pop(job["id"], None)
        say({"id": job["id"], **answer})

    threads = []
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message and "cancel" in message:
            event = cancels.get(message["cancel"])
            if event is not None:
                event.set()
            continue
        cancelled = cancels[message["id"]] = threading.Event()
        thread = threading.Thread(target=serve, args=(message, cancelled), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
