"""Enqueues one transcode, follows its progress and prints how it ended.

    python3 examples/video-platform/python/produce.py --redis redis://localhost:6379 \
      --queue video:transcode --src movie.mp4 --rendition 720p --rendition 480p

Prints the job's id, then a line each time its progress changes (read with
`status` every 0.5 s), then the outcome from `wait`: the outputs of a done
job, the error of a dead or cancelled one. Exits 0 when the job is done, 1
otherwise (dead, cancelled, or not ended within --timeout seconds).
"""

from __future__ import annotations

import argparse
import sys
import time

from workerpool_client import Client, WaitTimeout

KEEP = 86400  # the outcome stays readable for a day after the job ends


def first_line(error: object) -> str:
    return str(error).splitlines()[0] if error else "(no error kept)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://localhost:6379")
    parser.add_argument("--queue", default="video:transcode")
    parser.add_argument("--src", required=True, help="the video: a path or a URL")
    parser.add_argument("--rendition", action="append", dest="renditions",
                        help="a height such as 720p; repeat for several (default 720p, 480p)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the job to end")
    args = parser.parse_args()
    data = {"src": args.src, "renditions": args.renditions or ["720p", "480p"]}
    deadline = time.monotonic() + args.timeout

    with Client(args.redis) as client:
        job_id = client.enqueue(args.queue, "transcode", data, keep=KEEP)
        print(job_id, flush=True)
        shown = None
        while time.monotonic() < deadline:
            status = client.status(args.queue, job_id)
            if status is None or status.final:
                break
            if status.state == "running" and status.progress is not None \
                    and status.progress != shown:
                shown = status.progress
                rendition = shown.get("rendition", "") if isinstance(shown, dict) else ""
                pct = shown.get("pct") if isinstance(shown, dict) else shown
                print(f"progress {pct}% {rendition}".rstrip(), flush=True)
            time.sleep(0.5)
        try:
            end = client.wait(args.queue, job_id, timeout=max(deadline - time.monotonic(), 0.1))
        except WaitTimeout as timeout:
            state = timeout.status.state if timeout.status else "unknown"
            print(f"not ended after {args.timeout:g} s (state {state})", flush=True)
            return 1

    if end.state == "done":
        result = end.result if isinstance(end.result, dict) else {}
        outputs = result.get("outputs", [])
        print(f"done in {result.get('seconds', '?')} s: {len(outputs)} output(s)")
        for path in outputs:
            print(f"  {path}")
        return 0
    print(f"{end.state}: {first_line(end.error)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
