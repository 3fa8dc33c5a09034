"""The multiplexed exec protocol (docs/worker.md, "Many jobs in one child"):
`App.run()` with `WORKERPOOL_JOBS_PER_CHILD` above 1.

A reader thread reads job lines from stdin and hands each to the event loop
(`call_soon_threadsafe`), so a line may be as long as a job (no stream
reader's line limit). Each job is an asyncio task: `async def` tasks are
awaited on the loop, plain `def` tasks run on a pool of k threads. Answers
are written by the loop's thread only, one whole line each, as each task
ends. `{"cancel":"<id>"}` (a timeout, or a producer's cancel) cancels the
asyncio task of that job; a task running on a thread cannot be stopped and is
answered when it ends. A task's progress reports are written by the loop's
thread too (a thread hands its report over), so each comes before its job's
answer, and one that comes after it is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from .app import (
    App,
    JobContext,
    _attach_trace,
    _detach_trace,
    _encode,
    _outcome,
    _progress_line,
    _Task,
    _write_all,
)

log = logging.getLogger("workerpool_client")

# The answer to a cancelled job: the worker has failed the attempt already and
# only frees the job's slot on it.
CANCELLED = "cancelled by the worker (the attempt passed its timeout)"


def serve(app: App, loop: asyncio.AbstractEventLoop, in_fd: int, out_fd: int, k: int) -> None:
    """Answers the job lines of `in_fd` on `out_fd`, k jobs at once, until `in_fd`
    closes and every job read has been answered."""
    pool = ThreadPoolExecutor(max_workers=k, thread_name_prefix="workerpool-task")
    mux = _Mux(app, pool, out_fd, k)
    try:
        loop.run_until_complete(mux.serve(in_fd))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


class _InHand:
    """A job in hand: its asyncio task, and whether it is on a thread now."""

    __slots__ = ("job", "task", "runner", "in_thread", "answered")

    def __init__(self, job: JobContext, task: _Task) -> None:
        self.job = job
        self.task = task
        self.runner: Optional[asyncio.Task] = None
        self.in_thread = False
        self.answered = False


def _shown(line: bytes) -> str:
    """A line for the log: escaped, cut at 200 characters."""
    line = line.rstrip(b"\n")
    return repr(line[:200]) + (f"… ({len(line)} bytes)" if len(line) > 200 else "")


class _Mux:
    def __init__(self, app: App, pool: ThreadPoolExecutor, out_fd: int, k: int) -> None:
        self._app = app
        self._pool = pool
        self._out_fd = out_fd
        self._k = k
        self._by_id: dict[str, _InHand] = {}
        self._running: set[_InHand] = set()
        self._eof = False
        self._error: Optional[BaseException] = None

    async def serve(self, in_fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # The worker never sends more than k jobs at once; the slots hold to k anyway.
        self._slots = asyncio.Semaphore(self._k)
        self._done = asyncio.Event()
        reader = threading.Thread(target=self._read, args=(in_fd,), name="workerpool-stdin",
                                  daemon=True)
        reader.start()
        await self._done.wait()
        if self._error is not None:
            raise self._error

    # The reader thread.

    def _read(self, in_fd: int) -> None:
        try:
            with os.fdopen(in_fd, "rb", buffering=1 << 16) as lines:
                for line in lines:
                    self._loop.call_soon_threadsafe(self._on_line, line)
        except Exception as e:  # stdin broke: as good as closed
            log.warning("reading stdin failed: %s", e)
        finally:
            try:
                self._loop.call_soon_threadsafe(self._on_eof)
            except RuntimeError:
                pass  # the loop is closed: run() has ended already

    # The loop's thread from here on.

    def _on_line(self, line: bytes) -> None:
        try:
            raw = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("dropped a line that is not JSON (%s): %s", e, _shown(line))
            return
        if not isinstance(raw, dict):
            log.warning("dropped a line that is not a JSON object: %s", _shown(line))
            return
        if "id" not in raw and isinstance(raw.get("cancel"), str):
            self._cancel(raw["cancel"])
            return
        job_id = raw.get("id")
        if not isinstance(job_id, str):
            log.warning("dropped a job line without a string id (it cannot be answered): %s",
                        _shown(line))
            return
        # The entry the job's progress reports belong to, once it exists.
        held: list = []
        prepared = self._app._prepare(raw, lambda text: self._progress(held, text))
        if isinstance(prepared, dict):
            self._write(job_id, prepared)
            return
        entry = _InHand(*prepared)
        held.append(entry)
        if job_id in self._by_id:
            log.warning("job %s arrived while one with its id is in hand", job_id)
        self._by_id[job_id] = entry
        self._running.add(entry)
        entry.runner = self._loop.create_task(self._run(entry))
        entry.runner.add_done_callback(functools.partial(self._finish, entry))

    def _cancel(self, job_id: str) -> None:
        entry = self._by_id.get(job_id)
        if entry is None:
            log.debug("cancel for job %s, which is not in hand: ignored", job_id)
            return
        entry.job._cancel.set()
        if entry.in_thread:
            log.warning("task %s (job %s) was cancelled, but it runs on a thread, which "
                        "cannot be stopped: it is answered when it ends", entry.job.task, job_id)
        else:
            assert entry.runner is not None
            if entry.runner.cancel():
                log.info("task %s (job %s) cancelled by the worker", entry.job.task, job_id)
            else:
                log.debug("cancel for job %s, which has just ended: ignored", job_id)

    def _progress(self, held: list, text: str) -> None:
        """A progress report of the job in `held`, from the task: written now on
        the loop's thread, handed to it from any other."""
        if threading.get_ident() == self._loop_thread:
            self._write_progress(held, text)
            return
        try:
            self._loop.call_soon_threadsafe(self._write_progress, held, text)
        except RuntimeError:
            pass  # the loop is closed: the job was answered long ago

    def _write_progress(self, held: list, text: str) -> None:
        if not held or held[0].answered:
            log.debug("a progress report after its job was answered: dropped")
            return
        job_id = held[0].job.id
        assert job_id is not None
        self._write_line(_progress_line(text, job_id))

    def _on_eof(self) -> None:
        self._eof = True
        self._check_done()

    async def _run(self, entry: _InHand) -> dict:
        job, task = entry.job, entry.task
        async with self._slots:
            try:
                if task.is_async:
                    result = await self._await_traced(job, task.call(job))
                else:
                    entry.in_thread = True
                    try:
                        # run_in_executor does not carry contextvars to the thread.
                        result = await self._loop.run_in_executor(
                            self._pool, contextvars.copy_context().run, _call_traced, entry)
                    finally:
                        entry.in_thread = False
                    if inspect.isawaitable(result):  # a def that returns a coroutine
                        result = await self._await_traced(job, result)
            except Exception as e:
                return _outcome(job, e)
            return _outcome(job, None, result)

    @staticmethod
    async def _await_traced(job: JobContext, result: Any) -> Any:
        token = _attach_trace(job.raw)
        try:
            if inspect.isawaitable(result):
                return await result
            return result
        finally:
            _detach_trace(token)

    def _finish(self, entry: _InHand, runner: asyncio.Task) -> None:
        job_id = entry.job.id
        assert job_id is not None
        self._running.discard(entry)
        entry.answered = True
        if self._by_id.get(job_id) is entry:
            del self._by_id[job_id]
        if runner.cancelled():
            out = {"ok": False, "error": CANCELLED}
        elif runner.exception() is not None:
            out = _outcome(entry.job, runner.exception())
        else:
            out = runner.result()
        self._write(job_id, out)
        self._check_done()

    def _write(self, job_id: str, out: dict) -> None:
        self._write_line(_encode({"id": job_id, **out}))

    def _write_line(self, line: bytes) -> None:
        if self._error is not None:
            return
        sys.stderr.flush()
        try:
            _write_all(self._out_fd, line)
        except OSError as e:  # the worker is gone: nothing can be answered any more
            self._error = e
            self._done.set()

    def _check_done(self) -> None:
        if self._eof and not self._running:
            self._done.set()


def _call_traced(entry: _InHand) -> Any:
    """A def task on its thread, inside the attempt's span."""
    token = _attach_trace(entry.job.raw)
    try:
        return entry.task.call(entry.job)
    finally:
        _detach_trace(token)
