"""The producer against a real redis-server: what lands in Redis, byte for byte."""

from __future__ import annotations

import calendar
import json
import re
import socket
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from workerpool_client import Client, Job

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def server_ms(r) -> int:
    s, us = r.time()
    return s * 1000 + us // 1000


def ordered(payload: bytes) -> list:
    return json.loads(payload, object_pairs_hook=lambda pairs: pairs)


def command_counts(r) -> dict:
    """Calls per command since the server started, but INFO (the reading itself)."""
    stats = r.info("commandstats")
    return {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


def delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


class Monitor:
    """The commands clients send, as MONITOR shows them (not those scripts run)."""

    LINE = re.compile(r'^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]*)"')

    def __init__(self, server) -> None:
        self.server = server

    def __enter__(self) -> Monitor:
        self.sock = socket.create_connection(("127.0.0.1", self.server.port))
        self.sock.sendall(b"MONITOR\r\n")
        self.buf = b""
        self._read_until(b"+OK\r\n")
        return self

    def _read_until(self, mark: bytes) -> None:
        self.sock.settimeout(10)
        while mark not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"MONITOR connection closed; saw {self.buf[-500:]!r}"
            self.buf += chunk

    def commands(self, r) -> list:
        """(client, command) of everything sent since entering, but from lua."""
        mark = f"monitor-mark-{uuid.uuid4().hex}"
        r.echo(mark)
        self._read_until(mark.encode())
        out = []
        for line in self.buf.decode(errors="replace").splitlines():
            m = self.LINE.match(line)
            if m and m.group(1) != "lua" and mark not in line:
                out.append((m.group(1), m.group(2).lower()))
        return out

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_enqueue_writes_id_and_enqueued_at_as_the_last_two_fields(redis_server, r, queue):
    before = server_ms(r)
    with Client(redis_server.url) as client:
        job_id = client.enqueue(queue, "send_email", {"to": "a@example.com", "n": [1, 2.5]})
    after = server_ms(r)
    assert HEX32.match(job_id), job_id
    [payload] = r.lrange(queue, 0, -1)
    fields = ordered(payload)
    assert [k for k, _ in fields] == ["task", "data", "id", "enqueued_at"], fields
    job = json.loads(payload)
    assert job["task"] == "send_email"
    assert job["data"] == {"to": "a@example.com", "n": [1, 2.5]}
    assert job["id"] == job_id
    # The Redis clock, as the Rust CLI writes it (a little slack for rounding).
    assert before - 5 <= job["enqueued_at"] <= after + 5, (before, job["enqueued_at"], after)
    # Compact JSON, the shape the taking script stamps without parsing.
    assert payload.endswith(f',"id":"{job_id}","enqueued_at":{job["enqueued_at"]}}}'.encode())
    assert b" " not in payload.replace(b"a@example.com", b"")


def test_a_given_id_is_kept_and_unicode_is_written_as_utf8(redis_server, r, queue):
    with Client(redis_server.url) as client:
        job_id = client.enqueue(queue, "t", {"s": "é😀\n\"x\""}, id="order-42")
    assert job_id == "order-42"
    [payload] = r.lrange(queue, 0, -1)
    assert "é😀".encode() in payload
    assert json.loads(payload)["data"] == {"s": "é😀\n\"x\""}
    assert json.loads(payload)["id"] == "order-42"


def test_data_none_leaves_the_field_out(redis_server, r, queue):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "t")
    [payload] = r.lrange(queue, 0, -1)
    assert [k for k, _ in ordered(payload)] == ["task", "id", "enqueued_at"]


def test_delay_lands_in_scheduled_scored_by_run_at_on_the_redis_clock(redis_server, r, queue):
    with Client(redis_server.url) as client:
        before = server_ms(r)
        a = client.enqueue(queue, "t", 1, delay=30)
        b = client.enqueue(queue, "t", 2, delay=timedelta(milliseconds=1500))
        after = server_ms(r)
    assert r.llen(queue) == 0
    scored = {json.loads(m)["id"]: (json.loads(m), int(s))
              for m, s in r.zrange(f"{queue}:scheduled", 0, -1, withscores=True)}
    job_a, score_a = scored[a]
    job_b, score_b = scored[b]
    assert before + 30_000 - 5 <= score_a <= after + 30_000 + 5, (before, score_a, after)
    assert before + 1_500 - 5 <= score_b <= after + 1_500 + 5, (before, score_b, after)
    assert job_a["run_at"] == score_a and job_b["run_at"] == score_b
    assert list(job_a)[-2:] == ["id", "enqueued_at"]


def test_run_at_lands_in_scheduled_with_its_exact_score(redis_server, r, queue):
    at = datetime(2031, 5, 4, 3, 2, 1, 987000, tzinfo=timezone.utc)
    with Client(redis_server.url) as client:
        job_id = client.enqueue(queue, "t", run_at=at)
    [(member, score)] = r.zrange(f"{queue}:scheduled", 0, -1, withscores=True)
    want = calendar.timegm((2031, 5, 4, 3, 2, 1)) * 1000 + 987
    assert int(score) == want
    assert json.loads(member)["run_at"] == want
    assert json.loads(member)["id"] == job_id


def test_unique_key_refuses_a_second_job_while_the_first_holds_it(redis_server, r, queue):
    with Client(redis_server.url) as client:
        first = client.enqueue(queue, "report", {"day": 1}, unique_key="daily", unique_for=60)
        second = client.enqueue(queue, "report", {"day": 2}, unique_key="daily")
        other = client.enqueue(queue, "report", {"day": 3}, unique_key="weekly")
    assert HEX32.match(first) and second is None and HEX32.match(other)
    payloads = [json.loads(p) for p in r.lrange(queue, 0, -1)]
    assert [p["data"]["day"] for p in payloads] == [3, 1]
    assert r.hget(f"{queue}:unique", "daily").decode() == first
    held = r.zscore(f"{queue}:unique:expiry", "daily")
    assert held > server_ms(r) + 55_000
    job = json.loads(r.lrange(queue, -1, -1)[0], object_pairs_hook=lambda p: p)
    assert [k for k, _ in job] == ["task", "data", "unique_key", "unique_for", "id",
                                   "enqueued_at"]
    # The default hold is an hour, and unique_for is then not written.
    assert "unique_for" not in payloads[0]
    assert r.zscore(f"{queue}:unique:expiry", "weekly") > server_ms(r) + 3_500_000


def test_enqueue_many_is_one_command_and_keeps_the_order(redis_server, r, queue):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "warm-up")  # connects and reads the clock
        r.delete(queue)
        before = command_counts(r)
        ids = client.enqueue_many(queue, [Job("t", i) for i in range(50)])
        after = command_counts(r)
        assert delta(before, after) == {"lpush": 1}, delta(before, after)
        assert len(set(ids)) == 50 and all(HEX32.match(i) for i in ids)
        # Workers take from the right: the first job given is the first taken.
        taken = [json.loads(r.rpop(queue)) for _ in range(50)]
        assert [j["data"] for j in taken] == list(range(50))
        assert [j["id"] for j in taken] == ids

        # With unique keys: one script call for the whole batch, warm or cold.
        r.script_flush()
        client.enqueue(queue, "warm-up", unique_key="w")  # loads the script again (SCRIPT LOAD)
        with Monitor(redis_server) as monitor:
            ids = client.enqueue_many(queue, [
                {"task": "t", "data": 1, "unique_key": "k"},
                {"task": "t", "data": 2, "unique_key": "k"},
                Job("t", 3),
                Job("t", 4, delay=60),
            ])
            sent = monitor.commands(r)
        assert [cmd for _, cmd in sent] == ["evalsha"], sent
    assert ids[1] is None and all(ids[i] for i in (0, 2, 3))
    waiting = [json.loads(p).get("data") for p in r.lrange(queue, 0, -1)]
    assert waiting == [3, 1, None], waiting
    [scheduled] = r.zrange(f"{queue}:scheduled", 0, -1)
    assert json.loads(scheduled)["id"] == ids[3]


def test_enqueue_many_of_now_and_later_jobs_is_one_pipeline(redis_server, r, queue):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "warm-up")
        r.delete(queue)
        before = command_counts(r)
        ids = client.enqueue_many(queue, [Job("t", 1), Job("t", 2, delay=5), Job("t", 3)])
        after = command_counts(r)
    assert delta(before, after) == {"lpush": 1, "zadd": 1}
    assert [json.loads(p)["id"] for p in r.lrange(queue, 0, -1)] == [ids[2], ids[0]]
    assert json.loads(r.zrange(f"{queue}:scheduled", 0, -1)[0])["id"] == ids[1]
    with Client(redis_server.url) as client:
        assert client.enqueue_many(queue, []) == []


def test_a_client_reads_the_server_clock_once_not_per_enqueue(redis_server, r, queue):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "t")
        before = command_counts(r)
        for _ in range(5):
            client.enqueue(queue, "t")
        after = command_counts(r)
    assert delta(before, after) == {"lpush": 5}


@pytest.mark.parametrize("payload", [{}, [], {"a": {"b": [[[{"c": None}]]]}}, -(2**53), 2**53,
                                     0.1, 1e300, "", True])
def test_data_round_trips(redis_server, r, queue, payload):
    with Client(redis_server.url) as client:
        client.enqueue(queue, "t", payload)
    assert json.loads(r.lrange(queue, 0, -1)[0])["data"] == payload


def documented_acl(user: str) -> list[str]:
    """The `ACL SETUSER` line docs/redis-acl.md gives for `user` (the queue `jobs`)."""
    page = Path(__file__).resolve().parents[3] / "docs" / "redis-acl.md"
    for line in page.read_text().splitlines():
        if line.startswith(f"ACL SETUSER {user} "):
            return line.split()
    raise AssertionError(f"docs/redis-acl.md gives no line for {user}")


def test_the_documented_acl_of_an_enqueueing_user_is_enough(redis_server, r):
    # docs/redis-acl.md, `workerpool enqueue`'s user, for the queue `jobs`.
    r.execute_command(*documented_acl("workerpool-cli-enqueue"))
    r.delete("jobs", "jobs:scheduled", "jobs:unique", "jobs:unique:expiry")
    r.script_flush()
    url = f"redis://workerpool-cli-enqueue:secret@127.0.0.1:{redis_server.port}"
    try:
        with Client(url) as client:
            assert client.enqueue("jobs", "t")
            assert client.enqueue("jobs", "t", delay=5)
            assert client.enqueue("jobs", "t", unique_key="k")
            assert client.enqueue_many("jobs", [Job("t", unique_key="k"), Job("t")])[0] is None
            kept = client.enqueue("jobs", "t", keep=60)
        assert r.llen("jobs") == 4 and r.zcard("jobs:scheduled") == 1
        assert r.hget(f"jobs:job:{kept}", "state") == b"waiting"
    finally:
        r.execute_command("ACL", "DELUSER", "workerpool-cli-enqueue")
        r.delete("jobs", "jobs:scheduled", "jobs:unique", "jobs:unique:expiry")
        r.delete(*r.keys("jobs:job:*") or ["jobs:job:none"])


def test_threads_share_one_client(redis_server, r, queue):
    from concurrent.futures import ThreadPoolExecutor

    with Client(redis_server.url) as client, ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: client.enqueue(queue, "t", i, unique_key=f"k{i % 10}"),
                            range(40)))
    # Ten keys: ten jobs got in, whichever threads won.
    assert sum(1 for i in ids if i) == 10 and r.llen(queue) == 10


def test_the_same_job_is_written_as_workerpool_enqueue_writes_it(redis_server, r, queue):
    from support import bin_dir

    cli = [str(bin_dir() / "workerpool"), "enqueue", "--redis-url", redis_server.url,
           "--queue", queue]
    jobs = [({"task": "t", "data": {"a": [1, "é"]}}, {}),
            ({"task": "t", "data": 1, "unique_key": "k", "unique_for": 60},
             {"unique_key": "k", "unique_for": 60})]
    with Client(redis_server.url) as client:
        for job, options in jobs:
            out = subprocess.run(cli + [json.dumps(job, ensure_ascii=False)],
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            rust = r.lpop(queue)
            r.delete(f"{queue}:unique", f"{queue}:unique:expiry")
            client.enqueue(queue, job["task"], job["data"], **options)
            python = r.lpop(queue)
            r.delete(f"{queue}:unique", f"{queue}:unique:expiry")
            strip = re.compile(rb'"id":"[0-9a-f]{32}","enqueued_at":\d+')
            # Byte for byte, but the id and the time.
            assert strip.sub(b"", rust) == strip.sub(b"", python), (rust, python)
