"""The blocking producer: `Client`."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Optional, Union

import redis
import redis.exceptions as rex
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from . import _plan
from ._conn import Endpoint, parse, primary_kwargs
from ._job import Delay, Hold, Job, check_cluster_queue, check_queue, prepare, prepare_many
from ._lua import enqueue_script
from .errors import ConfigError, WorkerpoolError

JobSpec = Union[Job, dict]


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"timeout must be a number of seconds above 0, got {value!r}")
    return float(value)


class _Settings:
    """What both clients take: the worker's URL forms and TLS options."""

    def __init__(self, url: str, *, ca: Optional[Union[str, os.PathLike]] = None,
                 cert: Optional[Union[str, os.PathLike]] = None,
                 key: Optional[Union[str, os.PathLike]] = None,
                 insecure_skip_verify: bool = False, cluster: Optional[bool] = None,
                 timeout: float = 10.0) -> None:
        self._endpoint: Endpoint = parse(url, ca=ca, cert=cert, key=key,
                                         insecure_skip_verify=insecure_skip_verify,
                                         cluster=cluster)
        t = _timeout(timeout)
        self._common = {"socket_connect_timeout": t, "socket_timeout": t}
        self._clock = _plan.Clock()
        self._cluster: Optional[bool] = None
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._endpoint.redacted!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise WorkerpoolError(f"{type(self).__name__} for {self._endpoint.redacted} is "
                                  f"closed; make a new one")


class Client(_Settings):
    """Enqueues jobs on the queues of a workerpool Redis.

    `url` takes the worker's forms: `redis://`, `rediss://` (TLS, with `ca`,
    and `cert` + `key` for mutual TLS), any node of a Redis Cluster (found
    with `INFO cluster`, or forced with `cluster=True`), and
    `redis+sentinel://` / `rediss+sentinel://`. The connection opens at the
    first enqueue. Use it as a context manager, or call `close()`.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._redis: Any = None
        # One connection set-up when threads share the client.
        self._lock = threading.Lock()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections; the client cannot be used after it."""
        self._closed = True
        r, self._redis = self._redis, None
        if r is not None:
            try:
                r.close()
            except (rex.RedisError, OSError):
                pass

    def _connect(self) -> Any:
        self._check_open()
        with self._lock:
            if self._redis is None:
                self._open()
        return self._redis

    def _open(self) -> None:
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
                    probe = redis.Redis.from_url(ep.url, **single)
                    try:
                        info = probe.info("cluster")
                        cluster = str(info.get("cluster_enabled", 0)) == "1"
                    except rex.ResponseError:
                        # A server that refuses INFO: say cluster=True if it is one.
                        cluster = False
                    if cluster:
                        probe.close()
                        r = RedisCluster.from_url(ep.url, **many)
                    else:
                        r = probe
                elif cluster:
                    r = RedisCluster.from_url(ep.url, **many)
                else:
                    r = redis.Redis.from_url(ep.url, **single)
        self._redis, self._cluster = r, cluster

    def enqueue(self, queue: str, task: str, data: Any = None, *, id: Optional[str] = None,
                delay: Optional[Delay] = None, run_at: Optional[datetime] = None,
                unique_key: Optional[str] = None,
                unique_for: Optional[Hold] = None) -> Optional[str]:
        """Enqueues one job; returns its id, or None when a job holding `unique_key` is
        already in the queue (the new one was refused).

        `delay` is seconds (int or float) or a timedelta; `run_at` an aware
        datetime (a naive one is refused); not both. `unique_for` is whole
        seconds (default 3600) and needs `unique_key`.
        """
        check_queue(queue)
        job = prepare(task, data, id=id, delay=delay, run_at=run_at, unique_key=unique_key,
                      unique_for=unique_for)
        return self._send(queue, [job])[0]

    def enqueue_many(self, queue: str, jobs: Sequence[JobSpec]) -> list[Optional[str]]:
        """Enqueues jobs in order in one round trip (per 500 jobs); returns their ids,
        None for each one refused as a duplicate. Every job is checked before
        anything is sent.
        """
        check_queue(queue)
        prepared = prepare_many(jobs)
        if not prepared:
            return []
        return self._send(queue, prepared)

    def _send(self, queue: str, jobs: list) -> list[Optional[str]]:
        r = self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            if self._clock.stale():
                started = self._clock.start()
                self._clock.set(started, r.time())
            calls = _plan.plan(queue, jobs, self._clock.now_ms())
            replies: list = []
            plain = [c for c in calls if c.kind != "script"]
            if len(plain) > 1:
                pipe = r.pipeline() if self._cluster else r.pipeline(transaction=False)
                for call in plain:
                    self._queue_plain(pipe, call)
                replies = pipe.execute()
            elif plain:
                replies = [self._queue_plain(r, plain[0])]
            else:
                replies = [self._script(r, queue, call.args) for call in calls]
        return _plan.ids(calls, replies)

    @staticmethod
    def _queue_plain(target: Any, call: _plan.Call) -> Any:
        if call.kind == "lpush":
            return target.lpush(call.key, *call.args)
        return target.zadd(call.key, call.args[0])

    @staticmethod
    def _script(r: Any, queue: str, args: list) -> Any:
        source, sha = enqueue_script()
        keys = _plan.keys(queue)
        try:
            return r.evalsha(sha, len(keys), *keys, *args)
        except rex.NoScriptError:
            # SCRIPT LOAD, not EVAL: the ACL of an enqueueing user grants
            # EVALSHA and SCRIPT LOAD, as for `workerpool enqueue`.
            r.script_load(source)
            return r.evalsha(sha, len(keys), *keys, *args)
