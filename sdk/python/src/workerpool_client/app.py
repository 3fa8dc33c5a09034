"""The exec handler: `App` runs tasks for `workerpool-worker --handler exec`.

The worker writes one job per line on the process's stdin and reads one
answer per line on its stdout: `{"ok":true}`, `{"ok":false,"error":…}`
(retried) or `{"ok":false,"error":…,"retry":false}` (dead-lettered).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .errors import ConfigError, Permanent

log = logging.getLogger("workerpool_client")


@dataclass(frozen=True)
class JobContext:
    """The job a task runs: what the worker handed over."""

    id: Optional[str]
    attempt: int
    task: str
    data: Any
    raw: dict = field(repr=False)


@dataclass
class _Task:
    fn: Callable[..., Any]
    wants_job: bool


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


def _answer(ok: bool, error: str = "", retry: bool = True) -> bytes:
    if ok:
        return b'{"ok":true}\n'
    out: dict = {"ok": False, "error": error}
    if not retry:
        out["retry"] = False
    # ensure_ascii: the line holds no raw newline or odd byte, whatever the error says.
    return (json.dumps(out, ensure_ascii=True) + "\n").encode("ascii")


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
        `(data, job)`; it may be `async def`.
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
            self._tasks[task_name] = _Task(fn, _wants_job(fn, task_name))
            return fn

        return register

    def handle(self, line: bytes) -> bytes:
        """The answer line to one job line (what `run()` does with each line)."""
        try:
            raw = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            return _answer(False, f"malformed job line, not JSON ({e}): {line[:200]!r}",
                           retry=False)
        if not isinstance(raw, dict):
            return _answer(False, f"malformed job line: a job is a JSON object, got "
                                  f"{type(raw).__name__}", retry=False)
        name = raw.get("task")
        task = self._tasks.get(name) if isinstance(name, str) else None
        if task is None:
            known = ", ".join(self._tasks) or "none"
            what = f"unknown task {name!r}" if name is not None else "job has no task"
            return _answer(False, f"{what}; this handler runs: {known}", retry=False)
        attempt = raw.get("attempt")
        job_id = raw.get("id")
        job = JobContext(id=job_id if isinstance(job_id, str) else None,
                         attempt=attempt if isinstance(attempt, int) else 1,
                         task=name, data=raw.get("data"), raw=raw)
        token = _attach_trace(raw)
        try:
            result = task.fn(job.data, job) if task.wants_job else task.fn(job.data)
            if inspect.isawaitable(result):
                self._run_coroutine(result)
        except Permanent as e:
            return _answer(False, str(e) or "permanent failure", retry=False)
        except Exception as e:
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning("task %s (job %s, attempt %s) failed: %s", name, job.id, job.attempt,
                        message)
            return _answer(False, f"{message}\n{traceback.format_exc()}".rstrip())
        finally:
            _detach_trace(token)
        return _answer(True)

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
        log.info("handler ready: pid %d, tasks %s", os.getpid(), ", ".join(self._tasks))
        try:
            with os.fdopen(in_fd, "rb", buffering=1 << 16) as jobs:
                for line in jobs:
                    answer = self.handle(line)
                    sys.stderr.flush()
                    _write_all(out_fd, answer)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None
            os.close(out_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
