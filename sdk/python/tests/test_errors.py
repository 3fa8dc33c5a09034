"""Every bad input gets the library's own exception with a message saying what to fix."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from support import free_port

import workerpool_client as wp
from workerpool_client import Client, Job


@pytest.mark.parametrize("name, says", [
    ("", "non-empty and without white space"),
    ("my queue", "non-empty and without white space"),
    ("emails:retry", "is the retry set of the queue 'emails'"),
    ("emails:stats:dead", "is a counter of the queue 'emails'"),
    ("emails:dead:old", "would share the keys of the queue 'emails' \\(emails:dead:…\\)"),
    ("a:b:dead:x", "rename it, for example 'a-b-dead-x'"),
    (7, "must be a string"),
])
def test_bad_queue_names_are_refused_as_the_workers_refuse_them(redis_server, r, name, says):
    with Client(redis_server.url) as client:
        with pytest.raises(wp.InvalidQueue, match=says):
            client.enqueue(name, "t")
        with pytest.raises(wp.InvalidQueue):
            client.enqueue_many(name, [Job("t")])
    assert isinstance(wp.InvalidQueue("x"), wp.WorkerpoolError)


class Unserialisable:
    pass


def circular():
    d: dict = {}
    d["self"] = d
    return d


@pytest.mark.parametrize("kwargs, says", [
    ({"data": Unserialisable()}, "cannot be written as JSON.*Unserialisable"),
    ({"data": {1, 2}}, "cannot be written as JSON.*set"),
    ({"data": {"x": math.nan}}, "NaN and infinities have no JSON form"),
    ({"data": [math.inf]}, "NaN and infinities"),
    ({"data": circular()}, "circular reference"),
    ({"data": "\ud800"}, "lone surrogate"),
    ({"unique_key": "k", "unique_for": 0}, "unique_for must be above 0"),
    ({"unique_key": "k", "unique_for": -5}, "unique_for must be above 0"),
    ({"unique_key": "k", "unique_for": 1.5}, "whole number of seconds"),
    ({"unique_key": "k", "unique_for": "60"}, "unique_for must be whole seconds"),
    ({"unique_for": 60}, "unique_for is set without unique_key"),
    ({"unique_key": ""}, "unique_key must be a non-empty string"),
    ({"delay": 5, "run_at": datetime.now(timezone.utc)}, "not both"),
    ({"delay": -1}, "delay must not be negative"),
    ({"delay": "5s"}, "delay must be seconds"),
    ({"delay": math.inf}, "finite"),
    ({"run_at": datetime(2030, 1, 1)}, "has no time zone"),
    ({"run_at": 1767225600000}, "run_at must be a datetime"),
    ({"id": ""}, "id must be a non-empty string"),
    ({"id": 42}, "id must be a non-empty string"),
])
def test_bad_jobs_are_refused_before_anything_is_sent(redis_server, r, queue, kwargs, says):
    with Client(redis_server.url) as client:
        with pytest.raises(wp.InvalidJob, match=says):
            client.enqueue(queue, "t", **kwargs)
    assert r.exists(queue, f"{queue}:scheduled", f"{queue}:unique") == 0


def test_a_whole_float_or_timedelta_unique_for_is_written_as_whole_seconds(redis_server, r,
                                                                           queue):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "t", unique_key="a", unique_for=60.0)
        client.enqueue(queue, "t", unique_key="b", unique_for=timedelta(minutes=2))
    import json
    assert [json.loads(p)["unique_for"] for p in r.lrange(queue, 0, -1)] == [120, 60]


@pytest.mark.parametrize("task", ["", None, 3])
def test_a_task_must_be_named(redis_server, queue, task):
    with Client(redis_server.url) as client, pytest.raises(wp.InvalidJob, match="task must be"):
        client.enqueue(queue, task)


def test_one_bad_job_of_many_enqueues_none_and_is_named(redis_server, r, queue):
    with Client(redis_server.url) as client:
        with pytest.raises(wp.InvalidJob, match=r"job 2: unknown field 'priority'.*nothing was"):
            client.enqueue_many(queue, [Job("t"), {"task": "t", "priority": 1}])
        with pytest.raises(wp.InvalidJob, match=r"job 3: data cannot be written as JSON.*"
                                                r"nothing was enqueued"):
            client.enqueue_many(queue, [Job("t"), Job("t"), Job("t", object())])
        with pytest.raises(wp.InvalidJob, match="job 1: task is missing"):
            client.enqueue_many(queue, [{"data": 1}])
        with pytest.raises(wp.InvalidJob, match="job 1: must be a Job or a dict"):
            client.enqueue_many(queue, ["t"])
        with pytest.raises(wp.InvalidJob, match="jobs must be a list"):
            client.enqueue_many(queue, Job("t"))
    assert r.llen(queue) == 0


def test_an_unreachable_redis_is_a_connection_error_without_the_password():
    url = f"redis://app:s3cret@127.0.0.1:{free_port()}/0"
    with Client(url, timeout=2) as client:
        with pytest.raises(wp.ConnectionError) as e:
            client.enqueue("q", "t")
    assert "cannot reach Redis at redis://app:***@127.0.0.1" in str(e.value)
    assert "s3cret" not in str(e.value)
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, wp.WorkerpoolError)


def test_a_wrong_password_says_to_check_the_credentials(tmp_path):
    from support import RedisServer
    server = RedisServer("--requirepass", "right")
    try:
        with Client(f"redis://:wrong@127.0.0.1:{server.port}") as client:
            with pytest.raises(wp.ConnectionError, match="check the user and password"):
                client.enqueue("q", "t")
        with Client(f"redis://:right@127.0.0.1:{server.port}") as client:
            assert client.enqueue("q", "t")
    finally:
        server.stop()


def test_a_key_of_the_wrong_type_is_a_redis_error_and_changes_nothing(redis_server, r, queue):
    r.set(queue, "not a list")
    with Client(redis_server.url) as client:
        with pytest.raises(wp.RedisError, match="WRONGTYPE"):
            client.enqueue(queue, "t")
        # Through the script: the contract's guard names the key and changes nothing.
        with pytest.raises(wp.RedisError, match=f"WRONGTYPE key {queue} holds a string"):
            client.enqueue(queue, "t", unique_key="k")
    assert r.exists(f"{queue}:unique") == 0


@pytest.mark.parametrize("url, options, says", [
    ("http://localhost", {}, "unsupported Redis URL"),
    ("localhost:6379", {}, "unsupported Redis URL"),
    ("", {}, "non-empty string"),
    ("redis://", {}, "names no host"),
    ("redis://h:99999", {}, "bad Redis URL"),
    ("redis://h", {"ca": "/x/ca.pem"}, "TLS options need rediss://"),
    ("redis://h", {"insecure_skip_verify": True}, "TLS options need rediss://"),
    ("rediss://h", {"cert": "c.pem"}, "needs both cert= and key="),
    ("rediss://h", {"ca": "/no/such/ca.pem"}, "ca file '/no/such/ca.pem' does not exist"),
    ("redis+sentinel://h1,h2", {}, "names no primary"),
    ("redis+sentinel://h1/my master", {}, "may hold only letters"),
    ("redis+sentinel://h1/mymaster/x", {}, "must be a number"),
    ("redis+sentinel://h1:0x1/mymaster", {}, "bad port"),
    ("redis+sentinel://h1,,h2/mymaster", {}, "empty sentinel address"),
    ("redis+sentinel://h1/mymaster?password=x", {}, "unknown parameter 'password'"),
    ("redis+sentinel://h1/mymaster", {"cluster": True}, "never a Redis Cluster"),
    ("redis://h", {"cluster": "yes"}, "cluster must be True, False or None"),
    ("redis://h", {"timeout": 0}, "timeout must be a number of seconds above 0"),
])
def test_bad_urls_and_options_are_refused_at_construction(url, options, says):
    with pytest.raises(wp.ConfigError, match=says):
        Client(url, **options)
    with pytest.raises(wp.ConfigError, match=says):
        wp.AsyncClient(url, **options)


def test_a_closed_client_says_so(redis_server, queue):
    client = Client(redis_server.url)
    client.enqueue(queue, "t")
    client.close()
    with pytest.raises(wp.WorkerpoolError, match="is closed; make a new one"):
        client.enqueue(queue, "t")
    assert "redis://127.0.0.1" in repr(client)
