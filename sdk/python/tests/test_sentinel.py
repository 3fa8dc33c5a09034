"""redis+sentinel:// URLs: the primary is found through a real Sentinel."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from support import RedisServer, eventually

import workerpool_client as wp
from workerpool_client import AsyncClient, Client


@pytest.fixture(scope="module")
def sentinel():
    primary = RedisServer("--requirepass", "pw")
    conf = (f"sentinel monitor mymaster 127.0.0.1 {primary.port} 1\n"
            "sentinel auth-pass mymaster pw\n"
            "sentinel down-after-milliseconds mymaster 60000\n"
            "requirepass spw\n")
    sentinel = RedisServer(sentinel_conf=conf)
    try:
        asked = sentinel.client(password="spw")
        eventually(lambda: asked.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                 "mymaster"),
                   "the sentinel to name the primary")
        yield primary, sentinel
    finally:
        sentinel.stop()
        primary.stop()


def test_the_primary_is_found_through_the_sentinel(sentinel, queue):
    primary, s = sentinel
    url = f"redis+sentinel://:pw@127.0.0.1:{s.port}/mymaster/0?sentinel_password=spw"
    with Client(url) as client:
        job_id = client.enqueue(queue, "t", {"via": "sentinel"}, unique_key="k")
        assert client.enqueue(queue, "t", unique_key="k") is None

    async def main():
        async with AsyncClient(url) as client:
            return await client.enqueue(queue, "t", delay=5)

    later = asyncio.run(main())
    r = primary.client(password="pw")
    assert json.loads(r.lrange(queue, 0, -1)[0])["id"] == job_id
    assert json.loads(r.zrange(f"{queue}:scheduled", 0, -1)[0])["id"] == later


def test_a_primary_the_sentinels_do_not_know_is_a_connection_error(sentinel, queue):
    _, s = sentinel
    url = f"redis+sentinel://:pw@127.0.0.1:{s.port}/othermaster?sentinel_password=spw"
    with Client(url, timeout=3) as client:
        with pytest.raises(wp.ConnectionError, match="othermaster") as e:
            client.enqueue(queue, "t")
    assert "pw@" not in str(e.value) and "spw" not in str(e.value)


def test_status_and_wait_through_the_sentinel(sentinel, queue):
    primary, s = sentinel
    url = f"redis+sentinel://:pw@127.0.0.1:{s.port}/mymaster/0?sentinel_password=spw"
    r = primary.client(password="pw")
    r.hset(f"{queue}:job:j", mapping={"state": "running", "attempt": "1"})

    def end() -> None:
        # What the settle script does as the job ends.
        time.sleep(0.3)
        r.hset(f"{queue}:job:j", mapping={"state": "done", "result": '{"a":1}'})
        r.xadd(f"{queue}:job:j:end", {"state": "done"})

    with Client(url, timeout=2) as client:
        assert client.status(queue, "j").state == "running"
        threading.Thread(target=end).start()
        started = time.monotonic()
        assert client.wait(queue, "j", timeout=20).result == {"a": 1}
        assert time.monotonic() - started < 3

    async def main():
        async with AsyncClient(url) as client:
            return await client.wait(queue, "j", timeout=1)

    assert asyncio.run(main()).state == "done"
