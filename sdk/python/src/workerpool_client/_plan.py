"""What an enqueue sends, shared by the blocking and the asyncio clients.

Mirrors `workerpool enqueue`: jobs with a unique key or a `keep` go through the
contract's enqueue script, which checks the key and writes the kept job's
outcome (`waiting` or `scheduled`) in the same step (all jobs of the call then
do, so their order holds); the rest
are one LPUSH of the jobs that run now and one ZADD of the delayed ones onto
`<q>:scheduled`, scored by `run_at`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Optional

import redis
import redis.exceptions as rex
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
from redis.backoff import NoBackoff
from redis.sentinel import MasterNotFoundError

from ._conn import Endpoint
from ._job import BATCH, Prepared, script_args
from ._outcomes import cancelled_keep_seconds, end_key, outcome_key
from .errors import ConnectionError, RedisError, WorkerpoolError

# The server clock is read again after this long, so a clock step on either
# side is picked up; between reads the local monotonic clock counts.
CLOCK_REFRESH_S = 300.0


def cancel_keys(queue: str, id: str) -> list:
    """The cancel script's KEYS for job `id` of a queue."""
    return [queue, f"{queue}:scheduled", f"{queue}:retry", f"{queue}:unique",
            f"{queue}:unique:expiry", outcome_key(queue, id), end_key(queue, id)]


def cancel_args(id: str) -> list:
    """The cancel script's ARGV: the id, and how long a cancelled job that kept no
    outcome has its `cancelled` kept (contract.json), in ms."""
    return [id, cancelled_keep_seconds() * 1000]


@dataclass
class Call:
    """One script call (`script`, with its `keys`) or one plain write (`lpush` /
    `zadd`)."""

    kind: str
    key: str
    args: list
    jobs: Sequence[Prepared]
    keys: Optional[list] = None


def plan(queue: str, jobs: Sequence[Prepared], now_ms: int) -> list[Call]:
    chunks = [jobs[i : i + BATCH] for i in range(0, len(jobs), BATCH)]
    if any(job.unique_key or job.keep_ms is not None for job in jobs):
        calls = []
        for chunk in chunks:
            keys, args, _ = script_args(queue, chunk, now_ms)
            calls.append(Call("script", queue, args, chunk, keys))
        return calls
    calls = []
    for chunk in chunks:
        now, later = [], {}
        for job in chunk:
            payload, run_at = job.payload(now_ms)
            if run_at is None:
                now.append(payload)
            else:
                later[payload] = run_at
        if now:
            calls.append(Call("lpush", queue, now, chunk))
        if later:
            calls.append(Call("zadd", f"{queue}:scheduled", [later], chunk))
    return calls


def cancelled(reply: Sequence) -> dict:
    """The cancel script's reply `[did, state]` as the queue crate's `Cancel`
    serializes: `{"did": "removed", "from": state}`, `{"did": "requested",
    "state": state}`, `{"did": "final", "state": state}` or `{"did":
    "unknown"}`."""
    did, state = (_text(part) for part in reply)
    if did == "removed":
        return {"did": did, "from": state}
    if did in ("requested", "final"):
        return {"did": did, "state": state}
    return {"did": "unknown"}


def _text(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def ids(calls: Sequence[Call], replies: Sequence) -> list[Optional[str]]:
    """The job ids in order, None for a job the script refused as a duplicate."""
    out: list[Optional[str]] = []
    seen = set()
    for call, reply in zip(calls, replies):
        if call.kind == "script":
            out += [job.id if int(ok) == 1 else None for job, ok in zip(call.jobs, reply)]
        elif id(call.jobs) not in seen:
            # An LPUSH and a ZADD of one chunk share its jobs: listed once.
            seen.add(id(call.jobs))
            out += [job.id for job in call.jobs]
    return out


class Clock:
    """The Redis server's clock, read once and then followed locally.

    `enqueued_at` and a delay's `run_at` are on the Redis clock, as the Rust
    side writes them, without costing a TIME round trip per enqueue.
    """

    def __init__(self) -> None:
        self._offset: Optional[float] = None
        self._read_at = 0.0

    def stale(self) -> bool:
        return self._offset is None or time.monotonic() - self._read_at > CLOCK_REFRESH_S

    def start(self) -> float:
        return time.monotonic()

    def set(self, started: float, reply) -> None:
        ended = time.monotonic()
        seconds, micros = int(reply[0]), int(reply[1])
        server_ms = seconds * 1000 + micros / 1000
        self._offset = server_ms - (started + ended) / 2 * 1000
        self._read_at = ended

    def now_ms(self) -> int:
        assert self._offset is not None
        return int(time.monotonic() * 1000 + self._offset)


def no_resend(retry_class: type, cluster: bool) -> dict:
    """Options that keep redis-py from sending a command again after a lost reply.

    A write may have landed before its reply was lost: sent again, a job would
    be pushed twice, or a unique job refused as a duplicate of itself. The
    workers do not resend either. (redis-py 6 retries by default; 5 only on a
    cluster.) Redirections (MOVED, ASK) are still followed.
    """
    options: dict = {"retry": retry_class(NoBackoff(), 0)}
    if cluster and int(redis.__version__.split(".")[0]) < 6:
        options["cluster_error_retry_attempts"] = 0
    return options


@contextlib.contextmanager
def translated(endpoint: Endpoint) -> Iterator[None]:
    """redis-py's exceptions as this library's, naming the server (password hidden)."""
    where = endpoint.redacted
    try:
        yield
    except WorkerpoolError:
        raise
    except (MasterNotFoundError, AsyncMasterNotFound) as e:
        raise ConnectionError(f"no sentinel of {where} named a reachable primary: {e}") from e
    except rex.AuthenticationError as e:
        raise ConnectionError(f"Redis at {where} refused the credentials ({e}): check the "
                              f"user and password in the URL") from e
    except (rex.ConnectionError, rex.TimeoutError, OSError) as e:
        raise ConnectionError(f"cannot reach Redis at {where}: {e}") from e
    except rex.RedisClusterException as e:
        raise ConnectionError(f"cannot use the Redis Cluster at {where}: {e}") from e
    except rex.RedisError as e:
        raise RedisError(f"Redis at {where} refused the command: {e}") from e
