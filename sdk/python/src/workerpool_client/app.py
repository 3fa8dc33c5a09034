"""The exec handler: `App` runs tasks for `workerpool-worker --handler exec`.

The worker writes one job per line on the process's stdin and reads one
answer per line on its stdout: `{"ok":true}` (with `"result":…` when the task
returned something other than None), `{"ok":false,"error":…}` (retried) or
`{"ok":false,"error":…,"retry":false}` (dead-lettered).

With `WORKERPOOL_JOBS_PER_CHILD` above 1 (`--children` below the
concurrency), the process holds that many jobs at once and speaks the
multiplexed protocol (`_mux.py`): each answer names its job with `"id"`,
answers come in any order, and `{"cancel":"<id>"}` lines cancel a job.

A task's `job.progress(value)` writes a progress line before the job's answer:
`{"progress": <value>}`, or `{"id": <job id>, "progress": <value>}` in the
multiplexed protocol. A progress line has no "ok".

Taking one job at a time, the process says at start that it reads stdin while
a job runs (`{"accepts":["cancel"]}`), and a reader thread reads it: a
`{"cancel":"<id>"}` line (a producer's cancel of the running job) sets that
job's `cancelled`, and job lines go to the main thread in order.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ._outcomes import max_progress_bytes, max_result_bytes
from .errors import ConfigError, InvalidProgress, Permanent

log = logging.getLogger("workerpool_client")

#: The environment variable with the number of jobs the process holds at once
#: (settings' JOBS_PER_CHILD; the worker sets it for each exec child).
JOBS_PER_CHILD = "WORKERPOOL_JOBS_PER_CHILD"


@dataclass(frozen=True)
class JobContext:
    """The job a task runs: what the worker handed over.

    `cancelled` turns True when the worker cancels the job: a producer
    cancelled it (`Client.cancel`) while it ran, or, in the multiplexed
    protocol (`WORKERPOOL_JOBS_PER_CHILD` above 1), its attempt passed
    `--job-timeout` (a process taking one job at a time is killed then). A
    task polls it to give up early, raising an error (the job then ends
    cancelled with it) or returning (done). Taking one job at a time, that
    is all a cancel does, for `def` and `async def` tasks alike; in the
    multiplexed protocol an `async def` task also sees
    `asyncio.CancelledError`, and a `def` task, on a thread that cannot be
    stopped, only the flag.

    `progress(value)` reports how far the task has got.
    """

    id: Optional[str]
    attempt: int
    task: str
    data: Any
    raw: dict = field(repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False,
                                     compare=False)
    _report: Optional[Callable[[str], None]] = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the worker has cancelled this job (a producer's cancel; in the
        multiplexed protocol, a timeout too)."""
        return self._cancel.is_set()

    def progress(self, value: Any) -> None:
        """Reports the task's progress: `value` is any JSON value (a number, or a
        small dict such as `{"done": 40, "of": 100}`) whose JSON text is at most
        contract.json's `max_progress_bytes` (4096). It goes to the worker as a
        line before the job's answer; the worker writes the latest report of a
        job enqueued with `keep` to its outcome (`JobStatus.progress`), at most
        every `progress_interval_ms`, and drops those of other jobs. Call it as
        often as you like, from the task or a thread it started; a report after
        the task ended is dropped.

        Raises InvalidProgress (a ValueError), sending nothing, for a value JSON
        cannot hold or one over the limit. Outside `App.run()` (`App.handle`
        in a test) a report goes nowhere.
        """
        text = _progress_text(value)
        if self._report is not None:
            self._report(text)


@dataclass
class _Task:
    fn: Callable[..., Any]
    wants_job: bool
    is_async: bool = False

    def call(self, job: JobContext) -> Any:
        return self.fn(job.data, job) if self.wants_job else self.fn(job.data)


def _is_async(fn: Callable[..., Any]) -> bool:
    # An async def, or an object whose __call__ is one (not whether it is callable).
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004


def _wants_job(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not positional or len(required) > 2:
        raise ConfigError(f"task {name!r}: {getattr(fn, '__name__', fn)!r} must take (data) or "
                          f"(data, job), got {len(positional)} positional parameters "
                          f"({len(required)} required)")
    return len(positional) >= 2


def _attach_trace(raw: dict) -> Any:
    """With OpenTelemetry installed, makes the worker's span of this attempt (the
    job line's `traceparent`) the current context, so the task's own spans are its
    children. Returns what `_detach_trace` restores."""
    traceparent = raw.get("traceparent")
    if not isinstance(traceparent, str):
        return None
    try:
        from opentelemetry import context, propagate
    except ImportError:
        return None
    carrier = {"traceparent": traceparent}
    if isinstance(raw.get("tracestate"), str):
        carrier["tracestate"] = raw["tracestate"]
    return context.attach(propagate.extract(carrier))


def _detach_trace(token: Any) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)


def _failed(error: str, retry: bool = True) -> dict:
    out: dict = {"ok": False, "error": error}
    if not retry:
        out["retry"] = False
    return out


class _Result(str):
    """A task's result as JSON text (ASCII), checked: `_encode` writes it as is."""


def _result_text(job: JobContext, result: Any) -> Optional[_Result]:
    """The JSON text of what a task returned; None, with a warning in the log, when
    it cannot be written as JSON (the job is still done, without a result)."""
    try:
        # UTF-8 first: a lone surrogate, which ensure_ascii would escape into
        # JSON the worker refuses, fails here.
        json.dumps(result, ensure_ascii=False, allow_nan=False).encode("utf-8")
        return _Result(json.dumps(result, ensure_ascii=True, allow_nan=False,
                                  separators=(",", ":")))
    except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError is a ValueError
        reason = (f"a string that is not valid Unicode ({e.reason})"
                  if isinstance(e, UnicodeEncodeError) else f"{type(e).__name__}: {e}")
        log.warning("task %s (job %s, attempt %s) returned a result that cannot be written "
                    "as JSON (%s); the job is done without a result", job.task, job.id,
                    job.attempt, reason)
        return None


def _progress_text(value: Any) -> str:
    """The JSON text (ASCII) of a progress report, checked: InvalidProgress when
    JSON cannot hold the value or its JSON text (compact UTF-8, as the worker
    keeps it) is over `max_progress_bytes`."""
    try:
        exact = json.dumps(value, ensure_ascii=False, allow_nan=False,
                           separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        reason = (f"a string that is not valid Unicode ({e.reason})"
                  if isinstance(e, UnicodeEncodeError) else f"{type(e).__name__}: {e}")
        raise InvalidProgress(f"job.progress(): the value cannot be written as JSON ({reason}); "
                              f"report numbers, strings, lists and dicts") from None
    limit = max_progress_bytes()
    if len(exact) > limit:
        raise InvalidProgress(f"job.progress(): the value is {len(exact)} bytes of JSON, over "
                              f"the limit of {limit}; report a number or a small dict, and "
                              f"return the rest as the result; nothing was sent")
    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _progress_line(text: str, job_id: Optional[str] = None) -> bytes:
    """A progress line: `{"progress": <value>}`, led by the job's id in the
    multiplexed protocol. No "ok": the worker tells it from an answer so."""
    head = "{" if job_id is None else "{" + f'"id": {json.dumps(job_id)}, '
    return (head + '"progress": ' + text + "}\n").encode("ascii")


#: The line a process taking one job at a time writes at start: it reads stdin
#: while a job runs, so the worker may send a producer's cancel.
ACCEPTS_LINE = b'{"accepts":["cancel"]}\n'


class _InTurn:
    """The one-job protocol's stdout for one job: its progress lines, then its
    answer, and nothing after the answer (a thread the task left behind may
    still report). Also the job's cancel: set by the reader thread when a
    cancel line names the job."""

    def __init__(self, fd: int, job_id: Any = None) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._open = True
        self.job_id = job_id
        self.cancel = threading.Event()

    def progress(self, text: str) -> None:
        with self._lock:
            if not self._open:
                log.debug("a progress report after the job was answered: dropped")
                return
            sys.stderr.flush()
            _write_all(self._fd, _progress_line(text))

    def answer(self, line: bytes) -> None:
        with self._lock:
            self._open = False
            sys.stderr.flush()
            _write_all(self._fd, line)


def _outcome(job: JobContext, error: Optional[BaseException], result: Any = None) -> dict:
    """The answer (without its id) to a task that returned `result` (`error`
    None) or raised `error`: Permanent is dead-lettered, anything else retried
    with its traceback. A result other than None is the answer's `result`."""
    if error is None:
        text = None if result is None else _result_text(job, result)
        if text is not None and len(text) > max_result_bytes():
            # Said to the worker, which keeps the reason in the job's outcome
            # (the text is ASCII: its length is its size in bytes).
            why = (f"the result was not kept: {len(text)} bytes of JSON, over the limit of "
                   f"{max_result_bytes()}")
            log.warning("task %s (job %s, attempt %s): %s; the job is done without it",
                        job.task, job.id, job.attempt, why)
            return {"ok": True, "result_error": why}
        return {"ok": True} if text is None else {"ok": True, "result": text}
    if isinstance(error, Permanent):
        return _failed(str(error) or "permanent failure", retry=False)
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    log.warning("task %s (job %s, attempt %s) failed: %s", job.task, job.id, job.attempt,
                message)
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return _failed(f"{message}\n{trace}".rstrip())


def _encode(out: dict) -> bytes:
    """An answer as its line."""
    if out == {"ok": True}:
        return b'{"ok":true}\n'
    result = out.get("result")
    if isinstance(result, _Result):
        # The result's text as checked, after the other fields (never empty: "ok").
        head = json.dumps({k: v for k, v in out.items() if k != "result"}, ensure_ascii=True)
        return (head[:-1] + ', "result": ' + result + "}\n").encode("ascii")
    # ensure_ascii: the line holds no raw newline or odd byte, whatever the error says.
    return (json.dumps(out, ensure_ascii=True) + "\n").encode("ascii")


def _jobs_per_child() -> int:
    """WORKERPOOL_JOBS_PER_CHILD: 1 when unset; a bad value is warned about and
    taken as 1."""
    value = os.environ.get(JOBS_PER_CHILD)
    if value is None:
        return 1
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        log.warning("%s=%r is not a positive integer; taking one job at a time",
                    JOBS_PER_CHILD, value)
        return 1
    return k


class App:
    """Tasks by name, and `run()`, the loop an exec handler runs.

    ```python
    app = App()

    @app.task("send_email")
    def send_email(data, job):
        ...

    if __name__ == "__main__":
        app.run()
    ```
    """

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def tasks(self) -> list[str]:
        """The names of the tasks, in the order they were added."""
        return list(self._tasks)

    def task(self, name: Any = None) -> Any:
        """Decorator naming a task: `@app.task("send_email")`, or `@app.task()` /
        `@app.task` for the function's own name. The function takes `(data)` or
        `(data, job)`; it may be `async def`. What it returns, unless None, is
        the job's result (any JSON value), kept for a job enqueued with `keep`;
        a value JSON cannot hold leaves the job done without one, with a
        warning in the log.
        """
        if callable(name):
            return self.task(None)(name)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a task name must be a non-empty string, got {name!r}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise ConfigError(f"@app.task decorates a function, got {type(fn).__name__}")
            task_name = name or getattr(fn, "__name__", None)
            if not task_name:
                raise ConfigError("give the task a name: @app.task(\"name\")")
            if task_name in self._tasks:
                raise ConfigError(f"task {task_name!r} is defined twice")
            self._tasks[task_name] = _Task(fn, _wants_job(fn, task_name), _is_async(fn))
            return fn

        return register

    def handle(self, line: bytes) -> bytes:
        """The answer line to one job line (what `run()` does with each line
        when the process takes one job at a time). The task's progress reports
        go nowhere here."""
        return self._handle(line, None)

    def _handle(self, line: bytes, report: Optional[Callable[[str], None]],
                parsed: Any = None, cancel: Optional[threading.Event] = None) -> bytes:
        """`parsed`: the line read already, `(raw, error)`."""
        raw, error = parsed if parsed is not None else _parse_line(line)
        if error is not None:
            return _encode(_failed(f"malformed job line, not JSON ({error}): {line[:200]!r}",
                                   retry=False))
        if not isinstance(raw, dict):
            return _encode(_failed(f"malformed job line: a job is a JSON object, got "
                                   f"{type(raw).__name__}", retry=False))
        prepared = self._prepare(raw, report, cancel)
        if isinstance(prepared, dict):
            return _encode(prepared)
        job, task = prepared
        token = _attach_trace(raw)
        try:
            result = task.call(job)
            if inspect.isawaitable(result):
                result = self._run_coroutine(result)
        except Exception as e:
            return _encode(_outcome(job, e))
        finally:
            _detach_trace(token)
        return _encode(_outcome(job, None, result))

    def _prepare(self, raw: dict, report: Optional[Callable[[str], None]] = None,
                 cancel: Optional[threading.Event] = None,
                 ) -> Union[dict, tuple[JobContext, _Task]]:
        """The job (its progress reports going to `report`, cancelled by setting
        `cancel`) and its task, or the answer to a job no task takes."""
        name = raw.get("task")
        task = self._tasks.get(name) if isinstance(name, str) else None
        if task is None:
            known = ", ".join(self._tasks) or "none"
            what = f"unknown task {name!r}" if name is not None else "job has no task"
            return _failed(f"{what}; this handler runs: {known}", retry=False)
        attempt = raw.get("attempt")
        job_id = raw.get("id")
        job = JobContext(id=job_id if isinstance(job_id, str) else None,
                         attempt=attempt if isinstance(attempt, int) else 1,
                         task=name, data=raw.get("data"), raw=raw,
                         _cancel=cancel if cancel is not None else threading.Event(),
                         _report=report)
        return job, task

    def _run_coroutine(self, awaitable: Any) -> Any:
        # One event loop for the whole process, so clients made in one job
        # (bound to the loop) still work in the next.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

        async def wrapped() -> Any:
            return await awaitable

        return self._loop.run_until_complete(wrapped())

    def run(self) -> None:
        """Answers the worker's job lines until stdin closes.

        stdout is the protocol's: the process keeps a private copy of it and
        points fd 1 and `sys.stdout` at stderr, so a stray `print`, a C
        extension or a subprocess cannot write into it. stdin likewise: jobs
        are read from a private copy and fd 0 is /dev/null, so a subprocess
        cannot swallow the next job.

        With `WORKERPOOL_JOBS_PER_CHILD` unset or 1, one job at a time, in
        turn; the process says it accepts cancel lines, and a producer's cancel
        of the running job sets its `job.cancelled`. Above 1 (k), k jobs at
        once on an asyncio event loop in this thread: `async def` tasks run
        concurrently on the loop, and plain `def` tasks on a pool of k
        threads. Threads suit blocking I/O (a
        socket wait or a `time.sleep` releases the GIL); CPU-bound Python
        holds the GIL, so it wants one child per core and one job each, the
        worker's default. Each answer names its job's id and is written as
        its task ends, so a quick job never waits behind a slow one. A
        cancel line from the worker cancels an `async def` task
        (`asyncio.CancelledError`); a thread cannot be stopped, so a `def`
        task runs to its end (it may poll `job.cancelled`). When stdin
        closes, the jobs in hand are finished and answered before `run()`
        returns. A task's `job.progress()` reports are written as they come,
        each before its job's answer.
        """
        if not self._tasks:
            raise ConfigError("the App has no tasks: add some with @app.task(\"name\")")
        out_fd = os.dup(1)
        in_fd = os.dup(0)
        os.dup2(2, 1)
        # After the switch: what earlier prints left in the buffer goes to stderr too.
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdout = sys.stderr
        sys.stdin = open(os.devnull)
        if not logging.getLogger().handlers and not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
        k = _jobs_per_child()
        log.info("handler ready: pid %d, tasks %s%s", os.getpid(), ", ".join(self._tasks),
                 f", {k} jobs at once" if k > 1 else "")
        try:
            if k > 1:
                from ._mux import serve

                self._loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self._loop)
                serve(self, self._loop, in_fd, out_fd, k)
            else:
                self._serve_in_turn(in_fd, out_fd)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None
            os.close(out_fd)


    def _serve_in_turn(self, in_fd: int, out_fd: int) -> None:
        """One job at a time: a reader thread reads stdin, handing each job line
        here in order and setting the running job's cancel on a cancel line."""
        sys.stderr.flush()
        _write_all(out_fd, ACCEPTS_LINE)
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        reader = threading.Thread(target=_read_in_turn, args=(in_fd, out_fd, jobs),
                                  name="workerpool-stdin", daemon=True)
        reader.start()
        while True:
            item = jobs.get()
            if item is None:
                break
            line, parsed, out = item
            out.answer(self._handle(line, out.progress, parsed, out.cancel))


def _parse_line(line: bytes) -> tuple:
    """A line as JSON: `(value, None)`, or `(None, why not)`."""
    try:
        return json.loads(line), None
    except (ValueError, UnicodeDecodeError) as e:
        return None, e


def _read_in_turn(in_fd: int, out_fd: int, jobs: queue.SimpleQueue) -> None:
    """The reader thread of the one-job protocol: each job line goes to `jobs`
    with its parse and its `_InTurn`; a cancel line (`{"cancel": id}`, no "id")
    sets the cancel of the job read last, the one running (the worker sends the
    next job only after its answer), when it names it. None at the end."""
    latest: Optional[_InTurn] = None
    try:
        with os.fdopen(in_fd, "rb", buffering=1 << 16) as lines:
            for line in lines:
                raw, error = _parse_line(line)
                if (error is None and isinstance(raw, dict) and "id" not in raw
                        and isinstance(raw.get("cancel"), str)):
                    if latest is not None and latest.job_id == raw["cancel"]:
                        if not latest.cancel.is_set():
                            log.info("job %s: cancelled by a producer", raw["cancel"])
                        latest.cancel.set()
                    else:
                        log.debug("cancel for job %s, which is not running: ignored",
                                  raw["cancel"])
                    continue
                job_id = raw.get("id") if isinstance(raw, dict) else None
                latest = _InTurn(out_fd, job_id)
                jobs.put((line, (raw, error), latest))
    except Exception as e:  # stdin broke: as good as closed
        log.warning("reading stdin failed: %s", e)
    finally:
        jobs.put(None)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
