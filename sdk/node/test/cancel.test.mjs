// keepResultFor writes the outcome `waiting` / `scheduled` at enqueue, and
// cancel() (the queue contract's cancel.lua) removes a job that waits,
// against a real redis-server (no worker needed).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { Client, InvalidJobError, InvalidQueueError } from '../index.mjs';
import { SDK, raw, startRedis } from './helpers.mjs';

const facts = JSON.parse(fs.readFileSync(path.join(SDK, 'contract.json'), 'utf8')).outcomes;

let server;
let redis;
let client;
let n = 0;

/** A queue of its own for each test. */
function queue() {
  n += 1;
  return `cancel-${process.pid}-${n}`;
}

before(async () => {
  server = await startRedis();
  redis = raw(server.url);
  client = new Client(server.url);
});

after(async () => {
  await client.close();
  redis.disconnect();
  await server.stop();
});

test('a kept job is waiting or scheduled from the moment it is enqueued', async () => {
  const q = queue();
  const now = await client.enqueue(q, 't', { n: 1 }, { keepResultFor: 60 });
  const later = await client.enqueue(q, 't', undefined, { delay: 30000, keepResultFor: 1.5 });
  const plain = await client.enqueue(q, 't');
  const waiting = await client.status(q, now);
  assert.equal(waiting.state, 'waiting');
  assert.equal(waiting.nextAtMs, null);
  assert.ok(waiting.updatedAtMs > 0);
  const scheduled = await client.status(q, later);
  assert.equal(scheduled.state, 'scheduled');
  const [payload] = await redis.zrange(`${q}:scheduled`, 0, 0);
  assert.equal(scheduled.nextAtMs, JSON.parse(payload).run_at);
  assert.equal(await client.status(q, plain), null);
  assert.equal(await redis.hget(`${q}:job:${now}`, 'keep'), '60000');
  assert.equal(await redis.hget(`${q}:job:${later}`, 'keep'), '1500');
  const ids = await client.enqueueMany(q, [{ task: 't', keepResultFor: 5 }, { task: 't' }]);
  assert.equal((await client.status(q, ids[0])).state, 'waiting');
  assert.equal(await client.status(q, ids[1]), null);
  const order = (await redis.lrange(q, 0, -1)).map((p) => JSON.parse(p).id).reverse();
  assert.deepEqual(order, [now, plain, ...ids]);
});

test('cancel of a waiting job removes it, and a wait on it resolves cancelled', async () => {
  const q = queue();
  const kept = await client.enqueue(q, 't', null, { keepResultFor: 60 });
  const other = await client.enqueue(q, 't', null, { keepResultFor: 60 });
  const plain = await client.enqueue(q, 't');
  assert.equal(await redis.llen(q), 3);
  const waiting = client.wait(q, kept, { timeoutMs: 20000 });
  await new Promise((resolve) => setTimeout(resolve, 200));
  const started = Date.now();
  assert.deepEqual(await client.cancel(q, kept), { did: 'removed', from: 'waiting' });
  const status = await waiting;
  assert.ok(Date.now() - started < 3000);
  assert.equal(status.state, 'cancelled');
  assert.ok(status.endedAtMs > 0 && status.cancelRequestedAtMs > 0);
  assert.equal(await redis.llen(q), 2);
  assert.deepEqual(await client.status(q, kept), status);
  assert.deepEqual(await client.wait(q, kept, { timeoutMs: 1000 }), status);
  // Without keepResultFor: cancelled too, its outcome kept a day.
  assert.deepEqual(await client.cancel(q, plain), { did: 'removed', from: 'waiting' });
  assert.equal((await client.status(q, plain)).state, 'cancelled');
  const ttl = await redis.pttl(`${q}:job:${plain}`);
  const day = facts.cancelled_keep_seconds * 1000;
  assert.ok(ttl > day - 60000 && ttl <= day, String(ttl));
  assert.deepEqual(await client.cancel(q, kept), { did: 'final', state: 'cancelled' });
  assert.deepEqual((await redis.lrange(q, 0, -1)).map((p) => JSON.parse(p).id), [other]);
});

test('cancel of a scheduled job removes it from the scheduled set', async () => {
  const q = queue();
  const job = await client.enqueue(q, 't', null, { delay: 60000, keepResultFor: 60 });
  const plain = await client.enqueue(q, 't', null, { delay: 60000 });
  assert.equal(await redis.zcard(`${q}:scheduled`), 2);
  assert.deepEqual(await client.cancel(q, job), { did: 'removed', from: 'scheduled' });
  assert.deepEqual(await client.cancel(q, plain), { did: 'removed', from: 'scheduled' });
  assert.equal(await redis.zcard(`${q}:scheduled`), 0);
  const status = await client.status(q, job);
  assert.equal(status.state, 'cancelled');
  assert.equal(status.nextAtMs, null);
});

test('cancel of a retrying job removes it from the retry set', async () => {
  const q = queue();
  await redis.zadd(`${q}:retry`, 1e13, JSON.stringify({ task: 't', id: 'again', attempt: 1 }));
  assert.deepEqual(await client.cancel(q, 'again'), { did: 'removed', from: 'retrying' });
  assert.equal(await redis.zcard(`${q}:retry`), 0);
});

test('cancel of a unique job frees its key for a new job', async () => {
  const q = queue();
  const first = await client.enqueue(q, 't', null, { uniqueKey: 'daily', keepResultFor: 60 });
  assert.equal(await client.enqueue(q, 't', null, { uniqueKey: 'daily' }), null);
  assert.deepEqual(await client.cancel(q, first), { did: 'removed', from: 'waiting' });
  assert.equal(await redis.hget(`${q}:unique`, 'daily'), null);
  const second = await client.enqueue(q, 't', null, { uniqueKey: 'daily' });
  assert.ok(second);
  assert.equal(await redis.hget(`${q}:unique`, 'daily'), second);
});

test('cancel of an unknown job, a done one and a running one', async () => {
  const q = queue();
  await redis.hset(`${q}:job:d`, 'state', 'done', 'result', '1');
  await redis.hset(`${q}:job:x`, 'state', 'dead', 'error', 'boom');
  await redis.hset(`${q}:job:run`, 'state', 'running', 'attempt', '1', 'worker', 'w');
  assert.deepEqual(await client.cancel(q, 'nope'), { did: 'unknown' });
  assert.deepEqual(await client.cancel(q, 'd'), { did: 'final', state: 'done' });
  assert.deepEqual(await client.cancel(q, 'x'), { did: 'final', state: 'dead' });
  assert.deepEqual(await client.cancel(q, 'run'), { did: 'requested', state: 'running' });
  const status = await client.status(q, 'run');
  assert.equal(status.state, 'running');
  assert.ok(status.cancelRequestedAtMs > 0);
  assert.equal(await redis.exists(`${q}:job:nope`), 0);
  await assert.rejects(client.cancel(q, ''), InvalidJobError);
  await assert.rejects(client.cancel('a:stats', 'x'), InvalidQueueError);
});

test('cancel loads the script when the server has forgotten it', async () => {
  const q = queue();
  const id = await client.enqueue(q, 't');
  await redis.script('FLUSH');
  assert.deepEqual(await client.cancel(q, id), { did: 'removed', from: 'waiting' });
});

test('status reads progress and the cancel request', async () => {
  const q = queue();
  await redis.hset(`${q}:job:p`, 'state', 'running', 'progress', '{"done":3}', 'progress_at', '12', 'cancel_requested', '13');
  await redis.hset(`${q}:job:r`, 'state', 'running', 'progress', 'not json');
  const p = await client.status(q, 'p');
  assert.deepEqual([p.progress, p.progressAtMs, p.cancelRequestedAtMs], [{ done: 3 }, 12, 13]);
  const r = await client.status(q, 'r');
  assert.equal(r.progress, 'not json');
  assert.equal(r.progressAtMs, null);
});
