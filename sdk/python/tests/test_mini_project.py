"""The Python mini project (examples/mini_project): six jobs on a pool of three slots."""

from __future__ import annotations

import os
import sys

from support import SDK, Worker, eventually, python_env, read_records

EXAMPLE = SDK / "examples" / "mini_project"


def test_six_jobs_on_three_slots_run_once_fifo_and_at_most_three_at_once(redis_server, r,
                                                                         queue, tmp_path):
    sys.path.insert(0, str(EXAMPLE))
    try:
        from mini.producer import enqueue_six
    finally:
        sys.path.remove(str(EXAMPLE))
    record = tmp_path / "mini.jsonl"
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), env["PYTHONPATH"]])
    env["MINI_RECORD"] = str(record)
    with Worker(redis_server.url, [queue], [sys.executable, "-m", "mini.worker"],
                concurrency=3, env=env) as w:
        # The three children are up before the jobs come, so slots, not start-up, set the pace.
        eventually(lambda: w.read_log().count("handler ready") == 3, "three handlers ready",
                   seen=lambda: w.read_log()[-2000:])
        ids = enqueue_six(redis_server.url, queue, ms=400)
        eventually(lambda: sum(e["event"] == "end" for e in read_records(record)) == 6,
                   "six jobs ended", seen=lambda: (read_records(record), w.read_log()[-2000:]))
    events = read_records(record)
    starts = {e["id"]: e for e in events if e["event"] == "start"}
    ends = {e["id"]: e for e in events if e["event"] == "end"}
    # Each ran once: one start and one end per job, and nothing else.
    assert len(events) == 12 and set(starts) == set(ends) == set(ids), events
    for job_id in ids:
        assert starts[job_id]["at"] <= ends[job_id]["at"], (starts[job_id], ends[job_id])
    # No more than three at once: at every start, count the jobs running.
    overlap = max(sum(1 for j in ids if starts[j]["at"] <= starts[i]["at"] < ends[j]["at"])
                  for i in ids)
    assert overlap <= 3, overlap
    assert overlap == 3, f"three slots should all be used at some point, saw {overlap}"
    # FIFO: the first three enqueued all started before any of the last three.
    first, last = ids[:3], ids[3:]
    assert max(starts[i]["at"] for i in first) < min(starts[i]["at"] for i in last), events
    assert {starts[i]["task"] for i in ids} == {"email", "report"}
    wall = max(e["at"] for e in events) - min(e["at"] for e in events)
    print(f"six 400 ms jobs on three slots took {wall:.2f}s (one slot: about 2.4s)")
