"""Kept outcomes (docs/queue-contract.md, "Outcomes"): a job's state, result or
error by id, and the wait for it to end.

The facts (key forms, the `keep` field, the longest keep, the wait slice, the
states) are read from `contract.json`, generated from the queue crate and
shipped in this package: nothing here types them again. Pure code, no I/O,
shared by the blocking and the asyncio clients.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from importlib.resources import files
from typing import Any, Optional, Union

from .errors import ConfigError, InvalidJob

Keep = Union[int, float, timedelta]


@cache
def contract() -> dict:
    """The packaged contract.json, generated from the queue crate."""
    text = files(__package__).joinpath("contract.json").read_text(encoding="utf-8")
    return json.loads(text)


def facts() -> dict:
    """The `outcomes` object of the packaged contract.json."""
    return contract()["outcomes"]


def keep_field() -> str:
    return facts()["keep_field"]


def max_result_bytes() -> int:
    """The longest result a worker keeps, in bytes of JSON: a longer one is
    answered as `result_error`."""
    return facts()["max_result_bytes"]


def max_keep_seconds() -> int:
    return int(facts()["max_keep_seconds"])


def waited_field() -> str:
    """The field a waiter sets in an outcome before it blocks: the job's end
    stream gets its entry only when one did (a stream costs Redis some KB)."""
    return str(facts()["waited_field"])


def mark_commands(key: str) -> list:
    """The commands that mark the outcome `key` waited for, in order: the
    field, and a week's expiry for a hash the mark makes (`NX`: an outcome's
    own expiry stays)."""
    return [("HSET", key, waited_field(), 1),
            ("PEXPIRE", key, max_keep_seconds() * 1000, "NX")]


def wait_slice_s() -> float:
    return int(facts()["wait_slice_ms"]) / 1000


def final_states() -> frozenset:
    return frozenset(facts()["final_states"])


def max_progress_bytes() -> int:
    """The largest progress report, in bytes of JSON text."""
    return int(facts()["max_progress_bytes"])


def cancelled_keep_seconds() -> int:
    """How long a job cancelled while it waited has its outcome kept when it
    kept none of its own."""
    return int(facts()["cancelled_keep_seconds"])


_PLACEHOLDER = re.compile(r"\{queue\}|\{id\}")


def _key(form: str, queue: str, id: str) -> str:
    # One pass, so a queue name holding "{id}" is not substituted twice.
    return _PLACEHOLDER.sub(lambda m: queue if m.group(0) == "{queue}" else id, form)


def outcome_key(queue: str, id: str) -> str:
    """`<q>:job:<id>`: the hash of a kept outcome."""
    return _key(facts()["outcome_key"], queue, id)


def end_key(queue: str, id: str) -> str:
    """`<q>:job:<id>:end`: the stream that gets one entry when the job ends."""
    return _key(facts()["outcome_end_key"], queue, id)


def keep_seconds(keep: Any, where: str = "") -> Union[int, float]:
    """The seconds written as the job's `keep`, or InvalidJob saying what to fix."""
    if isinstance(keep, bool) or not isinstance(keep, (int, float, timedelta)):
        raise InvalidJob(f"{where}keep must be seconds (int or float) or a timedelta, got "
                         f"{type(keep).__name__}")
    secs: Union[int, float] = keep.total_seconds() if isinstance(keep, timedelta) else keep
    if isinstance(secs, float):
        if not math.isfinite(secs):
            raise InvalidJob(f"{where}keep must be a finite number of seconds, got {keep!r}")
        if secs == int(secs):
            secs = int(secs)
    if not secs > 0:
        raise InvalidJob(f"{where}keep must be above 0 seconds, got {keep!r}")
    limit = max_keep_seconds()
    if secs > limit:
        raise InvalidJob(f"{where}keep of {secs} seconds is over the longest an outcome is "
                         f"kept, {limit} seconds (a week)")
    return secs


def check_id(id: Any) -> None:
    if not isinstance(id, str) or not id:
        raise InvalidJob(f"a job id is a non-empty string, got {id!r}")


@dataclass(frozen=True)
class JobStatus:
    """A kept job's outcome, as `<q>:job:<id>` holds it.

    `state` is one of contract.json's states: `waiting`, `scheduled`,
    `running`, `retrying`, or a final one, `done`, `dead` or `cancelled`.
    `result` is a done job's result as its handler returned it (JSON parsed;
    text that is not JSON is kept as the string), None when it returned
    none; `result_error` says why a returned result was not kept (too
    large). `error` is the last attempt's error (retrying, dead). `progress`
    is the latest progress a running job reported (JSON parsed, as
    `result`), at `progress_at_ms`; `cancel_requested_at_ms` is when a
    cancel was asked for. Times are unix milliseconds on the Redis clock.
    """

    id: str
    state: str
    attempt: Optional[int] = None
    worker: Optional[str] = None
    result: Any = None
    result_error: Optional[str] = None
    error: Optional[str] = None
    next_at_ms: Optional[int] = None
    updated_at_ms: Optional[int] = None
    ended_at_ms: Optional[int] = None
    progress: Any = None
    progress_at_ms: Optional[int] = None
    cancel_requested_at_ms: Optional[int] = None

    @property
    def final(self) -> bool:
        """Whether nothing more happens to the job (done, dead or cancelled)."""
        return self.state in final_states()


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _number(value: Optional[str]) -> Optional[int]:
    if value is None or not value.isdigit():
        return None
    return int(value)


def from_fields(id: str, raw: dict) -> Optional[JobStatus]:
    """The status in a HGETALL reply; None when there is no hash (never kept, not
    taken yet, or expired) or it names no state this library knows."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    state = fields.get("state")
    if state not in facts()["states"]:
        return None
    return JobStatus(id=id, state=state, attempt=_number(fields.get("attempt")),
                     worker=fields.get("worker"), result=_json(fields.get("result")),
                     result_error=fields.get("result_error"), error=fields.get("error"),
                     next_at_ms=_number(fields.get("next_at")),
                     updated_at_ms=_number(fields.get("updated_at")),
                     ended_at_ms=_number(fields.get("ended_at")),
                     progress=_json(fields.get("progress")),
                     progress_at_ms=_number(fields.get("progress_at")),
                     cancel_requested_at_ms=_number(fields.get("cancel_requested")))


def _json(text: Optional[str]) -> Any:
    """A JSON field of the hash, parsed; text that does not parse (the worker
    writes JSON it checked) is kept as the string rather than lost."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def wait_timeout(timeout: Any) -> float:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            math.isfinite(timeout) and timeout >= 0):
        raise ConfigError(f"timeout must be seconds (a number of at least 0, or a timedelta), "
                         f"got {timeout!r}")
    return float(timeout)


def block_ms(left: float) -> int:
    """XREAD's BLOCK for a wait with `left` seconds to go: at most a slice, and at
    least 1 ms (0 would block for ever)."""
    return max(1, math.ceil(min(left, wait_slice_s()) * 1000))


def last_entry(reply: Any) -> Optional[Any]:
    """The id of the entry an XREAD returned, None when it timed out."""
    if not reply:
        return None
    # RESP2: [[stream, [[id, fields]]]]; RESP3: {stream: [[id, fields]]}.
    streams = reply.values() if isinstance(reply, dict) else [s[1] for s in reply]
    for entries in streams:
        if entries:
            return entries[-1][0]
    return None
