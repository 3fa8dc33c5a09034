"""A quick self-test of contract/adapters/python_adapter.py in both modes."""

from __future__ import annotations

import json
import subprocess
import sys

from support import ROOT, Worker, dead_letters, eventually, python_env, read_records

ADAPTER = ROOT / "contract" / "adapters" / "python_adapter.py"


def test_produce_answers_one_line_per_request_and_survives_errors(redis_server, r, queue):
    proc = subprocess.Popen([sys.executable, str(ADAPTER), "produce"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_env())

    def ask(request: dict) -> dict:
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"no answer; stderr: {proc.stderr.read().decode()}"
        return json.loads(line)

    base = {"url": redis_server.url, "tls": None, "cluster": False, "queue": queue}
    job = {"task": "record", "data": None, "id": None, "delay_ms": None, "run_at_ms": None,
           "unique_key": None, "unique_for_s": None}
    try:
        one = ask({**base, "many": False, "jobs": [
            {**job, "data": {"n": 1}, "id": "given-1"},
            {**job, "data": {"n": 2}, "unique_key": "u", "unique_for_s": 60},
            {**job, "data": {"n": 3}, "unique_key": "u"},
            {**job, "delay_ms": 60000},
            {**job, "run_at_ms": 4102444800123},
        ]})
        ids = one["ids"]
        assert ids[0] == "given-1" and len(ids[1]) == 32 and ids[2] is None, one
        many = ask({**base, "many": True, "jobs": [{**job, "data": [i]} for i in range(3)]})
        assert len(many["ids"]) == 3 and all(many["ids"]), many
        bad = ask({**base, "queue": "x:retry", "many": False, "jobs": [job]})
        assert "InvalidQueue" in bad["error"], bad
        bad = ask({**base, "many": False, "jobs": [{**job, "unique_key": "k",
                                                    "unique_for_s": 0}]})
        assert "unique_for must be above 0" in bad["error"], bad
        after = ask({**base, "many": True, "jobs": [job]})
        assert len(after["ids"]) == 1
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0, proc.stderr.read().decode()
    assert r.llen(queue) == 2 + 3 + 1
    scores = sorted(int(s) for _, s in r.zrange(f"{queue}:scheduled", 0, -1, withscores=True))
    assert scores[1] == 4102444800123


def test_handle_runs_every_contract_task_under_the_worker(redis_server, r, queue, tmp_path):
    record = tmp_path / "record.jsonl"
    env = python_env()
    env["CONTRACT_RECORD"] = str(record)
    jobs = [("record", {"x": "é😀", "n": [1, 2.5, None]}), ("sleep", {"ms": 50}),
            ("print", {}), ("fail", {"message": "try again"}),
            ("permanent", {"message": "never"}), ("crash", {"message": "crashed hard"})]
    r.lpush(queue, *[json.dumps({"task": t, "data": d, "id": f"j-{t}"}) for t, d in jobs])
    with Worker(redis_server.url, [queue], [sys.executable, str(ADAPTER), "handle"], env=env,
                extra=("--max-attempts", "2", "--backoff-base", "10ms", "--backoff-max",
                       "20ms")) as w:
        eventually(lambda: r.llen(f"{queue}:dead") == 3, "three dead letters",
                   seen=lambda: (r.lrange(f"{queue}:dead", 0, -1), w.read_log()[-2000:]),
                   timeout=30)
        log = w.read_log()
    got = read_records(record)
    assert [(g["id"], g["attempt"], g["task"]) for g in got] == [
        ("j-record", 1, "record"), ("j-sleep", 1, "sleep"), ("j-print", 1, "print")]
    assert got[0]["data"] == {"x": "é😀", "n": [1, 2.5, None]}
    dead = {d["job"]["id"]: d for d in dead_letters(r, queue)}
    assert dead["j-fail"]["reason"] == "exhausted"
    assert dead["j-fail"]["error"].startswith("RuntimeError: try again")
    assert dead["j-permanent"]["reason"] == "permanent"
    assert dead["j-permanent"]["error"].startswith("never")
    assert "crashed hard" in dead["j-crash"]["error"]
    assert "stray output" in log
