"""The blocking producer: `Client`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Optional, Union

import redis
import redis.exceptions as rex
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from . import _outcomes, _plan
from ._conn import Endpoint, parse, primary_kwargs
from ._job import Delay, Hold, Job, check_cluster_queue, check_queue, prepare, prepare_many
from ._lua import cancel_script, enqueue_script
from ._outcomes import JobStatus, Keep
from .errors import ConfigError, WaitTimeout, WorkerpoolError

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
        # The waiting connections' reply may take a whole slice of XREAD BLOCK:
        # their socket timeout is the slice plus the usual one.
        self._waiting = {"socket_connect_timeout": t,
                         "socket_timeout": t + _outcomes.wait_slice_s()}
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
        self._waiter: Any = None
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
        w, self._waiter = self._waiter, None
        for c in (r, w):
            if c is not None:
                try:
                    c.close()
                except (rex.RedisError, OSError):
                    pass

    def _connect(self) -> Any:
        self._check_open()
        with self._lock:
            if self._redis is None:
                self._open()
        return self._redis

    def _connect_waiter(self) -> Any:
        """The connections that block on XREAD: apart from the enqueueing ones,
        with a socket timeout longer than a slice."""
        self._connect()
        with self._lock:
            if self._waiter is None:
                self._waiter = self._build(self._waiting, self._cluster)[0]
        return self._waiter

    def _open(self) -> None:
        self._redis, self._cluster = self._build(self._common, self._endpoint.cluster)

    def _build(self, common: dict, cluster: Optional[bool]) -> tuple[Any, bool]:
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
        return r, bool(cluster)

    def enqueue(self, queue: str, task: str, data: Any = None, *, id: Optional[str] = None,
                delay: Optional[Delay] = None, run_at: Optional[datetime] = None,
                unique_key: Optional[str] = None,
                unique_for: Optional[Hold] = None,
                keep: Optional[Keep] = None) -> Optional[str]:
        """Enqueues one job; returns its id, or None when a job holding `unique_key` is
        already in the queue (the new one was refused).

        `delay` is seconds (int or float) or a timedelta; `run_at` an aware
        datetime (a naive one is refused); not both. `unique_for` is whole
        seconds (default 3600) and needs `unique_key`. `keep` (seconds or a
        timedelta, above 0 and at most a week) keeps the job's outcome
        readable with `status()` and `wait()` for that long after it ends.
        """
        check_queue(queue)
        job = prepare(task, data, id=id, delay=delay, run_at=run_at, unique_key=unique_key,
                      unique_for=unique_for, keep=keep)
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

    def status(self, queue: str, id: str) -> Optional[JobStatus]:
        """The kept outcome of job `id` of `queue` (one HGETALL), or None when none
        is kept: the job was not enqueued with `keep` (and its workers do not
        run with --keep-outcomes, and no worker has taken it yet), or its
        outcome expired. A job enqueued with `keep` reads `waiting` (or
        `scheduled`) from the moment it is enqueued."""
        check_queue(queue)
        _outcomes.check_id(id)
        r = self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            return _outcomes.from_fields(id, r.hgetall(_outcomes.outcome_key(queue, id)))

    def wait(self, queue: str, id: str, timeout: Union[float, timedelta]) -> JobStatus:
        """Waits up to `timeout` (seconds or a timedelta) for job `id` of `queue` to
        end, and returns its final status: `done`, `dead` or `cancelled` (a dead
        or cancelled job is returned, not raised: look at `state` and `error`). Raises WaitTimeout,
        holding the status as last read (or None), when the time runs out;
        a job with no kept outcome (None from `status()`) is waited for
        until then too, since no worker may have taken it yet.

        It blocks on the job's end stream (XREAD BLOCK, in slices of a few
        seconds), so it wakes as the job ends, and an idle wait costs Redis
        two commands per slice. The blocking reads use connections of their
        own, whose socket timeout is the client's `timeout` plus a slice.
        """
        check_queue(queue)
        _outcomes.check_id(id)
        seconds = _outcomes.wait_timeout(timeout)
        deadline = time.monotonic() + seconds
        r = self._connect_waiter()
        if self._cluster:
            check_cluster_queue(queue)
        key, end = _outcomes.outcome_key(queue, id), _outcomes.end_key(queue, id)
        seen_entry = "0-0"
        marking = True
        with _plan.translated(self._endpoint):
            while True:
                # Marked before it is read: a settlement after the mark adds
                # the entry this wait blocks on, one before it is seen here.
                # A user the ACL refuses the mark waits out each slice.
                if marking:
                    try:
                        for command in _outcomes.mark_commands(key):
                            r.execute_command(*command)
                    except rex.NoPermissionError:
                        marking = False
                status = _outcomes.from_fields(id, r.hgetall(key))
                if status is not None and status.final:
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _timed_out(queue, id, seconds, status)
                entry = _outcomes.last_entry(r.xread({end: seen_entry}, count=1,
                                                     block=_outcomes.block_ms(left)))
                # An entry with the outcome not final (the job runs again
                # under its id): wait for a newer one rather than spin.
                seen_entry = entry if entry is not None else seen_entry

    def cancel(self, queue: str, id: str) -> dict:
        """Cancels job `id` of `queue` (the queue contract's cancel script, one call)
        and says what it did, as the queue crate's `Cancel` serializes:

        - `{"did": "removed", "from": "waiting"}` (or `"scheduled"`,
          `"retrying"`): the job was taken out of where it waited and will not
          run; its outcome is `cancelled` (kept its own `keep`, or a day when
          it kept none), its unique key is freed and its waiters wake.
        - `{"did": "requested", "state": "running"}`: it runs (or a worker took
          it and has not started it): its worker is asked to stop it. The task
          sees `job.cancelled` (an `async def` task `CancelledError`) when it
          runs with others in its process; a task that finishes anyway ends
          as it would have.
        - `{"did": "final", "state": "done"}` (or `"dead"`, `"cancelled"`): it
          ended already; left alone.
        - `{"did": "unknown"}`: no job of that id waits, and no outcome is
          kept for it (it was never kept and runs, or it ended and its outcome
          expired, or there never was one).

        Finding a job that waits scans the queue and its scheduled and retry
        sets (O(depth) on the server, as removing a job by id costs).
        """
        check_queue(queue)
        _outcomes.check_id(id)
        r = self._connect()
        if self._cluster:
            check_cluster_queue(queue)
        with _plan.translated(self._endpoint):
            reply = self._script(r, cancel_script(), _plan.cancel_keys(queue, id),
                                 _plan.cancel_args(id))
        return _plan.cancelled(reply)

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
                replies = [self._script(r, enqueue_script(), call.keys or [], call.args)
                           for call in calls]
        return _plan.ids(calls, replies)

    @staticmethod
    def _queue_plain(target: Any, call: _plan.Call) -> Any:
        if call.kind == "lpush":
            return target.lpush(call.key, *call.args)
        return target.zadd(call.key, call.args[0])

    @staticmethod
    def _script(r: Any, script: tuple[str, str], keys: list, args: list) -> Any:
        source, sha = script
        try:
            return r.evalsha(sha, len(keys), *keys, *args)
        except rex.NoScriptError:
            # SCRIPT LOAD, not EVAL: the ACL of an enqueueing user grants
            # EVALSHA and SCRIPT LOAD, as for `workerpool enqueue`.
            r.script_load(source)
            return r.evalsha(sha, len(keys), *keys, *args)


def _timed_out(queue: str, id: str, timeout: float,
               status: Optional[JobStatus]) -> WaitTimeout:
    if status is None:
        why = ("no outcome is kept for it (it was not enqueued with keep and its workers have "
               "no --keep-outcomes, no worker has taken it yet, or its outcome expired)")
    else:
        why = f"it is {status.state}"
    return WaitTimeout(f"job {id!r} of queue {queue!r} did not end within {timeout:g} s: "
                       f"{why}", status)
