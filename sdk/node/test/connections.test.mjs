// The URL forms the worker takes: rediss:// with a private CA and with
// mutual TLS (certificates made by openssl here), and a 3-node Redis
// Cluster, detected or forced, with hash-tagged queue names.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import Redis from 'ioredis';
import { Client, ConnectionError, InvalidQueueError } from '../index.mjs';
import { eventually, raw, startCluster, startRedis, startSentinel, startTlsRedis, startWorker } from './helpers.mjs';

describe('TLS', () => {
  let plain;
  let mutual;
  before(async () => {
    [plain, mutual] = await Promise.all([startTlsRedis({ mutual: false }), startTlsRedis({ mutual: true })]);
  });
  after(async () => {
    await Promise.all([plain?.stop(), mutual?.stop()]);
  });

  function reader(server) {
    const { ca, cert, key } = server.certs;
    return new Redis(server.url, {
      maxRetriesPerRequest: 1,
      tls: { ca: fs.readFileSync(ca), cert: fs.readFileSync(cert), key: fs.readFileSync(key) },
    });
  }

  test('rediss:// with a private CA', async () => {
    const c = new Client(plain.url, { ca: plain.certs.ca });
    const r = reader(plain);
    try {
      const id = await c.enqueue('secure', 't', { n: 1 });
      assert.equal(JSON.parse(await r.lindex('secure', 0)).id, id);
    } finally {
      await c.close();
      r.disconnect();
    }
  });

  test('a server certificate from an unknown CA is refused with the reason, unless verification is off', async () => {
    const c = new Client(plain.url);
    const insecure = new Client(plain.url, { insecureSkipVerify: true });
    try {
      await assert.rejects(c.enqueue('secure', 't'), (e) =>
        e instanceof ConnectionError && /cannot reach Redis at rediss:\/\/127\.0\.0\.1:\d+: .*(self-signed|issuer|certificate)/i.test(e.message));
      assert.match(await insecure.enqueue('secure', 't'), /^[0-9a-f]{32}$/);
    } finally {
      await c.close();
      await insecure.close();
    }
  });

  test('mutual TLS: with the client certificate it works, without it the server refuses', async () => {
    const { ca, cert, key } = mutual.certs;
    const c = new Client(mutual.url, { ca, cert, key });
    const without = new Client(mutual.url, { ca });
    const r = reader(mutual);
    try {
      const id = await c.enqueue('mtls', 't', null, { uniqueKey: 'u' });
      assert.equal(await r.hget('mtls:unique', 'u'), id);
      await assert.rejects(without.enqueue('mtls', 't'), ConnectionError);
    } finally {
      await c.close();
      await without.close();
      r.disconnect();
    }
  });

  test('the worker runs what the client enqueued over TLS', async () => {
    const { ca, cert, key } = mutual.certs;
    const c = new Client(mutual.url, { ca, cert, key });
    const r = reader(mutual);
    const worker = await startWorker(mutual.url, ['--queue', 'tls-run', '--handler', 'noop',
      '--redis-ca-file', ca, '--redis-client-cert', cert, '--redis-client-key', key]);
    try {
      await c.enqueueMany('tls-run', [{ task: 'a' }, { task: 'b' }]);
      await eventually('two jobs done over TLS', async () => (await r.get('tls-run:stats:processed')) === '2');
    } finally {
      await worker.stop();
      await c.close();
      r.disconnect();
    }
  });
});

describe('Redis Cluster', () => {
  let cluster;
  let reader;
  before(async () => {
    cluster = await startCluster();
    reader = new Redis.Cluster([{ host: '127.0.0.1', port: cluster.nodes[1].port }]);
  });
  after(async () => {
    reader?.disconnect();
    await cluster?.stop();
  });

  test('detected from INFO cluster: hash-tagged queues work, untagged ones are refused', async () => {
    // Each node in turn, so the queue's slot is on another node for some.
    for (const node of cluster.nodes) {
      const c = new Client(node.url);
      try {
        const ids = await c.enqueueMany('{mail}:high', [
          { task: 'a' },
          { task: 'b', uniqueKey: `k-${node.port}` },
          { task: 'c', uniqueKey: `k-${node.port}` },
          { task: 'd', delay: 60000 },
        ]);
        assert.equal(c.isCluster, true);
        assert.equal(ids[2], null);
        assert.match(await c.enqueue('{mail}:low', 't', { port: node.port }), /^[0-9a-f]{32}$/);
        await assert.rejects(c.enqueue('mail', 't'), (e) =>
          e instanceof InvalidQueueError && /Redis is a cluster and queue mail has no hash tag.*for example \{mail\}/.test(e.message));
        await assert.rejects(c.enqueue('mail:high', 't'), /for example \{mail\}:high/);
      } finally {
        await c.close();
      }
    }
    assert.equal(await reader.llen('{mail}:high'), 6);
    assert.equal(await reader.zcard('{mail}:high:scheduled'), 3);
    assert.equal(await reader.hlen('{mail}:high:unique'), 3);
    assert.equal(await reader.llen('{mail}:low'), 3);
  });

  test('cluster: true forces the cluster client; the worker runs the jobs', async () => {
    const c = new Client(cluster.nodes[2].url, { cluster: true });
    const worker = await startWorker(cluster.url, ['--queue', '{run}', '--handler', 'noop']);
    try {
      await c.enqueueMany('{run}', Array.from({ length: 5 }, (_, i) => ({ task: 't', data: i })));
      await c.enqueue('{run}', 't', null, { uniqueKey: 'once' });
      await eventually('six jobs done on the cluster', async () => (await reader.get('{run}:stats:processed')) === '6');
      assert.equal(await reader.hlen('{run}:unique'), 0);
    } finally {
      await worker.stop();
      await c.close();
    }
  });
});

describe('Redis Sentinel', () => {
  let primary;
  let sentinel;
  before(async () => {
    primary = await startRedis();
    sentinel = await startSentinel(primary.port, 'mymaster');
  });
  after(async () => {
    await sentinel?.stop();
    await primary?.stop();
  });

  test('redis+sentinel:// finds the primary through the sentinel', async () => {
    const c = new Client(`redis+sentinel://127.0.0.1:${sentinel.port}/mymaster/2`);
    const r = raw(`${primary.url}/2`);
    try {
      const id = await c.enqueue('via-sentinel', 't', null, { uniqueKey: 'k' });
      assert.equal(JSON.parse(await r.lindex('via-sentinel', 0)).id, id);
      assert.equal(await c.enqueue('via-sentinel', 't', null, { uniqueKey: 'k' }), null);
    } finally {
      await c.close();
      r.disconnect();
    }
  });

  test('a primary name the sentinels do not know is a ConnectionError', async () => {
    const c = new Client(`redis+sentinel://127.0.0.1:${sentinel.port}/nosuch`);
    try {
      await assert.rejects(c.enqueue('q', 't'), (e) => e instanceof ConnectionError
        && /cannot reach Redis at redis\+sentinel:\/\/127\.0\.0\.1:\d+\/nosuch: .*No such master/.test(e.message));
    } finally {
      await c.close();
    }
  });
});
