"""job.progress(value): a progress line before the job's answer, in both exec
protocols, driven through pipes as the worker would (tests/apps/mux_app.py)."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest
from test_mux import MuxApp

from workerpool_client import App, InvalidProgress, WorkerpoolError

LIMIT = json.loads((files("workerpool_client") / "contract.json").read_text(
    encoding="utf-8"))["outcomes"]["max_progress_bytes"]
#: The first line of a process taking one job at a time: it reads stdin while a job runs.
ACCEPTS = {"accepts": ["cancel"]}


@pytest.mark.parametrize("task", ["progress", "async_progress"])
def test_one_job_at_a_time_progress_lines_come_before_the_answer(task):
    with MuxApp(None) as app:
        assert app.answer() == ACCEPTS
        app.send({"attempt": 1, "id": "a", "task": task,
                  "data": {"values": [10, {"done": 2, "of": 3}, "é"]}})
        assert app.answer() == {"progress": 10}
        assert app.answer() == {"progress": {"done": 2, "of": 3}}
        assert app.answer() == {"progress": "é"}
        assert app.answer() == {"ok": True, "result": "reported"}
        # The next job's lines follow the first's answer.
        app.send({"attempt": 1, "id": "b", "task": task, "data": {"values": [1]}})
        assert app.answer() == {"progress": 1}
        assert app.answer() == {"ok": True, "result": "reported"}
        assert app.close() == 0
    # One line each, with no "ok" and no id in a progress line; ASCII, as answers are.
    assert app.raw[1] == b'{"progress": 10}\n'
    assert app.raw[3] == b'{"progress": "\\u00e9"}\n'


@pytest.mark.parametrize("task", ["progress", "async_progress"])
def test_many_jobs_at_once_progress_lines_name_their_job_before_its_answer(task):
    with MuxApp("8") as app:
        for i in range(4):
            app.job(f"j{i}", task, {"values": [i, i + 1]})
        lines = [app.answer() for _ in range(12)]
        assert app.close() == 0
    for i in range(4):
        mine = [line for line in lines if line["id"] == f"j{i}"]
        assert mine == [{"id": f"j{i}", "progress": i}, {"id": f"j{i}", "progress": i + 1},
                        {"id": f"j{i}", "ok": True, "result": "reported"}]
    assert all(raw.startswith(b'{"id": ') for raw in app.raw)


@pytest.mark.parametrize("k", [None, "4"])
def test_a_report_from_a_thread_the_task_started_comes_before_the_answer(k):
    with MuxApp(k) as app:
        if k is None:
            assert app.answer() == ACCEPTS
        app.job("t", "progress_from_a_thread", {"value": [1, 2]})
        first, second = app.answer(), app.answer()
        assert app.close() == 0
    head = {} if k is None else {"id": "t"}
    assert first == {**head, "progress": [1, 2]}
    assert second == {**head, "ok": True}


@pytest.mark.parametrize("k", [None, "4"])
def test_an_oversized_progress_raises_in_the_task_and_sends_nothing(k):
    with MuxApp(k) as app:
        if k is None:
            assert app.answer() == ACCEPTS
        app.job("big", "progress_too_big", {"size": LIMIT})  # "x"*LIMIT is LIMIT + 2 bytes
        answer = app.answer()
        app.job("fits", "progress_too_big", {"size": LIMIT - 2})
        fits = [app.answer(), app.answer()]
        assert app.close() == 0
    assert answer["ok"] is False and "progress" not in answer
    assert "InvalidProgress" in answer["error"]
    assert f"{LIMIT + 2} bytes of JSON, over the limit of {LIMIT}" in answer["error"]
    assert "progress" in fits[0] and len(json.dumps(fits[0]["progress"])) == LIMIT
    assert fits[1]["ok"] is True


def test_progress_checks_its_value_and_handle_sends_it_nowhere():
    app = App()
    seen = []

    @app.task("t")
    def t(data, job):
        job.progress({"n": 1})
        for bad in ({1, 2}, float("nan"), "x" * LIMIT):
            try:
                job.progress(bad)
            except InvalidProgress as e:
                assert isinstance(e, (ValueError, WorkerpoolError))
                seen.append(str(e))
        return len(seen)

    assert json.loads(app.handle(b'{"task":"t","id":"x"}')) == {"ok": True, "result": 3}
    assert "cannot be written as JSON" in seen[0] and "cannot be written as JSON" in seen[1]
    assert "over the limit" in seen[2] and "nothing was sent" in seen[2]
