"""App under the real worker: workerpool-worker --handler exec -- <python> -m handler_app."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import (
    Worker,
    dead_letters,
    eventually,
    python_env,
    python_handler,
    read_records,
)

import workerpool_client as wp
from workerpool_client import App, Client, Job

FAST_RETRY = ("--max-attempts", "2", "--backoff-base", "10ms", "--backoff-max", "20ms")


@pytest.fixture
def record(tmp_path):
    return tmp_path / "records.jsonl"


def worker(redis_server, queue, record, concurrency=1, extra=FAST_RETRY) -> Worker:
    env = python_env()
    env["HANDLER_RECORD"] = str(record)
    return Worker(redis_server.url, [queue], python_handler("handler_app"),
                  concurrency=concurrency, extra=extra, env=env)


def settled(r, queue, n):
    """n jobs done or dead."""
    def check():
        done = int(r.get(f"{queue}:stats:processed") or 0)
        return done + r.llen(f"{queue}:dead") >= n
    return check


def test_done_with_id_and_attempt_and_a_data_only_task(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        ids = client.enqueue_many(queue, [Job("record", {"n": 1}), Job("record", {"n": 2}),
                                          Job("data_only", [1, "two"])])
    with worker(redis_server, queue, record, concurrency=2) as w:
        eventually(settled(r, queue, 3), "3 jobs done",
                   seen=lambda: (read_records(record), w.read_log()[-2000:]))
    got = read_records(record)
    by_id = {g["id"]: g for g in got if g["task"] == "record"}
    assert set(by_id) == set(ids[:2])
    assert by_id[ids[0]]["attempt"] == 1 and by_id[ids[0]]["data"] == {"n": 1}
    assert {"task": "data_only", "data": [1, "two"]} in got
    assert r.get(f"{queue}:stats:processed") == b"3" and r.llen(f"{queue}:dead") == 0


def test_an_exception_is_retried_and_dead_letters_with_its_traceback(redis_server, r, queue,
                                                                     record):
    with Client(redis_server.url) as client:
        job_id = client.enqueue(queue, "fail", {"message": "smtp said no"})
    with worker(redis_server, queue, record) as w:
        eventually(lambda: r.llen(f"{queue}:dead") == 1, "the job dead after 2 attempts",
                   seen=lambda: (read_records(record), w.read_log()[-2000:]))
    [dead] = dead_letters(r, queue)
    assert dead["reason"] == "exhausted" and dead["attempts"] == 2
    assert dead["job"]["id"] == job_id
    assert dead["error"].startswith("ValueError: smtp said no\nTraceback (most recent call last)")
    assert 'handler_app.py", line' in dead["error"] and "in fail" in dead["error"]
    assert [(g["id"], g["attempt"]) for g in read_records(record)] == [(job_id, 1), (job_id, 2)]


def test_permanent_dead_letters_at_once(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        job_id = client.enqueue(queue, "permanent", {"message": "no such user"})
    with worker(redis_server, queue, record) as w:
        eventually(lambda: r.llen(f"{queue}:dead") == 1, "the job dead",
                   seen=lambda: w.read_log()[-2000:])
    [dead] = dead_letters(r, queue)
    assert dead["reason"] == "permanent" and dead["attempts"] == 1
    assert dead["error"].startswith("no such user"), dead["error"]
    assert dead["job"]["id"] == job_id
    assert len(read_records(record)) == 1


def test_an_unknown_task_is_permanent_and_names_the_known_ones(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "resize_image", {})
    with worker(redis_server, queue, record) as w:
        eventually(lambda: r.llen(f"{queue}:dead") == 1, "the job dead",
                   seen=lambda: w.read_log()[-2000:])
    [dead] = dead_letters(r, queue)
    assert dead["reason"] == "permanent"
    assert dead["error"].startswith("unknown task 'resize_image'; this handler runs: record, "
                                    "data_only, fail, permanent, stray, async_sleep")


def test_stray_output_goes_to_stderr_and_the_protocol_holds(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        ids = client.enqueue_many(queue, [Job("stray"), Job("record", 1), Job("stray"),
                                          Job("record", 2)])
    with worker(redis_server, queue, record) as w:
        eventually(settled(r, queue, 4), "4 jobs done", seen=lambda: w.read_log()[-3000:])
        log = w.read_log()
    assert r.get(f"{queue}:stats:processed") == b"4" and r.llen(f"{queue}:dead") == 0
    assert [g["id"] for g in read_records(record)] == ids
    for line in ("stray print from a task", "stray write", "stray bytes on fd 1",
                 "stray output of a subprocess"):
        assert line in log, f"{line!r} not in the worker's log (the handler's stderr)"


def test_an_async_task_is_awaited_on_one_loop(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        client.enqueue_many(queue, [Job("async_sleep", {"ms": 150}) for _ in range(3)])
    with worker(redis_server, queue, record) as w:
        eventually(settled(r, queue, 3), "3 jobs done", seen=lambda: w.read_log()[-2000:])
    got = read_records(record)
    assert len(got) == 3 and all(g["slept"] >= 0.14 for g in got), got
    assert len({g["pid"] for g in got}) == 1 and len({g["loop"] for g in got}) == 1, got


def run_app(lines: bytes) -> subprocess.CompletedProcess:
    """handler_app on its own, lines on stdin: what it answers on stdout."""
    env = python_env()
    env["HANDLER_RECORD"] = "/dev/null"
    out = subprocess.run(python_handler("handler_app"), input=lines, capture_output=True,
                         env=env, timeout=30)
    # First, before any answer: it reads stdin while a job runs (a cancel line).
    accepts = b'{"accepts":["cancel"]}\n'
    assert out.stdout.startswith(accepts), out.stdout[:200]
    out.stdout = out.stdout[len(accepts):]
    return out


def test_malformed_lines_get_a_permanent_answer_and_the_app_goes_on():
    job = json.dumps({"attempt": 1, "id": "j1", "task": "stray", "data": None}).encode()
    out = run_app(b"not json\n[1,2]\n{\"id\":\"x\"}\n\xff\xfe\n" + job + b"\n")
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0, out.stderr
    assert len(answers) == 5, out.stdout
    assert answers[0]["retry"] is False and "not JSON" in answers[0]["error"]
    assert answers[1]["retry"] is False and "a job is a JSON object" in answers[1]["error"]
    assert answers[2]["retry"] is False and answers[2]["error"].startswith("job has no task")
    assert answers[3]["retry"] is False and "not JSON" in answers[3]["error"]
    assert answers[4] == {"ok": True}
    assert b'"id"' not in out.stdout, "one job at a time: answers as before, without ids"
    assert b"stray print from a task" in out.stderr


def test_task_definitions_are_checked():
    app = App()

    @app.task("a")
    def a(data):
        pass

    with pytest.raises(wp.ConfigError, match="defined twice"):
        app.task("a")(a)
    with pytest.raises(wp.ConfigError, match=r"must take \(data\) or \(data, job\)"):
        app.task("b")(lambda: None)
    with pytest.raises(wp.ConfigError, match="must take"):
        app.task("c")(lambda x, y, z: None)
    with pytest.raises(wp.ConfigError, match="non-empty string"):
        app.task("")

    @app.task
    def named_after_itself(data, job):
        pass

    assert app.tasks == ["a", "named_after_itself"]
    with pytest.raises(wp.ConfigError, match="has no tasks"):
        App().run()
    answer = app.handle(b'{"task":"a","id":"x","attempt":1}\n')
    assert answer == b'{"ok":true}\n'
    assert sys.stdout is not None


def test_a_unique_key_is_released_when_its_job_is_done_or_dead(redis_server, r, queue, record):
    with Client(redis_server.url) as client:
        first = client.enqueue(queue, "record", {"n": 1}, unique_key="daily")
        assert client.enqueue(queue, "record", {"n": 2}, unique_key="daily") is None
        dead = client.enqueue(queue, "permanent", {"message": "x"}, unique_key="doomed")
        assert first and dead
        with worker(redis_server, queue, record) as w:
            eventually(settled(r, queue, 2), "both jobs settled",
                       seen=lambda: w.read_log()[-2000:])
            eventually(lambda: r.hlen(f"{queue}:unique") == 0, "both keys released",
                       seen=lambda: r.hgetall(f"{queue}:unique"))
            again = client.enqueue(queue, "record", {"n": 3}, unique_key="daily")
            assert again and again != first
            assert client.enqueue(queue, "record", {"n": 4}, unique_key="doomed")
            eventually(settled(r, queue, 4), "the new jobs done",
                       seen=lambda: w.read_log()[-2000:])
    assert [g["data"]["n"] for g in read_records(record) if g["task"] == "record"] == [1, 3, 4]
