"""Jobs as the queue contract writes them: validation and the payload's bytes.

Pure code, no I/O, shared by the blocking and the asyncio clients so that both
write byte for byte what `workerpool enqueue` writes.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, Union

from ._outcomes import Keep, contract, end_key, keep_field, keep_seconds, outcome_key
from .errors import InvalidJob, InvalidQueue

#: How long a job holds its unique key at most when it does not say (seconds).
DEFAULT_UNIQUE_FOR = 3600

#: Jobs per script call or command, as the Rust side batches them.
BATCH = 500

# The words that follow a queue's name after a colon in its other keys (a
# queue name with one of them after a colon would share another queue's
# keys), and a queue's own keys by their suffix, as the workers name them in
# the error: both from contract.json, generated from the queue crate.
KEY_PARTS = tuple(contract()["queue_names"]["key_parts"])
_KEY_NAMES = dict(contract()["queue_names"]["key_names"])

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)

Delay = Union[int, float, timedelta]
Hold = Union[int, float, timedelta]


@dataclass(frozen=True)
class Job:
    """One job for `enqueue_many`; the fields mean what `enqueue`'s arguments mean."""

    task: str
    data: Any = None
    id: Optional[str] = None
    delay: Optional[Delay] = None
    run_at: Optional[datetime] = None
    unique_key: Optional[str] = None
    unique_for: Optional[Hold] = None
    keep: Optional[Keep] = None


_JOB_FIELDS = ("task", "data", "id", "delay", "run_at", "unique_key", "unique_for", "keep")


def check_queue(name: Any) -> str:
    """The queue name, or InvalidQueue with the rule it breaks (as keys.rs checks)."""
    if not isinstance(name, str):
        raise InvalidQueue(f"queue name must be a string, got {type(name).__name__}")
    if not name.strip() or any(c.isspace() for c in name):
        raise InvalidQueue(f"queue name {name!r} must be non-empty and without white space")
    parts = name.split(":")
    for at in range(1, len(parts)):
        if parts[at] in KEY_PARTS:
            owner = ":".join(parts[:at])
            what = _KEY_NAMES.get(name[len(owner) + 1 :])
            how = (f"is {what} of the queue {owner!r}" if what else
                   f"would share the keys of the queue {owner!r} ({owner}:{parts[at]}:…)")
            raise InvalidQueue(
                f"queue name {name!r} {how}; no part of a queue name after a colon may be "
                f"{', '.join(KEY_PARTS)}: rename it, for example {name.replace(':', '-')!r}"
            )
    return name


def hash_tag(key: str) -> Optional[str]:
    """What Redis Cluster hashes instead of the whole key, if the key has a tag."""
    open_ = key.find("{")
    if open_ < 0:
        return None
    close = key.find("}", open_ + 1)
    if close <= open_ + 1:
        return None
    return key[open_ + 1 : close]


def check_cluster_queue(name: str) -> None:
    """On a cluster every key of a queue must share a slot: the name needs a hash tag."""
    if hash_tag(name) is None:
        first = name.split(":", 1)
        suggestion = "{" + first[0] + "}" + (":" + first[1] if len(first) > 1 else "")
        raise InvalidQueue(
            f"Redis is a cluster and queue {name!r} has no hash tag, so its keys would land "
            f"in different slots; name queues with a hash tag in braces, for example "
            f"{suggestion!r}"
        )


def new_id() -> str:
    """A fresh job id: 32 random lowercase hex digits, as the worker makes them."""
    return secrets.token_hex(16)


@dataclass
class Prepared:
    """A validated job: its payload text without the parts fixed at send time."""

    id: str
    fields: dict  # the payload's fields before run_at, id and enqueued_at
    delay_ms: Optional[int]
    run_at_ms: Optional[int]
    unique_key: Optional[str]
    hold_ms: int
    # How long its final outcome is kept (ms), for a job enqueued with keep.
    keep_ms: Optional[int] = None

    def payload(self, now_ms: int) -> tuple[bytes, Optional[int]]:
        """The payload's bytes and its run_at (unix ms), with the clock read at send time."""
        fields = dict(self.fields)
        run_at = self.run_at_ms
        if self.delay_ms is not None:
            run_at = now_ms + self.delay_ms
        if run_at is not None:
            fields["run_at"] = run_at
        # id and enqueued_at last: the taking script then stamps the attempt
        # without parsing the object.
        fields["id"] = self.id
        fields["enqueued_at"] = now_ms
        return _dump(fields), run_at


def _dump(fields: Mapping[str, Any]) -> bytes:
    # Compact and UTF-8 like serde_json; the data was checked by prepare().
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def _check_data(data: Any, where: str) -> None:
    try:
        json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
            "utf-8"
        )
    except TypeError as e:
        raise InvalidJob(f"{where}data cannot be written as JSON: {e}; pass dicts, lists, "
                         f"strings, numbers, booleans and None") from None
    except UnicodeEncodeError as e:
        raise InvalidJob(f"{where}data holds a string that is not valid Unicode ({e.reason} "
                         f"at {e.start}: a lone surrogate); JSON text must be UTF-8") from None
    except ValueError as e:
        if "ircular" in str(e):
            raise InvalidJob(f"{where}data refers to itself (a circular reference): JSON "
                             f"cannot hold it") from None
        raise InvalidJob(f"{where}data holds a float JSON cannot write ({e}); NaN and "
                         f"infinities have no JSON form: send null or a string") from None
    except RecursionError:
        raise InvalidJob(f"{where}data is nested too deeply to write as JSON") from None


def _millis(value: timedelta) -> int:
    return value // _MS


def _delay_ms(delay: Any, where: str) -> int:
    if isinstance(delay, bool) or not isinstance(delay, (int, float, timedelta)):
        raise InvalidJob(f"{where}delay must be seconds (int or float) or a timedelta, "
                         f"got {type(delay).__name__}")
    if isinstance(delay, timedelta):
        ms = _millis(delay)
    else:
        if not math.isfinite(delay):
            raise InvalidJob(f"{where}delay must be a finite number of seconds, got {delay}")
        ms = math.ceil(delay * 1000)
    if ms < 0:
        raise InvalidJob(f"{where}delay must not be negative, got {delay!r}")
    return ms


def _run_at_ms(run_at: Any, where: str) -> int:
    if not isinstance(run_at, datetime):
        raise InvalidJob(f"{where}run_at must be a datetime with a time zone, got "
                         f"{type(run_at).__name__}; for a delay in seconds use delay=")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJob(f"{where}run_at {run_at.isoformat()} has no time zone, so the moment "
                         f"it names is ambiguous; give one, for example "
                         f"datetime(..., tzinfo=timezone.utc) or datetime.now(timezone.utc)")
    return _millis(run_at - _EPOCH)


def _hold_ms(unique_for: Any, where: str) -> tuple[int, int]:
    """(seconds written in the job, hold in ms) for a unique_for."""
    if isinstance(unique_for, bool) or not isinstance(unique_for, (int, float, timedelta)):
        raise InvalidJob(f"{where}unique_for must be whole seconds (int) or a timedelta, got "
                         f"{type(unique_for).__name__}")
    secs: Any = unique_for.total_seconds() if isinstance(unique_for, timedelta) else unique_for
    if isinstance(secs, float):
        if not math.isfinite(secs) or secs != int(secs):
            raise InvalidJob(f"{where}unique_for must be a whole number of seconds, got "
                             f"{unique_for!r}")
        secs = int(secs)
    if secs <= 0:
        raise InvalidJob(f"{where}unique_for must be above 0 seconds, got {unique_for!r}")
    if secs > 2**63 // 1000:
        raise InvalidJob(f"{where}unique_for of {secs} seconds is too long")
    return secs, secs * 1000


def prepare(task: Any, data: Any = None, *, id: Any = None, delay: Any = None,
            run_at: Any = None, unique_key: Any = None, unique_for: Any = None,
            keep: Any = None, where: str = "") -> Prepared:
    """Checks one job's arguments; InvalidJob says what to fix."""
    if not isinstance(task, str) or not task:
        raise InvalidJob(f"{where}task must be a non-empty string naming the handler's task, "
                         f"got {task!r}")
    if id is not None and (not isinstance(id, str) or not id):
        raise InvalidJob(f"{where}id must be a non-empty string (or None for a fresh one), "
                         f"got {id!r}")
    if delay is not None and run_at is not None:
        raise InvalidJob(f"{where}give delay or run_at, not both")
    delay_ms = None if delay is None else _delay_ms(delay, where)
    run_at_ms = None if run_at is None else _run_at_ms(run_at, where)
    if unique_key is not None and (not isinstance(unique_key, str) or not unique_key):
        raise InvalidJob(f"{where}unique_key must be a non-empty string, got {unique_key!r}")
    if unique_for is not None and unique_key is None:
        raise InvalidJob(f"{where}unique_for is set without unique_key")
    keep_secs = None if keep is None else keep_seconds(keep, where)
    _check_data(data, where)
    fields: dict = {"task": task}
    if data is not None:
        fields["data"] = data
    hold_ms = DEFAULT_UNIQUE_FOR * 1000
    if unique_key is not None:
        fields["unique_key"] = unique_key
        if unique_for is not None:
            secs, hold_ms = _hold_ms(unique_for, where)
            fields["unique_for"] = secs
    if keep_secs is not None:
        fields[keep_field()] = keep_secs
    fields.update(current_trace())
    return Prepared(id=id if id is not None else new_id(), fields=fields, delay_ms=delay_ms,
                    run_at_ms=run_at_ms, unique_key=unique_key, hold_ms=hold_ms,
                    keep_ms=None if keep_secs is None else _keep_ms(keep_secs))


def _keep_ms(secs: Union[int, float]) -> int:
    """A keep in whole milliseconds (at least 1), as the queue crate reads the
    field: to the nanosecond, then cut to the millisecond."""
    return max(1, round(secs * 1_000_000_000) // 1_000_000)


def current_trace() -> dict:
    """The W3C trace context of the current span, when OpenTelemetry is installed
    and a span is active: `traceparent` (and `tracestate`), so the worker's span
    for each attempt continues the caller's trace. Without OpenTelemetry, nothing."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict = {}
    propagate.inject(carrier)
    out = {}
    traceparent = carrier.get("traceparent")
    if isinstance(traceparent, str) and traceparent:
        out["traceparent"] = traceparent
        tracestate = carrier.get("tracestate")
        if isinstance(tracestate, str) and tracestate:
            out["tracestate"] = tracestate
    return out


def prepare_many(jobs: Any) -> list[Prepared]:
    """Checks every job of an enqueue_many before anything is sent."""
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, (Sequence, list, tuple)):
        raise InvalidJob(f"jobs must be a list of Job or dict, got {type(jobs).__name__}")
    out = []
    for i, job in enumerate(jobs):
        where = f"job {i + 1}: "
        if isinstance(job, Job):
            kwargs = {name: getattr(job, name) for name in _JOB_FIELDS}
        elif isinstance(job, Mapping):
            unknown = [k for k in job if k not in _JOB_FIELDS]
            if unknown:
                raise InvalidJob(f"{where}unknown field {unknown[0]!r}; a job takes "
                                 f"{', '.join(_JOB_FIELDS)}; nothing was enqueued")
            if "task" not in job:
                raise InvalidJob(f"{where}task is missing; nothing was enqueued")
            kwargs = dict(job)
        else:
            raise InvalidJob(f"{where}must be a Job or a dict, got {type(job).__name__}; "
                             f"nothing was enqueued")
        try:
            out.append(prepare(where=where, **kwargs))
        except InvalidJob as e:
            raise InvalidJob(f"{e}; nothing was enqueued") from None
    return out


def script_args(queue: str, prepared: Sequence[Prepared],
                now_ms: int) -> tuple[list, list, list[bytes]]:
    """The enqueue script's KEYS and ARGV (seven per job) for `prepared`, and the
    payloads, in order, as the queue crate's `admin::enqueue` sends them: the
    queue's four keys, then the outcome hash and end stream of each job that
    keeps its outcome (named in its ARGV by the hash's 1-based position)."""
    keys = [queue, f"{queue}:scheduled", f"{queue}:unique", f"{queue}:unique:expiry"]
    args: list = []
    payloads = []
    for job in prepared:
        payload, run_at = job.payload(now_ms)
        payloads.append(payload)
        args += [payload, "" if run_at is None else str(run_at), job.id,
                 job.unique_key or "", job.hold_ms if job.unique_key else 0]
        if job.keep_ms is None:
            args += ["", ""]
        else:
            keys += [outcome_key(queue, job.id), end_key(queue, job.id)]
            args += [len(keys) - 1, job.keep_ms]
    return keys, args, payloads
