"""App.run() with WORKERPOOL_JOBS_PER_CHILD above 1: the multiplexed protocol
(docs/worker.md, "Many jobs in one child"), driven through pipes as the worker
would, without one."""

from __future__ import annotations

import json
import queue
import random
import subprocess
import tempfile
import threading
import time
from typing import Optional

import pytest
from support import eventually, python_env, python_handler

CANCELLED = "cancelled by the worker (the attempt passed its timeout)"
#: What a process taking one job at a time writes first: it reads stdin while a job runs.
ACCEPTS = b'{"accepts":["cancel"]}\n'


class MuxApp:
    """tests/apps/mux_app.py in a process of its own: job lines in, answers out."""

    def __init__(self, k: Optional[str] = "50", **env: str) -> None:
        full = python_env()
        full.pop("WORKERPOOL_JOBS_PER_CHILD", None)
        if k is not None:
            full["WORKERPOOL_JOBS_PER_CHILD"] = k
        full.update(env)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(python_handler("mux_app"), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=full)
        self.raw: list[bytes] = []
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, *lines: object) -> None:
        assert self.proc.stdin is not None
        for line in lines:
            data = line if isinstance(line, bytes) else json.dumps(line).encode()
            self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def job(self, job_id: str, task: str, data: object = None, **extra: object) -> None:
        self.send({"attempt": 1, "id": job_id, "task": task, "data": data, **extra})

    def answer(self, timeout: float = 15) -> dict:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer in {timeout}s; stderr: {self.log()}") from None
        assert got is not None, f"stdout closed; stderr: {self.log()}"
        return got

    def answers(self, n: int, timeout: float = 15) -> dict:
        """The next n answers, by id (each id once)."""
        by_id: dict = {}
        for _ in range(n):
            got = self.answer(timeout)
            assert got["id"] not in by_id, f"answered twice: {got} and {by_id[got['id']]}"
            by_id[got["id"]] = got
        return by_id

    def close(self, timeout: float = 30) -> int:
        """Closes stdin; the exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def log(self) -> str:
        """What the process wrote on stderr (so far)."""
        if self.stderr.closed:
            return self._log
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def __enter__(self) -> MuxApp:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log = self.log()
        self.stderr.close()


def test_async_jobs_run_at_once_and_answer_as_they_end():
    with MuxApp("50") as app:
        started = time.monotonic()
        for i in range(50):
            app.job(f"s{i}", "sleep", {"ms": 200})
        got = app.answers(50)
        elapsed = time.monotonic() - started
        assert got == {f"s{i}": {"id": f"s{i}", "ok": True} for i in range(50)}
        assert elapsed < 5, f"50 jobs of 200 ms took {elapsed:.2f}s: not at once"
        # A slow job sent first is answered after a quick one sent second.
        app.job("slow", "sleep", {"ms": 1000})
        app.job("quick", "sleep", {"ms": 0})
        assert app.answer() == {"id": "quick", "ok": True}
        assert app.answer() == {"id": "slow", "ok": True}
        assert app.close() == 0
        assert all(line.startswith(b'{"id": ') for line in app.raw), app.raw
    assert "50 jobs at once" in app.log()


def test_def_tasks_run_at_once_on_threads():
    with MuxApp("4", MUX_BARRIER="4") as app:
        for i in range(4):
            app.job(f"b{i}", "barrier")
        # Each waits on a barrier of 4 that passes only when all 4 wait at once.
        assert app.answers(4) == {f"b{i}": {"id": f"b{i}", "ok": True} for i in range(4)}
        assert app.close() == 0


def test_a_cancel_line_cancels_an_async_task_and_the_others_go_on():
    with MuxApp("50") as app:
        app.job("doomed", "wait_forever")
        app.job("fine", "sleep", {"ms": 300})
        time.sleep(0.1)
        app.send({"cancel": "doomed"})
        assert app.answer() == {"id": "doomed", "ok": False, "error": CANCELLED}
        assert app.answer() == {"id": "fine", "ok": True}
        # A cancel for a job not in hand (answered already, or never sent) is ignored.
        app.send({"cancel": "doomed"}, {"cancel": "never-sent"})
        app.job("after", "sleep", {"ms": 0})
        assert app.answer() == {"id": "after", "ok": True}
        assert app.close() == 0


def test_a_def_task_on_a_thread_sees_job_cancelled_and_is_answered_when_it_ends():
    with MuxApp("4") as app:
        app.job("polling", "poll_cancel")
        eventually(lambda: "polling polling" in app.log(), "the task on its thread",
                   seen=app.log)
        app.send({"cancel": "polling"})
        assert app.answer() == {"id": "polling", "ok": False, "error": "saw the cancel",
                                "retry": False}
        assert app.close() == 0


def test_failures_carry_the_id_and_the_retry_flag():
    with MuxApp("50") as app:
        app.job("p", "permanent", {"message": "no such user"})
        app.job("e", "fail", {"message": "smtp said no"})
        app.job("u", "resize_image", {})
        app.send({"attempt": 1, "id": "n", "data": {}})
        got = app.answers(4)
        assert app.close() == 0
    assert got["p"] == {"id": "p", "ok": False, "error": "no such user", "retry": False}
    assert got["e"]["ok"] is False and "retry" not in got["e"]
    assert got["e"]["error"].startswith("ValueError: smtp said no\n"
                                        "Traceback (most recent call last)")
    assert 'mux_app.py", line' in got["e"]["error"] and "in fail" in got["e"]["error"]
    assert got["u"]["retry"] is False
    assert got["u"]["error"].startswith("unknown task 'resize_image'; this handler runs: sleep,")
    assert got["n"]["retry"] is False and got["n"]["error"].startswith("job has no task")


def test_lines_that_cannot_be_answered_are_logged_and_the_app_goes_on():
    with MuxApp("50") as app:
        app.send(b"not json", b"\xff\xfe", b"[1,2]", b'{"task":"sleep","data":{"ms":0}}',
                 b'{"id":7,"task":"sleep","data":{"ms":0}}', b"x" * 500)
        app.job("next", "sleep", {"ms": 0})
        assert app.answer() == {"id": "next", "ok": True}
        assert app.close() == 0
        assert len(app.raw) == 1
    log = app.log()
    assert "not JSON" in log and "b'not json'" in log and "\\xff\\xfe" in log
    assert "not a JSON object: b'[1,2]'" in log
    assert log.count("without a string id") == 2
    assert "b'" + "x" * 200 + "'… (500 bytes)" in log and "x" * 201 not in log


def test_eof_waits_for_the_jobs_in_hand():
    with MuxApp("50") as app:
        for i in range(5):
            app.job(f"a{i}", "sleep", {"ms": 300})
            app.job(f"t{i}", "sync_sleep", {"ms": 300})
        assert app.close() == 0
        got = [json.loads(line) for line in app.raw]
    assert sorted(g["id"] for g in got) == sorted([f"a{i}" for i in range(5)] +
                                                  [f"t{i}" for i in range(5)])
    assert all(g["ok"] for g in got)


def test_each_task_runs_in_its_own_jobs_trace():
    pytest.importorskip("opentelemetry.propagate")
    traces = {f"j{i}": f"{i + 1:032x}" for i in range(6)}
    with MuxApp("50") as app:
        for i, (job_id, trace) in enumerate(traces.items()):
            app.job(job_id, "trace_id" if i % 2 else "trace_id_sync",
                    traceparent=f"00-{trace}-{i + 1:016x}-01")
        got = app.answers(len(traces))
        assert app.close() == 0
    assert {job_id: a["error"] for job_id, a in got.items()} == traces


@pytest.mark.parametrize("value", ["1", None])
def test_one_job_at_a_time_answers_without_an_id(value):
    with MuxApp(value) as app:
        app.job("a", "sleep", {"ms": 0})
        app.job("b", "permanent", {"message": "no"})
        assert app.close() == 0
        assert app.raw == [ACCEPTS, b'{"ok":true}\n',
                           b'{"ok": false, "error": "no", "retry": false}\n']
        assert "WORKERPOOL_JOBS_PER_CHILD" not in app.log()


@pytest.mark.parametrize("task", ["poll_cancel", "async_poll_cancel"])
def test_one_job_at_a_time_a_cancel_line_for_the_running_job_sets_job_cancelled(task):
    with MuxApp(None) as app:
        assert app.lines.get(timeout=15) == {"accepts": ["cancel"]}, app.log()
        app.job("c", task)
        eventually(lambda: "c polling" in app.log(), what="the task to start")
        app.send({"cancel": "someone-else"}, {"cancel": "c"})
        assert app.answer() == {"ok": False, "error": "saw the cancel", "retry": False}
        # Ignored, after its answer; the next job runs and is not cancelled.
        app.send({"cancel": "c"})
        app.job("d", task, {"s": 0.3})
        assert app.answer() == {"ok": True}
        assert app.close() == 0
        assert app.raw[0] == ACCEPTS and len(app.raw) == 3


@pytest.mark.parametrize("value", ["many", "0", "-3", ""])
def test_a_malformed_share_is_warned_about_and_taken_as_one(value):
    with MuxApp(value) as app:
        app.job("a", "sleep", {"ms": 0})
        assert app.close() == 0
        assert app.raw == [ACCEPTS, b'{"ok":true}\n']
    log = app.log()
    assert log.count(f"WORKERPOOL_JOBS_PER_CHILD={value!r} is not a positive integer") == 1


@pytest.mark.parametrize("seed,k", [(1, 2), (2, 8), (3, 50)])
def test_random_interleavings_answer_every_job_once(seed, k):
    rng = random.Random(seed)
    expected: dict = {}
    cancelled: set = set()
    with MuxApp(str(k)) as app:
        in_hand = 0
        n = 200
        for i in range(n):
            job_id = f"{seed}-{i}"
            kind = rng.choice(["ok", "ok", "fail", "permanent", "unknown"])
            task = "nope" if kind == "unknown" else rng.choice(["mixed", "mixed_sync"])
            expected[job_id] = kind
            # Like the worker, mostly k jobs in hand at most; sometimes more.
            if in_hand >= k and rng.random() < 0.9:
                app.answer()
                in_hand -= 1
            app.job(job_id, task, {"ms": rng.randint(0, 20), "kind": kind})
            in_hand += 1
            if rng.random() < 0.2:
                target = f"{seed}-{rng.randint(max(0, i - 2 * k), i)}"
                cancelled.add(target)
                app.send({"cancel": target})
            if rng.random() < 0.05:
                app.send(b'{"not a job"')
        assert app.close() == 0
        answers = [json.loads(line) for line in app.raw]
    assert any(a.get("error") == CANCELLED for a in answers), "some cancels came in time"
    ids = [a["id"] for a in answers]
    assert sorted(ids) == sorted(expected), "every job answered exactly once"
    for a in answers:
        kind = expected[a["id"]]
        if kind != "unknown" and a["id"] in cancelled and a.get("error") == CANCELLED:
            assert a == {"id": a["id"], "ok": False, "error": CANCELLED}
        elif kind == "ok":
            assert a == {"id": a["id"], "ok": True}
        elif kind == "fail":
            assert a["ok"] is False and "retry" not in a
            assert a["error"].startswith("RuntimeError: failed on purpose\nTraceback")
        elif kind == "permanent":
            assert a == {"id": a["id"], "ok": False, "error": "permanent on purpose",
                         "retry": False}
        else:
            assert a["ok"] is False and a["retry"] is False
            assert a["error"].startswith("unknown task 'nope'")


def test_a_job_line_larger_than_a_stream_readers_limit():
    with MuxApp("4") as app:
        big = "x" * (4 << 20)
        app.job("big", "sleep", {"ms": 0, "pad": big})
        assert app.answer() == {"id": "big", "ok": True}
        assert app.close() == 0
