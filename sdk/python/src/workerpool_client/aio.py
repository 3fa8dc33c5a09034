"""The asyncio producer: `AsyncClient`, the same API as `Client` on redis.asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Optional, Union

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel

from . import _outcomes, _plan
from ._conn import primary_kwargs
from ._job import Delay, Hold, check_cluster_queue, check_queue, prepare, prepare_many
from ._lua import cancel_script, enqueue_script
from ._outcomes import JobStatus, Keep
from .client import JobSpec, _Settings, _timed_out


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
        self._waiter: Any = None
        self._lock: Optional[asyncio.Lock] = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connections; the client cannot be used after it."""
        self._closed = True
        r, self._redis = self._redis, None
        w, self._waiter = self._waiter, None
        for c in (r, w):
            if c is not None:
                await _close(c)

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

    async def _connect_waiter(self) -> Any:
        """As `Client._connect_waiter`: the connections that block on XREAD."""
        await self._connect()
        assert self._lock is not None
        async with self._lock:
            if self._waiter is None:
                self._waiter = (await self._build(self._waiting, self._cluster))[0]
        return self._waiter

    async def _open(self) -> None:
        self._redis, self._cluster = await self._build(self._common, self._endpoint.cluster)

    async def _build(self, common: dict, cluster: Optional[bool]) -> tuple[Any, bool]:
        ep = self._endpoint
        with _plan.translated(ep):
            if ep.sentinel:
                sentinel = Sentinel(ep.sentinels, sentinel_kwargs={**ep.sentinel_kwargs,
                                                                   **self._common})
                r = sentinel.master_for(ep.primary, **primary_kwargs(ep), **common,
                                        **_plan.no_resend(Retry, cluster=False))
                cluster = False
            else:
                kwargs = {**ep.tls_kwargs, **common}
                single = {**kwargs, **_plan.no_resend(Retry, cluster=False)}
                many = {**kwargs, **_plan.no_resend(Retry, cluster=True)}
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
        return r, bool(cluster)

    async def enqueue(self, queue: str, task: str, data: Any = None, *,
                      id: Optional[str] = None, delay: Optional[Delay] = None,
                      run_at: Optional[datetime] = None, unique_key: Optional[str] = None,
                      unique_for: Optional[Hold] = None,
                      keep: Optional[Keep] = None) -> Optional[str]:
        """As `Client.enqueue`."""
        check_queue(queue)
        job = prepare(task, data, id=id, delay=delay, run_at=run_at, unique_key=unique_key,
                      unique_for=unique_for, keep=keep)
        return (await self._send(queue, [job]))[0]

    async def enqueue_many(self, queue: str, jobs: Sequence[JobSpec]) -> list[Optional[str]]:
        """As `Client.enqueue_many`."""
        check_queue(queue)
        prepared = prepare_many(jobs)
        if not prepared:
            return []
        return await self._send(queue, prepared)

    async def status(self, queue: str, id: str) -> Optional[JobStatus]:
        """As `Client.status`."""
        check_queue(queue)
        _outcomes.check_id(id)
        r = await self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            return _outcomes.from_fields(id, await r.hgetall(_outcomes.outcome_key(queue, id)))

    async def wait(self, queue: str, id: str, timeout: Union[float, timedelta]) -> JobStatus:
        """As `Client.wait`: the final status (done, dead or cancelled), or
        WaitTimeout."""
        check_queue(queue)
        _outcomes.check_id(id)
        seconds = _outcomes.wait_timeout(timeout)
        deadline = time.monotonic() + seconds
        r = await self._connect_waiter()
        if self._cluster:
            check_cluster_queue(queue)
        key, end = _outcomes.outcome_key(queue, id), _outcomes.end_key(queue, id)
        seen_entry = "0-0"
        marking = True
        with _plan.translated(self._endpoint):
            while True:
                # As `Client.wait`: marked before it is read.
                if marking:
                    try:
                        for command in _outcomes.mark_commands(key):
                            await r.execute_command(*command)
                    except rex.NoPermissionError:
                        marking = False
                status = _outcomes.from_fields(id, await r.hgetall(key))
                if status is not None and status.final:
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _timed_out(queue, id, seconds, status)
                entry = _outcomes.last_entry(await r.xread({end: seen_entry}, count=1,
                                                           block=_outcomes.block_ms(left)))
                seen_entry = entry if entry is not None else seen_entry

    async def cancel(self, queue: str, id: str) -> dict:
        """As `Client.cancel`: cancels job `id` of `queue` and says what it did,
        `{"did": "removed", "from": "waiting"}`, `{"did": "requested", "state":
        "running"}`, `{"did": "final", "state": "done"}` or `{"did":
        "unknown"}`."""
        check_queue(queue)
        _outcomes.check_id(id)
        r = await self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            reply = await self._script(r, cancel_script(), _plan.cancel_keys(queue, id),
                                       _plan.cancel_args(id))
        return _plan.cancelled(reply)

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
                replies = [await self._script(r, enqueue_script(), call.keys or [], call.args)
                           for call in calls]
        return _plan.ids(calls, replies)

    @staticmethod
    async def _script(r: Any, script: tuple[str, str], keys: list, args: list) -> Any:
        source, sha = script
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
