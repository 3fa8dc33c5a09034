"""enqueue(keep=…) writes the outcome `waiting` / `scheduled` at once, and
cancel() (the queue contract's cancel.lua) removes a job that waits, against a
real redis-server (no worker needed)."""

from __future__ import annotations

import asyncio
import json
import time
from importlib.resources import files

import pytest

import workerpool_client as wp
from workerpool_client import AsyncClient, Client, Job

FACTS = json.loads((files("workerpool_client") / "contract.json").read_text(
    encoding="utf-8"))["outcomes"]


def test_a_kept_job_is_waiting_or_scheduled_from_the_moment_it_is_enqueued(
        redis_server, r, queue):
    with Client(redis_server.url) as client:
        now = client.enqueue(queue, "t", {"n": 1}, keep=60)
        later = client.enqueue(queue, "t", delay=30, keep=1.5)
        plain = client.enqueue(queue, "t")
        waiting = client.status(queue, now)
        scheduled = client.status(queue, later)
        assert client.status(queue, plain) is None
        ids = client.enqueue_many(queue, [Job("t", keep=5), Job("t"), Job("t", delay=10)])
        assert client.status(queue, ids[0]).state == "waiting"
        assert client.status(queue, ids[1]) is None and client.status(queue, ids[2]) is None
    assert waiting.state == "waiting" and not waiting.final and waiting.next_at_ms is None
    assert waiting.updated_at_ms and waiting.attempt is None
    assert scheduled.state == "scheduled" and not scheduled.final
    run_at = {j["id"]: j["run_at"] for j in map(json.loads, r.zrange(f"{queue}:scheduled", 0, -1))}
    assert scheduled.next_at_ms == run_at[later]
    # The keep, in ms, is in the hash, for when the job ends.
    assert r.hget(f"{queue}:job:{now}", "keep") == b"60000"
    assert r.hget(f"{queue}:job:{later}", "keep") == b"1500"
    # Jobs went in, in order, as the plain push puts them.
    assert [json.loads(p)["id"] for p in r.lrange(queue, 0, -1)][::-1] == [
        now, plain, ids[0], ids[1]]


def test_cancel_of_a_waiting_job_removes_it_and_its_wait_ends_cancelled(redis_server, r, queue):
    with Client(redis_server.url) as client:
        kept = client.enqueue(queue, "t", keep=60)
        other = client.enqueue(queue, "t", keep=60)
        plain = client.enqueue(queue, "t")
        assert r.llen(queue) == 3
        assert client.cancel(queue, kept) == {"did": "removed", "from": "waiting"}
        assert r.llen(queue) == 2
        status = client.status(queue, kept)
        assert status.state == "cancelled" and status.final
        assert status.ended_at_ms and status.cancel_requested_at_ms
        started = time.monotonic()
        assert client.wait(queue, kept, timeout=10) == status
        assert time.monotonic() - started < 1
        assert r.pttl(f"{queue}:job:{kept}") > 50_000
        # A job enqueued without keep is cancelled too, its outcome kept a day.
        assert client.cancel(queue, plain) == {"did": "removed", "from": "waiting"}
        assert client.status(queue, plain).state == "cancelled"
        day_ms = FACTS["cancelled_keep_seconds"] * 1000
        assert day_ms - 60_000 < r.pttl(f"{queue}:job:{plain}") <= day_ms
        # Cancelled already: final, left alone.
        assert client.cancel(queue, kept) == {"did": "final", "state": "cancelled"}
        assert [json.loads(p)["id"] for p in r.lrange(queue, 0, -1)] == [other]


def test_a_wait_under_way_wakes_when_the_job_is_cancelled(redis_server, queue):
    with Client(redis_server.url) as client, Client(redis_server.url) as other:
        job = client.enqueue(queue, "t", keep=60)

        async def main():
            loop = asyncio.get_running_loop()
            waiting = loop.run_in_executor(None, client.wait, queue, job, 20)
            await asyncio.sleep(0.3)
            started = time.monotonic()
            assert other.cancel(queue, job)["did"] == "removed"
            status = await waiting
            return status, time.monotonic() - started

        status, took = asyncio.run(main())
    assert status.state == "cancelled" and took < 3


def test_cancel_of_a_scheduled_job_removes_it_from_the_scheduled_set(redis_server, r, queue):
    with Client(redis_server.url) as client:
        job = client.enqueue(queue, "t", delay=60, keep=60)
        plain = client.enqueue(queue, "t", delay=60)
        assert r.zcard(f"{queue}:scheduled") == 2
        assert client.cancel(queue, job) == {"did": "removed", "from": "scheduled"}
        assert client.cancel(queue, plain) == {"did": "removed", "from": "scheduled"}
        assert r.zcard(f"{queue}:scheduled") == 0
        assert client.status(queue, job).state == "cancelled"
        assert client.status(queue, job).next_at_ms is None


def test_cancel_of_a_retrying_job_removes_it_from_the_retry_set(redis_server, r, queue):
    payload = json.dumps({"task": "t", "id": "again", "attempt": 1})
    r.zadd(f"{queue}:retry", {payload: 10**13})
    with Client(redis_server.url) as client:
        assert client.cancel(queue, "again") == {"did": "removed", "from": "retrying"}
    assert r.zcard(f"{queue}:retry") == 0


def test_cancel_of_a_unique_job_frees_its_key(redis_server, r, queue):
    with Client(redis_server.url) as client:
        first = client.enqueue(queue, "t", unique_key="daily", keep=60)
        assert client.enqueue(queue, "t", unique_key="daily") is None
        assert client.cancel(queue, first) == {"did": "removed", "from": "waiting"}
        assert r.hget(f"{queue}:unique", "daily") is None
        second = client.enqueue(queue, "t", unique_key="daily")
        assert second is not None
        assert r.hget(f"{queue}:unique", "daily").decode() == second


def test_cancel_of_an_unknown_job_a_done_one_and_a_running_one(redis_server, r, queue):
    r.hset(f"{queue}:job:d", mapping={"state": "done", "result": "1"})
    r.hset(f"{queue}:job:x", mapping={"state": "dead", "error": "boom"})
    r.hset(f"{queue}:job:run", mapping={"state": "running", "attempt": "1", "worker": "w"})
    with Client(redis_server.url) as client:
        assert client.cancel(queue, "nope") == {"did": "unknown"}
        assert client.cancel(queue, "d") == {"did": "final", "state": "done"}
        assert client.cancel(queue, "x") == {"did": "final", "state": "dead"}
        assert client.cancel(queue, "run") == {"did": "requested", "state": "running"}
        status = client.status(queue, "run")
        assert status.state == "running" and status.cancel_requested_at_ms
        with pytest.raises(wp.InvalidJob, match="job id"):
            client.cancel(queue, "")
        with pytest.raises(wp.InvalidQueue):
            client.cancel("a:stats", "x")
    assert r.exists(f"{queue}:job:nope") == 0


def test_status_reads_progress_and_the_cancel_request(redis_server, r, queue):
    r.hset(f"{queue}:job:p", mapping={"state": "running", "progress": '{"done":3}',
                                      "progress_at": "12", "cancel_requested": "13"})
    r.hset(f"{queue}:job:q", mapping={"state": "running", "progress": "not json"})
    with Client(redis_server.url) as client:
        p = client.status(queue, "p")
        q = client.status(queue, "q")
    assert (p.progress, p.progress_at_ms, p.cancel_requested_at_ms) == ({"done": 3}, 12, 13)
    assert q.progress == "not json" and q.progress_at_ms is None


def test_async_keep_and_cancel(redis_server, r, queue):
    async def main():
        async with AsyncClient(redis_server.url) as client:
            job = await client.enqueue(queue, "t", keep=60)
            later = await client.enqueue(queue, "t", delay=60, keep=60)
            assert (await client.status(queue, job)).state == "waiting"
            assert (await client.status(queue, later)).state == "scheduled"
            waiting = asyncio.ensure_future(client.wait(queue, job, timeout=20))
            await asyncio.sleep(0.2)
            assert await client.cancel(queue, job) == {"did": "removed", "from": "waiting"}
            status = await asyncio.wait_for(waiting, 5)
            assert status.state == "cancelled"
            assert await client.cancel(queue, later) == {"did": "removed", "from": "scheduled"}
            assert await client.cancel(queue, job) == {"did": "final", "state": "cancelled"}
            assert await client.cancel(queue, "nope") == {"did": "unknown"}

    asyncio.run(main())
    assert r.llen(queue) == 0 and r.zcard(f"{queue}:scheduled") == 0
