"""Kept outcomes: enqueue(keep=…), status(), wait(), and a task's return value as
the job's result, under the real worker (docs/queue-contract.md, "Outcomes")."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import timedelta
from importlib.resources import files

import pytest
from support import Cluster, Worker, python_env, python_handler

import workerpool_client as wp
from workerpool_client import App, AsyncClient, Client, Job
from workerpool_client import _outcomes as outcomes
from workerpool_client.app import _encode, _outcome

FAST = ("--max-attempts", "2", "--backoff-base", "10ms", "--backoff-max", "20ms")
CONTRACT = json.loads(
    (files("workerpool_client") / "contract.json").read_text(encoding="utf-8"))


def worker(url, queue, tmp_path, concurrency=1, extra=FAST) -> Worker:
    env = python_env()
    env["HANDLER_RECORD"] = str(tmp_path / "records.jsonl")
    return Worker(url, [queue], python_handler("handler_app"), concurrency=concurrency,
                  extra=extra, env=env)


# The facts come from contract.json, not from Python constants.


def test_the_facts_are_the_packaged_contract_s():
    facts = CONTRACT["outcomes"]
    assert outcomes.facts() == facts
    assert outcomes.outcome_key("{q}", "ab") == facts["outcome_key"].replace(
        "{queue}", "{q}").replace("{id}", "ab")
    assert outcomes.end_key("q", "1") == "q:job:1:end"
    # One pass: a queue named with "{id}" is not substituted again.
    assert outcomes.outcome_key("{id}", "x") == "{id}:job:x"
    assert outcomes.block_ms(100) == facts["wait_slice_ms"]
    assert outcomes.block_ms(0.0001) == 1


# keep: what the envelope gets, and what is refused.


def test_keep_is_written_in_seconds_and_checked(redis_server, r, queue):
    limit = CONTRACT["outcomes"]["max_keep_seconds"]
    with Client(redis_server.url) as client:
        client.enqueue(queue, "t", {"n": 1}, keep=60)
        client.enqueue(queue, "t", keep=timedelta(minutes=2))
        client.enqueue(queue, "t", keep=1.5)
        client.enqueue(queue, "t", keep=limit)
        client.enqueue_many(queue, [Job("t", keep=30), {"task": "t", "keep": 5}, Job("t")])
        for bad, match in [(0, "above 0"), (-1, "above 0"), (True, "seconds"),
                           ("60", "seconds"), (float("inf"), "finite"),
                           (limit + 1, f"over the longest an outcome is kept, {limit} seconds"),
                           (timedelta(days=8), f"{limit} seconds")]:
            with pytest.raises(wp.InvalidJob, match=match):
                client.enqueue(queue, "t", keep=bad)
        with pytest.raises(ValueError, match=r"job 2: keep must be above 0.*nothing was enqueued"):
            client.enqueue_many(queue, [Job("t", keep=1), Job("t", keep=0)])
    got = [json.loads(p) for p in r.lrange(queue, 0, -1)][::-1]
    assert [j.get(CONTRACT["outcomes"]["keep_field"]) for j in got] == [
        60, 120, 1.5, limit, 30, 5, None]
    assert list(got[0]) == ["task", "data", "keep", "id", "enqueued_at"]


# End to end under the real worker.


def test_wait_returns_the_result_of_a_done_job_and_the_error_of_a_dead_one(
        redis_server, r, queue, tmp_path):
    with Client(redis_server.url) as client:
        done = client.enqueue(queue, "double", {"n": 21}, keep=60)
        dead = client.enqueue(queue, "permanent", {"message": "no such user"}, keep=60)
        bad = client.enqueue(queue, "unencodable", keep=60)
        plain = client.enqueue(queue, "double", {"n": 1})
        with worker(redis_server.url, queue, tmp_path) as w:
            status = client.wait(queue, done, timeout=20)
            assert status.state == "done" and status.result == {"doubled": 42}, w.read_log()
            assert status.id == done and status.attempt == 1 and status.worker
            assert status.error is None and status.result_error is None
            assert status.ended_at_ms and status.updated_at_ms and status.final
            assert client.status(queue, done) == status

            # A dead job is returned, not raised.
            status = client.wait(queue, dead, timeout=20)
            assert status.state == "dead" and status.error == "no such user"
            assert status.result is None

            status = client.wait(queue, bad, timeout=20)
            assert status.state == "done" and status.result is None
            log = w.read_log()
            assert "task unencodable" in log and "cannot be written as JSON" in log, log

            # Without keep: nothing is kept, and a wait runs out.
            started = time.monotonic()
            with pytest.raises(wp.WaitTimeout, match="no outcome is kept") as e:
                client.wait(queue, plain, timeout=0.5)
            assert e.value.status is None and isinstance(e.value, wp.WorkerpoolError)
            assert 0.5 <= time.monotonic() - started < 3
            assert client.status(queue, plain) is None
    with pytest.raises(wp.WorkerpoolError, match="closed"):
        client.status(queue, done)


def test_status_of_an_unknown_job_is_none_and_arguments_are_checked(redis_server, queue):
    with Client(redis_server.url) as client:
        assert client.status(queue, "nope") is None
        with pytest.raises(wp.WaitTimeout) as e:
            client.wait(queue, "nope", timeout=0)
        assert e.value.status is None
        with pytest.raises(wp.InvalidJob, match="job id"):
            client.status(queue, "")
        with pytest.raises(wp.ConfigError, match="timeout"):
            client.wait(queue, "x", timeout=-1)
        with pytest.raises(wp.InvalidQueue):
            client.status("a:stats", "x")


def test_a_result_that_is_not_json_is_kept_as_text(redis_server, r, queue):
    r.hset(f"{queue}:job:x", mapping={"state": "done", "result": "not json", "attempt": "2",
                                      "ended_at": "17"})
    r.hset(f"{queue}:job:y", mapping={"state": "retrying", "error": "boom", "next_at": "5"})
    r.hset(f"{queue}:job:z", mapping={"state": "elsewhere"})
    with Client(redis_server.url) as client:
        x = client.status(queue, "x")
        assert (x.result, x.attempt, x.ended_at_ms, x.final) == ("not json", 2, 17, True)
        y = client.status(queue, "y")
        assert (y.state, y.error, y.next_at_ms, y.final) == ("retrying", "boom", 5, False)
        with pytest.raises(wp.WaitTimeout, match="it is retrying") as e:
            client.wait(queue, "y", timeout=0.2)
        assert e.value.status == y
        assert client.status(queue, "z") is None


def test_wait_wakes_as_the_job_ends_not_at_the_end_of_a_slice(redis_server, queue, tmp_path):
    slice_s = CONTRACT["outcomes"]["wait_slice_ms"] / 1000
    assert slice_s >= 5
    with Client(redis_server.url, timeout=2) as client:
        with worker(redis_server.url, queue, tmp_path):
            # The worker and its child up first: then the wait measures the job.
            warm = client.enqueue(queue, "double", {"n": 1}, keep=60)
            assert client.wait(queue, warm, timeout=30).state == "done"
            job = client.enqueue(queue, "sleep_then_done", {"ms": 300}, keep=60)
            started = time.monotonic()
            status = client.wait(queue, job, timeout=30)
            took = time.monotonic() - started
            assert status.state == "done" and status.result == "slept"
            assert took < 3, f"wait took {took:.2f}s: it polled instead of blocking"
            # A whole slice blocked on a client whose timeout (2 s) is shorter
            # than it: the waiting connection's own timeout covers it.
            idle = client.enqueue(f"{queue}-idle", "t", keep=60)
            started = time.monotonic()
            with pytest.raises(wp.WaitTimeout):
                client.wait(f"{queue}-idle", idle, timeout=slice_s + 0.5)
            assert slice_s + 0.5 <= time.monotonic() - started < slice_s + 3


def test_many_jobs_in_one_child_answer_with_their_results(redis_server, queue, tmp_path):
    with Client(redis_server.url) as client:
        ids = client.enqueue_many(queue, [Job("async_double", {"n": n, "ms": 100}, keep=60)
                                          for n in range(4)]
                                  + [Job("double", {"n": 10}, keep=60),
                                     Job("unencodable", keep=60)])
        with worker(redis_server.url, queue, tmp_path, concurrency=4,
                    extra=FAST + ("--children", "1")) as w:
            got = [client.wait(queue, i, timeout=30) for i in ids]
            log = w.wait_log("task unencodable", "cannot be written as JSON")
    assert [s.state for s in got] == ["done"] * 6, log
    assert [s.result for s in got] == [{"doubled": 0}, {"doubled": 2}, {"doubled": 4},
                                       {"doubled": 6}, {"doubled": 20}, None]
    assert "task unencodable" in log and "cannot be written as JSON" in log


@pytest.mark.parametrize("task", ["until_cancelled", "async_until_cancelled"])
def test_a_producer_cancel_reaches_a_task_in_a_process_of_one_job(redis_server, queue,
                                                                  tmp_path, task):
    # The default: one child per slot, one job each. The worker learns of the
    # cancel at its heartbeat and writes the cancel line the App asked for.
    with Client(redis_server.url) as client, \
            worker(redis_server.url, queue, tmp_path,
                   extra=FAST + ("--heartbeat-interval", "200ms")) as w:
        job = client.enqueue(queue, task, {"s": 20}, keep=60)
        deadline = time.monotonic() + 15
        while (client.status(queue, job).progress != "waiting for a cancel"
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert client.cancel(queue, job) == {"did": "requested", "state": "running"}
        started = time.monotonic()
        status = client.wait(queue, job, timeout=15)
        took = time.monotonic() - started
        # The next job runs in the same child, unconfused by the cancel line.
        after = client.enqueue(queue, "double", {"n": 2}, keep=60)
        assert client.wait(queue, after, timeout=15).result == {"doubled": 4}
        log = w.read_log()
    assert status.state == "cancelled", log
    assert "RuntimeError: stopped: job.cancelled" in status.error
    assert took < 5, f"the task stopped {took:.1f} s after the cancel"
    assert "exited" not in log, log


def test_async_status_and_wait(redis_server, queue, tmp_path):
    async def main():
        async with AsyncClient(redis_server.url, timeout=2) as client:
            job = await client.enqueue(queue, "async_double", {"n": 4, "ms": 300}, keep=60)
            plain = await client.enqueue(queue, "double", {"n": 1})
            assert (await client.status(queue, job)).state == "waiting"
            assert await client.status(queue, plain) is None
            with worker(redis_server.url, queue, tmp_path, concurrency=2):
                started = time.monotonic()
                a, b = await asyncio.gather(client.wait(queue, job, timeout=30),
                                            client.wait(queue, job, timeout=30))
                assert time.monotonic() - started < 4
                assert a == b and a.state == "done" and a.result == {"doubled": 8}
                assert await client.status(queue, job) == a
                with pytest.raises(wp.WaitTimeout):
                    await client.wait(queue, plain, timeout=0.3)
                with pytest.raises(wp.InvalidJob, match="keep"):
                    await client.enqueue(queue, "t", keep=0)
                # A slice longer than the client's timeout does not trip it.
                idle = await client.enqueue(f"{queue}-idle", "t", keep=60)
                with pytest.raises(wp.WaitTimeout, match="it is waiting") as e:
                    await client.wait(f"{queue}-idle", idle, timeout=5.5)
                assert e.value.status.state == "waiting"

    asyncio.run(main())


# The answer's bytes.


def _app():
    app = App()

    @app.task("value")
    def value(data):
        return data

    @app.task("none")
    def none(data):
        pass

    @app.task("odd")
    def odd(data):
        return {"nan": float("nan")} if data == "nan" else (
            "\ud800" if data == "surrogate" else {1, 2})

    @app.task("coro")
    async def coro(data):
        return [data]

    return app


def test_answer_bytes_with_a_result_and_without():
    app = _app()
    line = app.handle(json.dumps({"task": "value", "data": {"a": "é\n", "n": [1, 2.5]}}).encode())
    assert line == b'{"ok": true, "result": {"a":"\\u00e9\\n","n":[1,2.5]}}\n'
    assert json.loads(line) == {"ok": True, "result": {"a": "é\n", "n": [1, 2.5]}}
    assert app.handle(b'{"task":"none"}') == b'{"ok":true}\n'
    assert app.handle(b'{"task":"value"}') == b'{"ok":true}\n'  # data null: returns None
    assert app.handle(b'{"task":"value","data":0}') == b'{"ok": true, "result": 0}\n'
    assert app.handle(b'{"task":"coro","data":"x"}') == b'{"ok": true, "result": ["x"]}\n'
    # The multiplexed path's answer: the id first, then ok and the result.
    job = app._prepare({"task": "value", "id": "j1"})[0]
    assert _encode({"id": "j1", **_outcome(job, None, False)}) == (
        b'{"id": "j1", "ok": true, "result": false}\n')
    assert _encode({"id": "j1", **_outcome(job, None, None)}) == b'{"id": "j1", "ok": true}\n'


def test_a_result_json_cannot_hold_is_dropped_with_a_warning(caplog):
    app = _app()
    with caplog.at_level(logging.WARNING, logger="workerpool_client"):
        for data in ("nan", "surrogate", "set"):
            line = json.dumps({"task": "odd", "data": data, "id": f"id-{data}"}).encode()
            assert app.handle(line) == b'{"ok":true}\n'
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert all("task odd" in m and "cannot be written as JSON" in m for m in messages)
    assert "id-nan" in messages[0] and "not JSON compliant" in messages[0]
    assert "not valid Unicode" in messages[1]
    assert "set is not JSON serializable" in messages[2]


def test_a_result_over_the_limit_is_said_to_the_worker_not_sent(caplog):
    app = App()
    limit = outcomes.max_result_bytes()

    @app.task("big")
    def big(data):
        return "x" * limit  # its JSON has two quotes more

    with caplog.at_level(logging.WARNING, logger="workerpool_client"):
        answer = json.loads(app.handle(b'{"task":"big"}'))
    why = f"the result was not kept: {limit + 2} bytes of JSON, over the limit of {limit}"
    assert answer == {"ok": True, "result_error": why}
    assert any(why in r.getMessage() for r in caplog.records)


# A cluster routes the outcome's keys to the queue's node.


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def test_wait_on_a_cluster(cluster, tmp_path):
    queue = f"{{{uuid.uuid4().hex[:8]}}}:kept"
    with Client(cluster.url) as client:
        job = client.enqueue(queue, "double", {"n": 5}, keep=60)
        with worker(cluster.url, queue, tmp_path):
            assert client.wait(queue, job, timeout=30).result == {"doubled": 10}
        assert client.status(queue, job).state == "done"
        with pytest.raises(wp.InvalidQueue, match="hash tag"):
            client.status("plain", job)

    async def main():
        async with AsyncClient(cluster.url) as client:
            return await client.wait(queue, job, timeout=5)

    assert asyncio.run(main()).result == {"doubled": 10}
