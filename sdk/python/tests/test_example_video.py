"""The video platform's transcode (examples/video-platform/python) end to end:
the real worker runs transcode.py (simulated, no ffmpeg), produce.py enqueues
with keep, follows `status` and ends with `wait`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support import ROOT, Worker, python_env

from workerpool_client import Client

EXAMPLE = ROOT / "examples" / "video-platform" / "python"
#: The worker learns of a producer's cancel at its heartbeat.
FAST = ("--heartbeat-interval", "200ms")


def env(out: Path) -> dict:
    e = python_env()
    e.update(TRANSCODE_SIMULATE="1", TRANSCODE_OUT=str(out), TRANSCODE_STEP_SECONDS="0.1")
    return e


def worker(url: str, queue: str, out: Path) -> Worker:
    # The README's command, as the transcode pool runs it: one job per process.
    return Worker(url, [queue], [sys.executable, str(EXAMPLE / "transcode.py")],
                  concurrency=1, extra=FAST, env=env(out))


def produce(url: str, queue: str, src: str, *renditions: str) -> list:
    args = [sys.executable, str(EXAMPLE / "produce.py"), "--redis", url, "--queue", queue,
            "--src", src, "--timeout", "30"]
    for r in renditions:
        args += ["--rendition", r]
    return args


def progress(lines: list) -> list:
    return [int(m.group(1)) for m in (re.fullmatch(r"progress (\d+)% \d+p", x) for x in lines)
            if m]


def test_a_transcode_reports_progress_and_its_outputs(redis_server, queue, tmp_path):
    src = tmp_path / "movie.mp4"
    src.write_bytes(b"not really a video")
    with worker(redis_server.url, queue, tmp_path / "out") as w:
        run = subprocess.run(produce(redis_server.url, queue, str(src), "720p", "480p", "360p"),
                             capture_output=True, text=True, env=python_env(), timeout=40)
        log = w.read_log()
    lines = run.stdout.splitlines()
    assert run.returncode == 0, f"{run.stdout}{run.stderr}\nworker: {log[-3000:]}"
    assert re.fullmatch(r"[0-9a-f]{32}", lines[0])
    pcts = progress(lines)
    assert len(pcts) >= 2 and pcts == sorted(set(pcts)), lines
    assert re.fullmatch(r"done in [0-9.]+ s: 3 output\(s\)", lines[-4]), lines
    outputs = [Path(x.strip()) for x in lines[-3:]]
    assert [p.name for p in outputs] == ["movie-720p.mp4", "movie-480p.mp4", "movie-360p.mp4"]
    assert all(p.is_file() and p.parent == tmp_path / "out" / lines[0] for p in outputs)
    with Client(redis_server.url) as client:
        status = client.status(queue, lines[0])
    assert status.state == "done" and status.result["outputs"] == [str(p) for p in outputs]
    # The latest report the worker wrote (at most one every 500 ms: not always the 100%).
    assert status.progress["rendition"] in ("720p", "480p", "360p")


def test_a_missing_src_is_dead_at_once(redis_server, queue, tmp_path):
    with worker(redis_server.url, queue, tmp_path / "out"):
        run = subprocess.run(produce(redis_server.url, queue, str(tmp_path / "nope.mp4")),
                             capture_output=True, text=True, env=python_env(), timeout=40)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"dead: src not found: {tmp_path / 'nope.mp4'}"


def test_a_cancel_stops_a_running_transcode_between_steps(redis_server, queue, tmp_path):
    src = tmp_path / "long.mp4"
    src.write_bytes(b"")
    renditions = [f"{h}p" for h in range(100, 2100, 100)]  # 20 x 0.5 s: 10 s if not cancelled
    with worker(redis_server.url, queue, tmp_path / "out") as w, \
            Client(redis_server.url) as client:
        proc = subprocess.Popen(produce(redis_server.url, queue, str(src), *renditions),
                                stdout=subprocess.PIPE, text=True, env=python_env())
        try:
            job_id = proc.stdout.readline().strip()
            first = proc.stdout.readline()
            assert first.startswith("progress "), first
            assert client.cancel(queue, job_id) == {"did": "requested", "state": "running"}
            rest, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
            proc.wait()
        log = w.read_log()
        status = client.status(queue, job_id)
    assert proc.returncode == 1, f"{first}{rest}\nworker: {log[-3000:]}"
    last = rest.splitlines()[-1]
    assert re.fullmatch(r"cancelled: Cancelled: cancelled at \d+%", last), rest
    assert status.state == "cancelled" and status.cancel_requested_at_ms
    at = int(re.search(r"(\d+)%", last).group(1))
    assert at < 50, f"stopped at {at}%, long after the cancel"
    made = list((tmp_path / "out" / job_id).iterdir())
    assert len(made) < len(renditions)
