"""AsyncClient: the same API as Client, on redis.asyncio."""

from __future__ import annotations

import asyncio
import json

import pytest

import workerpool_client as wp
from workerpool_client import AsyncClient, Job


def test_async_enqueue_unique_delay_and_many(redis_server, r, queue):
    async def main():
        async with AsyncClient(redis_server.url) as client:
            a = await client.enqueue(queue, "t", {"n": 1})
            b, c = await asyncio.gather(
                client.enqueue(queue, "t", {"n": 2}, unique_key="k"),
                client.enqueue(queue, "t", {"n": 3}, unique_key="k"),
            )
            d = await client.enqueue(queue, "t", delay=10)
            many = await client.enqueue_many(queue, [Job("t", 4), {"task": "t", "data": 5}])
            return a, b, c, d, many

    a, b, c, d, many = asyncio.run(main())
    # Of two concurrent enqueues of one unique key exactly one gets in.
    assert (b is None) != (c is None)
    waiting = [json.loads(p) for p in r.lrange(queue, 0, -1)]
    assert [j["id"] for j in waiting][::-1] == [a, b or c, *many]
    assert list(waiting[0])[-2:] == ["id", "enqueued_at"]
    [scheduled] = r.zrange(f"{queue}:scheduled", 0, -1)
    assert json.loads(scheduled)["id"] == d


def test_async_errors_are_the_library_s(redis_server, r, queue):
    async def main():
        async with AsyncClient(redis_server.url) as client:
            with pytest.raises(wp.InvalidJob, match="unique_for must be above 0"):
                await client.enqueue(queue, "t", unique_key="k", unique_for=0)
            with pytest.raises(wp.InvalidQueue):
                await client.enqueue("a:stats", "t")
            r.set(queue, "x")
            with pytest.raises(wp.RedisError, match="WRONGTYPE"):
                await client.enqueue(queue, "t")
        with pytest.raises(wp.WorkerpoolError, match="closed"):
            await client.enqueue(queue, "t")
        async with AsyncClient("redis://127.0.0.1:1", timeout=2) as client:
            with pytest.raises(wp.ConnectionError, match="cannot reach Redis"):
                await client.enqueue(queue, "t")

    asyncio.run(main())
