"""No-op tasks for Celery, Dramatiq and RQ, and a preloader for each."""
import os
import sys

REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")

from celery import Celery  # noqa: E402

celery_app = Celery("tasks", broker=REDIS)
celery_app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False)


@celery_app.task
def celery_noop(n):
    return None


import dramatiq  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402

dramatiq.set_broker(RedisBroker(url=REDIS))


@dramatiq.actor(max_retries=0)
def dramatiq_noop(n):
    return None


def rq_noop(n):
    return None


def preload(kind, jobs):
    if kind == "celery":
        for n in range(jobs):
            celery_noop.delay(n)
    elif kind == "dramatiq":
        for n in range(jobs):
            dramatiq_noop.send(n)
    elif kind == "rq":
        from redis import Redis
        from rq import Queue

        q = Queue("bench", connection=Redis.from_url(REDIS))
        for n in range(jobs):
            q.enqueue("tasks.rq_noop", n, result_ttl=0)


if __name__ == "__main__":
    preload(sys.argv[1], int(sys.argv[2]))
