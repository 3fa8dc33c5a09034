"""Enqueues the six jobs of the mini project:

    python3 -m mini.producer redis://localhost:6379 mini
"""

from __future__ import annotations

import sys

from workerpool_client import Client, Job


def six_jobs(ms: int = 500) -> list:
    """Three emails and three reports, alternating; seq is the order given."""
    jobs = []
    for seq in range(6):
        if seq % 2 == 0:
            jobs.append(Job("email", {"seq": seq, "to": f"user{seq}@example.com", "ms": ms}))
        else:
            jobs.append(Job("report", {"seq": seq, "day": f"2026-12-0{seq}", "ms": ms}))
    return jobs


def enqueue_six(url: str, queue: str, ms: int = 500) -> list:
    with Client(url) as client:
        return client.enqueue_many(queue, six_jobs(ms))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 -m mini.producer REDIS_URL QUEUE")
    for job_id in enqueue_six(sys.argv[1], sys.argv[2]):
        print(job_id)
