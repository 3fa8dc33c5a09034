"""TLS (a CA, mutual TLS) and a 3-node Redis Cluster with hash-tagged queues."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from support import (
    Certs,
    Cluster,
    RedisServer,
    Worker,
    eventually,
    python_env,
    python_handler,
    read_records,
)

import workerpool_client as wp
from workerpool_client import AsyncClient, Client, Job


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(certs):
    server = RedisServer(tls=certs)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mutual_server(certs):
    server = RedisServer(tls=certs, mutual=True)
    yield server
    server.stop()


def test_tls_with_a_private_ca(tls_server, certs, queue):
    with Client(tls_server.url, ca=certs.ca) as client:
        job_id = client.enqueue(queue, "t", {"over": "tls"}, unique_key="k")
    r = tls_server.client()
    assert json.loads(r.lrange(queue, 0, -1)[0])["id"] == job_id

    async def main():
        async with AsyncClient(tls_server.url, ca=str(certs.ca)) as client:
            return await client.enqueue(queue, "t")

    assert asyncio.run(main())
    assert r.llen(queue) == 2


def test_tls_refuses_a_server_certificate_the_ca_did_not_sign(tls_server, certs, queue):
    with Client(tls_server.url, ca=certs.other_ca, timeout=5) as client:
        with pytest.raises(wp.ConnectionError, match="certificate verify failed"):
            client.enqueue(queue, "t")
    # Not valid for the host name used: checked too.
    url = tls_server.url.replace("127.0.0.1", "127.0.0.2")
    with Client(url, ca=certs.ca, timeout=5) as client:
        with pytest.raises(wp.ConnectionError):
            client.enqueue(queue, "t")
    with Client(tls_server.url, insecure_skip_verify=True) as client:
        assert client.enqueue(queue, "t")


def test_mutual_tls_needs_the_client_certificate(mutual_server, certs, queue):
    with Client(mutual_server.url, ca=certs.ca, timeout=5) as client:
        with pytest.raises(wp.ConnectionError):
            client.enqueue(queue, "t")
    with Client(mutual_server.url, ca=certs.ca, cert=certs.client_cert,
                key=certs.client_key) as client:
        job_id = client.enqueue(queue, "t")
    assert json.loads(mutual_server.client().rpop(queue))["id"] == job_id


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def test_a_cluster_is_detected_and_a_hash_tagged_queue_works(cluster, tmp_path):
    tag = uuid.uuid4().hex[:8]
    high, low = f"{{{tag}}}:high", f"{{{tag}}}:low"
    rc = cluster.client()
    for node in cluster.nodes:
        node.client().script_flush()
    with Client(cluster.url) as client:
        a = client.enqueue(high, "record", {"n": 1})
        b = client.enqueue(high, "record", {"n": 2}, unique_key="k")
        assert client.enqueue(high, "record", {"n": 3}, unique_key="k") is None
        d = client.enqueue(high, "record", {"n": 4}, delay=3600)
        many = client.enqueue_many(low, [Job("record", 5), Job("record", 6, delay=3600),
                                         Job("record", 7, unique_key="u")])
        with pytest.raises(wp.InvalidQueue, match=r"has no hash tag.*for example '\{mail\}:high'"):
            client.enqueue("mail:high", "t")
    assert [json.loads(p)["id"] for p in rc.lrange(high, 0, -1)] == [b, a]
    assert json.loads(rc.zrange(f"{high}:scheduled", 0, -1)[0])["id"] == d
    assert [json.loads(p)["id"] for p in rc.lrange(low, 0, -1)] == [many[2], many[0]]

    async def main():
        async with AsyncClient(cluster.url) as client:
            # Another tag, likely another node: the script is loaded there first.
            other = f"{{{uuid.uuid4().hex[:8]}}}"
            assert await client.enqueue(other, "t", unique_key="k")
            assert await client.enqueue(other, "t", unique_key="k") is None
            ids = await client.enqueue_many(high, [Job("record", 8, unique_key="k2"),
                                                   Job("record", 9)])
            with pytest.raises(wp.InvalidQueue, match="has no hash tag"):
                await client.enqueue("plain", "t")
            return ids

    more = asyncio.run(main())
    assert rc.llen(high) == 4

    # The worker takes them from the cluster through the Python handler.
    record = tmp_path / "records.jsonl"
    env = python_env()
    env["HANDLER_RECORD"] = str(record)
    with Worker(cluster.url, [high], python_handler("handler_app"), env=env) as worker:
        eventually(lambda: len(read_records(record)) == 4, "4 jobs run from the cluster",
                   seen=lambda: (read_records(record), worker.read_log()[-2000:]))
    assert sorted(r["id"] for r in read_records(record)) == sorted([a, b, *more])
