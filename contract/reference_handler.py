"""The handler the producer runs are checked with: the worker's exec protocol
(docs/worker.md, "Writing a handler (exec)") in the Python standard library
alone, so a producer is judged by what the worker hands a handler, not by a
client library's handler.

Tasks, as the adapters' `handle` mode: `record` (and any task not below)
appends {"id", "attempt", "task", "data"} to the file named by
CONTRACT_RECORD; `fail` answers a retryable error data.message; `permanent`
answers a permanent one.
"""

import json
import os
import sys


def main():
    record = os.environ["CONTRACT_RECORD"]
    for line in sys.stdin:
        job = json.loads(line)
        task = job.get("task")
        data = job.get("data")
        if task == "fail":
            answer = {"ok": False, "error": str(data["message"])}
        elif task == "permanent":
            answer = {"ok": False, "error": str(data["message"]), "retry": False}
        else:
            entry = {"id": job.get("id"), "attempt": job.get("attempt"), "task": task, "data": data}
            # One write of one line, so records of concurrent children never interleave.
            with open(record, "a", encoding="utf-8") as out:
                out.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
            answer = {"ok": True}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
