"""The video platform's transcode handler: one `App` task, `transcode`.

    workerpool-worker --redis-url redis://localhost:6379 --queue video:transcode \
      --handler exec -- python3 examples/video-platform/python/transcode.py

A job's data is {"src": <a path or URL>, "renditions": ["720p", "480p", ...]}.
Each rendition is made in turn: with ffmpeg on PATH and `src` a local file,
`ffmpeg -y -i src -vf scale=-2:H out` (H from "720p"); otherwise (a URL, no
ffmpeg, or TRANSCODE_SIMULATE=1) a few short sleeps and a small file in place
of the video. The task reports {"pct": n, "rendition": r} as it goes and
returns {"outputs": [paths...], "seconds": elapsed}, the job's result.

Outputs go to $TRANSCODE_OUT/<job id>/ (default: a folder under the system's
temp dir). A missing `src` fails for good (Permanent: dead-lettered at once).
A producer's cancel (`Client.cancel`) is seen between steps (and stops a
running ffmpeg), and the task then fails with "cancelled at N%", which ends
the job `cancelled`, with one job per process (the pool's `concurrency: 1`)
as with several.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from workerpool_client import App, Permanent

app = App()

#: Steps and seconds per step of a simulated rendition.
SIM_STEPS = 5
SIM_STEP_SECONDS = float(os.environ.get("TRANSCODE_STEP_SECONDS", "0.1"))


class Cancelled(RuntimeError):
    """The job was cancelled while it ran."""


def out_dir(job_id: str) -> Path:
    base = os.environ.get("TRANSCODE_OUT") or os.path.join(tempfile.gettempdir(),
                                                           "video-transcode")
    path = Path(base) / job_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def height(rendition: object) -> int:
    match = re.fullmatch(r"([1-9][0-9]{1,3})p", rendition) if isinstance(rendition, str) else None
    if match is None:
        raise Permanent(f"rendition {rendition!r} is not a height such as \"720p\"")
    return int(match.group(1))


def is_url(src: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", src) is not None


def simulate(src: str, rendition: str, out: Path, step: Callable[[float], None],
             cancelled: Callable[[], bool]) -> None:
    """A stand-in for ffmpeg: SIM_STEPS short sleeps, then a small file."""
    for i in range(SIM_STEPS):
        if cancelled():
            return
        time.sleep(SIM_STEP_SECONDS)
        step((i + 1) / SIM_STEPS)
    out.write_text(f"simulated {rendition} rendition of {src}\n")


def probe_seconds(src: str) -> Optional[float]:
    """The source's duration from ffprobe, for progress within a rendition."""
    if shutil.which("ffprobe") is None:
        return None
    try:
        out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration",
                              "-of", "csv=p=0", src], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=30)
        return float(out.stdout.strip()) or None
    except (ValueError, subprocess.SubprocessError):
        return None


def ffmpeg(src: str, h: int, out: Path, duration: Optional[float],
           step: Callable[[float], None], cancelled: Callable[[], bool]) -> None:
    """ffmpeg -y -i src -vf scale=-2:H out, reporting from its -progress lines
    and stopped when the job is cancelled. Its stdout (the progress) is a pipe
    of ours, so it never writes on the worker's protocol."""
    cmd = ["ffmpeg", "-nostdin", "-y", "-loglevel", "error", "-i", src, "-vf",
           f"scale=-2:{h}", "-progress", "pipe:1", "-nostats", str(out)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if cancelled():
            proc.kill()
            break
        key, _, value = line.strip().partition("=")
        if key == "out_time_us" and duration and value.isdigit():
            step(min(int(value) / 1e6 / duration, 1.0))
    err = proc.stderr.read()
    if proc.wait() != 0 and not cancelled():
        raise RuntimeError(f"ffmpeg exited with {proc.returncode}: {err[-2000:]}")


@app.task("transcode")
def transcode(data, job):
    started = time.monotonic()
    if not isinstance(data, dict) or not isinstance(data.get("src"), str) or not data["src"]:
        raise Permanent("data.src is missing: the path or URL of the video")
    src = data["src"]
    renditions = data.get("renditions") or ["720p", "480p"]
    if not isinstance(renditions, list):
        raise Permanent("data.renditions is not a list such as [\"720p\", \"480p\"]")
    heights = [height(r) for r in renditions]
    if not is_url(src) and not os.path.isfile(src):
        raise Permanent(f"src not found: {src}")
    real = (os.environ.get("TRANSCODE_SIMULATE") != "1" and not is_url(src)
            and shutil.which("ffmpeg") is not None)
    duration = probe_seconds(src) if real else None
    where = out_dir(job.id or "local")
    stem = Path(src.rstrip("/")).stem or "video"
    pct = 0
    outputs = []
    job.progress({"pct": 0, "rendition": renditions[0]})
    for i, (rendition, h) in enumerate(zip(renditions, heights)):
        out = where / f"{stem}-{rendition}.mp4"

        def step(fraction: float, i: int = i, rendition: str = rendition) -> None:
            nonlocal pct
            pct = int(100 * (i + fraction) / len(renditions))
            job.progress({"pct": pct, "rendition": rendition})

        if real:
            ffmpeg(src, h, out, duration, step, lambda: job.cancelled)
        else:
            simulate(src, rendition, out, step, lambda: job.cancelled)
        if job.cancelled:
            raise Cancelled(f"cancelled at {pct}%")
        step(1.0)
        outputs.append(str(out))
        print(f"job {job.id}: {rendition} -> {out}", file=sys.stderr)
    return {"outputs": outputs, "seconds": round(time.monotonic() - started, 3)}


if __name__ == "__main__":
    app.run()
