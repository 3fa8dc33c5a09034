"""The asyncio producer: `AsyncClient`, the same API as `Client` on redis.asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Optional

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel

from . import _plan
from ._conn import primary_kwargs
from ._job import Delay, Hold, check_cluster_queue, check_queue, prepare, prepare_many
from ._lua import enqueue_script
from .client import JobSpec, _Settings


async def _close(r: Any) -> None:
    # redis-py 5 names it aclose(); 4.6 has only close().
    closer = getattr(r, "aclose", None) or r.close
    try:
        await closer()
    except (rex.RedisError, OSError):
        pass


class AsyncClient(_Settings):
    """`Client` for asyncio: the same URLs, options, methods and errors, awaited.

    The connection opens at the first enqueue. Use `async with`, or await
    `close()`.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._redis: Any = None
        self._lock: Optional[asyncio.Lock] = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connections; the client cannot be used after it."""
        self._closed = True
        r, self._redis = self._redis, None
        if r is not None:
            await _close(r)

    async def _connect(self) -> Any:
        self._check_open()
        if self._redis is not None:
            return self._redis
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._redis is None:
                await self._open()
        return self._redis

    async def _open(self) -> None:
        ep = self._endpoint
        with _plan.translated(ep):
            if ep.sentinel:
                sentinel = Sentinel(ep.sentinels, sentinel_kwargs={**ep.sentinel_kwargs,
                                                                   **self._common})
                r = sentinel.master_for(ep.primary, **primary_kwargs(ep), **self._common,
                                        **_plan.no_resend(Retry, cluster=False))
                cluster = False
            else:
                kwargs = {**ep.tls_kwargs, **self._common}
                single = {**kwargs, **_plan.no_resend(Retry, cluster=False)}
                many = {**kwargs, **_plan.no_resend(Retry, cluster=True)}
                cluster = ep.cluster
                if cluster is None:
                    probe = aredis.Redis.from_url(ep.url, **single)
                    try:
                        info = await probe.info("cluster")
                        cluster = str(info.get("cluster_enabled", 0)) == "1"
                    except rex.ResponseError:
                        # A server that refuses INFO: say cluster=True if it is one.
                        cluster = False
                    except BaseException:
                        await _close(probe)
                        raise
                    if cluster:
                        await _close(probe)
                        r = RedisCluster.from_url(ep.url, **many)
                        await r.initialize()
                    else:
                        r = probe
                elif cluster:
                    r = RedisCluster.from_url(ep.url, **many)
                    await r.initialize()
                else:
                    r = aredis.Redis.from_url(ep.url, **single)
        self._redis, self._cluster = r, cluster

    async def enqueue(self, queue: str, task: str, data: Any = None, *,
                      id: Optional[str] = None, delay: Optional[Delay] = None,
                      run_at: Optional[datetime] = None, unique_key: Optional[str] = None,
                      unique_for: Optional[Hold] = None) -> Optional[str]:
        """As `Client.enqueue`."""
        check_queue(queue)
        job = prepare(task, data, id=id, delay=delay, run_at=run_at, unique_key=unique_key,
                      unique_for=unique_for)
        return (await self._send(queue, [job]))[0]

    async def enqueue_many(self, queue: str, jobs: Sequence[JobSpec]) -> list[Optional[str]]:
        """As `Client.enqueue_many`."""
        check_queue(queue)
        prepared = prepare_many(jobs)
        if not prepared:
            return []
        return await self._send(queue, prepared)

    async def _send(self, queue: str, jobs: list) -> list[Optional[str]]:
        r = await self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            if self._clock.stale():
                started = self._clock.start()
                self._clock.set(started, await r.time())
            calls = _plan.plan(queue, jobs, self._clock.now_ms())
            plain = [c for c in calls if c.kind != "script"]
            if len(plain) > 1:
                pipe = r.pipeline() if self._cluster else r.pipeline(transaction=False)
                for call in plain:
                    _queue_plain(pipe, call)
                replies = await pipe.execute()
            elif plain:
                replies = [await _queue_plain(r, plain[0])]
            else:
                replies = [await self._script(r, queue, call.args) for call in calls]
        return _plan.ids(calls, replies)

    @staticmethod
    async def _script(r: Any, queue: str, args: list) -> Any:
        source, sha = enqueue_script()
        keys = _plan.keys(queue)
        try:
            return await r.evalsha(sha, len(keys), *keys, *args)
        except rex.NoScriptError:
            # SCRIPT LOAD, not EVAL: the ACL of an enqueueing user grants
            # EVALSHA and SCRIPT LOAD, as for `workerpool enqueue`.
            await r.script_load(source)
            return await r.evalsha(sha, len(keys), *keys, *args)


def _queue_plain(target: Any, call: _plan.Call) -> Any:
    if call.kind == "lpush":
        return target.lpush(call.key, *call.args)
    return target.zadd(call.key, call.args[0])
