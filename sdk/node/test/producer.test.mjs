// The producer against a real redis-server: the envelope, delays, unique
// jobs (released by the real worker), one round trip for many jobs, and the
// enqueue script being the very one the Rust CLI loads.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { Client } from '../index.mjs';
import { cli, commandCalls, eventually, raw, startRedis, startWorker } from './helpers.mjs';

let server;
let redis;
let client;

async function serverMs() {
  const [s, us] = await redis.time();
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
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

describe('envelope', () => {
  test('a job gets a 32-hex id and ends with id and enqueued_at on the Redis clock', async () => {
    const data = { to: 'a@example.com', text: 'héllo 😀 "quoted"\n', n: [1, -2.5, 9007199254740991], nested: { a: [] } };
    const t0 = await serverMs();
    const id = await client.enqueue('env', 'send_email', data);
    const t1 = await serverMs();
    assert.match(id, /^[0-9a-f]{32}$/);
    const [payload] = await redis.lrange('env', 0, -1);
    const job = JSON.parse(payload);
    assert.deepEqual(Object.keys(job), ['task', 'data', 'id', 'enqueued_at']);
    assert.equal(job.task, 'send_email');
    assert.deepEqual(job.data, data);
    assert.equal(job.id, id);
    // The Redis clock as the client keeps it (an offset read from the middle
    // of a TIME round trip, in whole ms): a little slack for rounding, as in
    // the Python client's test.
    assert.ok(job.enqueued_at >= t0 - 5 && job.enqueued_at <= t1 + 5, `enqueued_at ${job.enqueued_at} not in [${t0}, ${t1}] ± 5`);
    assert.ok(payload.endsWith(`,"id":"${id}","enqueued_at":${job.enqueued_at}}`), payload);
  });

  test('a given id is kept, data left out is absent, and jobs are FIFO for the worker', async () => {
    assert.equal(await client.enqueue('fifo', 'a', undefined, { id: 'order-1' }), 'order-1');
    await client.enqueue('fifo', 'b', null);
    // Workers take from the right: the first enqueued is the last element.
    const [second, first] = (await redis.lrange('fifo', 0, -1)).map((p) => JSON.parse(p));
    assert.deepEqual(first, { task: 'a', id: 'order-1', enqueued_at: first.enqueued_at });
    assert.equal(second.task, 'b');
    assert.equal(second.data, null);
  });

  test('ids are fresh each time', async () => {
    const ids = await client.enqueueMany('fresh', Array.from({ length: 200 }, () => ({ task: 't' })));
    assert.equal(new Set(ids).size, 200);
    for (const id of ids) {
      assert.match(id, /^[0-9a-f]{32}$/);
    }
  });
});

describe('delayed jobs', () => {
  test('delay puts the job in <q>:scheduled scored by run_at = now + delay on the Redis clock', async () => {
    const t0 = await serverMs();
    const id = await client.enqueue('later', 'remind', { x: 1 }, { delay: 60000 });
    const t1 = await serverMs();
    assert.equal(await redis.llen('later'), 0);
    const [payload, score] = await redis.zrange('later:scheduled', 0, -1, 'WITHSCORES');
    const job = JSON.parse(payload);
    assert.equal(job.id, id);
    assert.equal(Number(score), job.run_at);
    assert.equal(job.run_at - job.enqueued_at, 60000);
    assert.ok(job.run_at >= t0 + 60000 - 5 && job.run_at <= t1 + 60000 + 5, `run_at ${job.run_at} vs [${t0}, ${t1}] + 60000 ± 5`);
    assert.deepEqual(Object.keys(job).slice(-2), ['id', 'enqueued_at']);
  });

  test('runAt as a Date or unix ms is the score exactly', async () => {
    const at = new Date(Date.UTC(2030, 0, 1, 12, 0, 0, 123));
    await client.enqueue('at', 'a', null, { runAt: at });
    await client.enqueue('at', 'b', null, { runAt: at.getTime() + 1 });
    const rows = await redis.zrange('at:scheduled', 0, -1, 'WITHSCORES');
    assert.equal(JSON.parse(rows[0]).task, 'a');
    assert.equal(Number(rows[1]), at.getTime());
    assert.equal(JSON.parse(rows[2]).task, 'b');
    assert.equal(Number(rows[3]), at.getTime() + 1);
  });

  test('a delayed job runs once its time has come (the real worker)', async () => {
    const id = await client.enqueue('{soon}', 't', null, { delay: 300 });
    const worker = await startWorker(server.url, ['--queue', '{soon}', '--handler', 'noop']);
    try {
      await eventually('the delayed job to be processed', async () => (await redis.get('{soon}:stats:processed')) === '1');
      assert.equal(await redis.zcard('{soon}:scheduled'), 0);
    } finally {
      await worker.stop();
    }
    assert.match(id, /^[0-9a-f]{32}$/);
  });
});

describe('unique jobs', () => {
  test('a duplicate is refused (null) while the first holds the key, another key goes in', async () => {
    const t0 = await serverMs();
    const first = await client.enqueue('uq', 'report', { day: 1 }, { uniqueKey: 'daily', uniqueFor: 120 });
    assert.match(first, /^[0-9a-f]{32}$/);
    assert.equal(await client.enqueue('uq', 'report', { day: 1 }, { uniqueKey: 'daily' }), null);
    const other = await client.enqueue('uq', 'report', { day: 2 }, { uniqueKey: 'weekly' });
    assert.match(other, /^[0-9a-f]{32}$/);
    assert.equal(await redis.llen('uq'), 2);
    assert.deepEqual(await redis.hgetall('uq:unique'), { daily: first, weekly: other });
    const till = Number(await redis.zscore('uq:unique:expiry', 'daily'));
    assert.ok(till >= t0 + 120000 && till <= (await serverMs()) + 120000, `hold ends at ${till}`);
    const weekly = Number(await redis.zscore('uq:unique:expiry', 'weekly'));
    assert.ok(weekly - till > 3400000, 'the default hold is an hour');
    const job = JSON.parse((await redis.lrange('uq', -1, -1))[0]);
    assert.deepEqual(Object.keys(job), ['task', 'data', 'unique_key', 'unique_for', 'id', 'enqueued_at']);
    assert.equal(job.unique_key, 'daily');
    assert.equal(job.unique_for, 120);
  });

  test('the key is released once the job is done, and accepted again', async () => {
    const q = '{uniq-done}';
    const first = await client.enqueue(q, 'report', null, { uniqueKey: 'k' });
    assert.equal(await client.enqueue(q, 'report', null, { uniqueKey: 'k' }), null);
    const worker = await startWorker(server.url, ['--queue', q, '--handler', 'noop']);
    try {
      await eventually('the unique job to be done and its key freed', async () =>
        (await redis.get(`${q}:stats:processed`)) === '1' && (await redis.hlen(`${q}:unique`)) === 0);
    } finally {
      await worker.stop();
    }
    const again = await client.enqueue(q, 'report', null, { uniqueKey: 'k' });
    assert.match(again, /^[0-9a-f]{32}$/);
    assert.notEqual(again, first);
  });

  test('a delayed unique job goes to <q>:scheduled through the script', async () => {
    const id = await client.enqueue('uql', 't', null, { uniqueKey: 'x', delay: 5000 });
    assert.equal(await redis.zcard('uql:scheduled'), 1);
    assert.equal(await client.enqueue('uql', 't', null, { uniqueKey: 'x' }), null);
    assert.equal(await redis.hget('uql:unique', 'x'), id);
  });

  test('the enqueue script is byte for byte the one the workerpool CLI loads (same SHA1)', async () => {
    await redis.script('FLUSH');
    cli(['enqueue', '--redis-url', server.url, '--queue', 'sha', '{"task":"t","unique_key":"s"}']);
    const loaded = await redis.script('EXISTS', ...(await shaOfClient()));
    assert.deepEqual(loaded, [1]);
  });
});

async function shaOfClient() {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const { script } = require('../src/lua.js');
  const { sha, source } = script('enqueue.lua');
  assert.equal(crypto.createHash('sha1').update(source).digest('hex'), sha);
  return [sha];
}

describe('enqueueMany', () => {
  test('plain jobs: one LPUSH for the lot, in order, nothing else sent', async () => {
    await client.enqueue('warm', 't'); // connected, clock measured
    const before = await commandCalls(redis);
    const { result: ids, sent } = await watching(() =>
      client.enqueueMany('many', Array.from({ length: 50 }, (_, i) => ({ task: 't', data: i }))));
    const delta = diff(before, await commandCalls(redis));
    assert.deepEqual(delta, { lpush: 1 }, `commands run: ${JSON.stringify(delta)}`);
    assert.deepEqual(sent, ['lpush']);
    const list = (await redis.lrange('many', 0, -1)).reverse().map((p) => JSON.parse(p));
    assert.deepEqual(list.map((j) => j.data), Array.from({ length: 50 }, (_, i) => i));
    assert.deepEqual(list.map((j) => j.id), ids);
  });

  test('one enqueue is one command: LPUSH, ZADD when delayed, EVALSHA when unique', async () => {
    await client.enqueue('single', 't', null, { uniqueKey: 'warm' }); // connected, clock read, script loaded
    for (const [options, command] of [[{}, 'lpush'], [{ delay: 10 }, 'zadd'], [{ uniqueKey: 'one' }, 'evalsha']]) {
      const { result: id, sent } = await watching(() => client.enqueue('single', 't', { n: 1 }, options));
      assert.match(id, /^[0-9a-f]{32}$/);
      assert.deepEqual(sent, [command], `enqueue with ${JSON.stringify(options)}`);
    }
  });

  test('with unique jobs: one EVALSHA for the lot, duplicates null in place', async () => {
    await client.enqueue('many-u', 't', null, { uniqueKey: 'warm' }); // script loaded
    const before = await commandCalls(redis);
    const { result: ids, sent } = await watching(() => client.enqueueMany('many-u', [
      { task: 't', uniqueKey: 'a' },
      { task: 't', uniqueKey: 'a' },
      { task: 't' },
      { task: 't', uniqueKey: 'warm' },
      { task: 't', uniqueKey: 'b', delay: 1000 },
    ]));
    // commandstats also counts the commands the script runs inside Redis;
    // of those the client sends, MONITOR says which.
    const delta = diff(before, await commandCalls(redis));
    assert.equal(delta.evalsha, 1, `commands run: ${JSON.stringify(delta)}`);
    for (const other of ['eval', 'script', 'multi']) {
      assert.equal(delta[other], undefined, `commands run: ${JSON.stringify(delta)}`);
    }
    assert.deepEqual(sent, ['evalsha']);
    assert.equal(ids[1], null);
    assert.equal(ids[3], null);
    for (const i of [0, 2, 4]) {
      assert.match(ids[i], /^[0-9a-f]{32}$/);
    }
    assert.equal(await redis.llen('many-u'), 3);
    assert.equal(await redis.zcard('many-u:scheduled'), 1);
  });

  test('past 500 jobs: one command per 500 in one pipeline, order kept across them', async () => {
    const jobs = Array.from({ length: 1201 }, (_, i) => ({ task: 't', data: i }));
    const plain = await watching(() => client.enqueueMany('big', jobs));
    assert.deepEqual(plain.sent, ['lpush', 'lpush', 'lpush']);
    const list = (await redis.lrange('big', 0, -1)).reverse().map((p) => JSON.parse(p).data);
    assert.deepEqual(list, jobs.map((j) => j.data));
    const unique = await watching(() => client.enqueueMany('big-u', jobs.map((j) => ({ ...j, uniqueKey: `k${j.data % 600}` }))));
    assert.deepEqual(unique.sent, ['evalsha', 'evalsha', 'evalsha']);
    assert.equal(unique.result.filter((id) => id !== null).length, 600);
    assert.ok(unique.result.slice(600).every((id) => id === null), 'the second of each key is refused, across chunks');
    const mixed = await watching(() => client.enqueueMany('big-m', [{ task: 'a' }, { task: 'b', delay: 1000 }, { task: 'c' }]));
    assert.deepEqual(mixed.sent, ['lpush', 'zadd']);
  });

  test('a script flushed from the server is loaded again (EVAL) and the jobs go in once', async () => {
    await redis.script('FLUSH');
    const ids = await client.enqueueMany('reload', [{ task: 't', uniqueKey: 'r' }, { task: 't', uniqueKey: 'r' }]);
    assert.equal(ids[1], null);
    assert.equal(await redis.llen('reload'), 1);
  });

  test('one bad job: nothing is enqueued, the error names the job', async () => {
    await assert.rejects(
      client.enqueueMany('bad-many', [{ task: 'ok' }, { task: 'x', uniqueFor: 5 }]),
      (e) => e.name === 'InvalidJobError' && /^job 2: uniqueFor is set without uniqueKey/.test(e.message) && /nothing was enqueued/.test(e.message),
    );
    assert.equal(await redis.exists('bad-many'), 0);
    assert.deepEqual(await client.enqueueMany('bad-many', []), []);
  });
});

/**
 * Runs `fn` under MONITOR; returns its result and the commands clients
 * other than this test's own sent meanwhile (not those scripts ran).
 */
async function watching(fn) {
  const monitor = await redis.monitor();
  const seen = [];
  const marker = `marker-${crypto.randomUUID()}`;
  let done;
  const flushed = new Promise((r) => (done = r));
  monitor.on('monitor', (_time, args, source) => {
    if (args[0].toLowerCase() === 'echo' && args[1] === marker) {
      done();
    } else if (source !== 'lua' && args[0].toLowerCase() !== 'info') {
      seen.push(args[0].toLowerCase());
    }
  });
  try {
    const result = await fn();
    await redis.echo(marker);
    await flushed;
    return { result, sent: seen };
  } finally {
    monitor.disconnect();
  }
}

function diff(before, afterCalls) {
  const out = {};
  for (const [name, n] of Object.entries(afterCalls)) {
    // INFO reads the counts; MONITOR and ECHO are the test's own watch.
    if (!['info', 'monitor', 'echo'].includes(name) && n !== (before[name] ?? 0)) {
      out[name] = n - (before[name] ?? 0);
    }
  }
  return out;
}
