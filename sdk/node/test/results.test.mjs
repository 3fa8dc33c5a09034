// Results and waiting: keepResultFor on enqueue, status() and wait() through
// the real worker (one job per child, then several jobs in one child), wait
// waking on the job's end stream rather than polling, and the App's answers
// with a result.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { App, Client, InvalidJobError, WaitTimeout } from '../index.mjs';
import { SDK, commandCalls, eventually, raw, startCluster, startRedis, startWorker } from './helpers.mjs';

const RESULTS = path.join(SDK, 'test', 'fixtures', 'results.mjs');
const contract = JSON.parse(fs.readFileSync(path.join(SDK, 'contract.json'), 'utf8')).outcomes;

/** The key of `form` (contract.json) for job `id` of `queue`. */
function key(form, queue, id) {
  return form.replace('{queue}', queue).replace('{id}', id);
}

let server;
let redis;
let client;

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

/** The end-to-end cases under a worker started with `args`, on queue `q`. */
function throughTheWorker(name, q, args) {
  describe(name, () => {
    let worker;
    before(async () => {
      worker = await startWorker(server.url, ['--queue', q, ...args, '--max-attempts', '3',
        '--backoff-base', '10ms', '--backoff-max', '20ms', '--handler', 'exec', '--', process.execPath, RESULTS]);
    });
    after(async () => {
      await worker?.stop();
    });

    test('a kept job is done with its result: enqueue keeps it, status and wait read it', async () => {
      const id = await client.enqueue(q, 'double', { n: 21 }, { keepResultFor: 60 });
      const payload = await redis.lindex(q, 0);
      if (payload !== null) {
        assert.match(payload, new RegExp(`"${contract.keep_field}":60`));
      }
      const status = await client.wait(q, id, { timeoutMs: 15000 });
      assert.equal(status.id, id);
      assert.equal(status.state, 'done');
      assert.deepEqual(status.result, { doubled: 42 });
      assert.equal(status.attempt, 1);
      assert.equal(typeof status.worker, 'string');
      assert.equal(status.error, null);
      assert.equal(status.resultError, null);
      assert.ok(status.endedAtMs > 0 && status.updatedAtMs > 0);
      assert.deepEqual(await client.status(q, id), status);
      const ttl = await redis.ttl(key(contract.outcome_key, q, id));
      assert.ok(ttl > 0 && ttl <= 60, `the outcome expires within its keep, ttl ${ttl}`);
      assert.equal(await redis.xlen(key(contract.outcome_end_key, q, id)), 1);
    }, { timeout: 30000 });

    test('a job that returns nothing is done without a result', async () => {
      const id = await client.enqueue(q, 'nothing', null, { keepResultFor: 60 });
      const status = await client.wait(q, id, { timeoutMs: 15000 });
      assert.equal(status.state, 'done');
      assert.equal(status.result, undefined);
    }, { timeout: 30000 });

    test('a BigInt result leaves the job done without it', async () => {
      const id = await client.enqueue(q, 'bigint', null, { keepResultFor: 60 });
      const status = await client.wait(q, id, { timeoutMs: 15000 });
      assert.equal(status.state, 'done');
      assert.equal(status.result, undefined);
      assert.match(worker.log, /task "bigint": its result cannot be written as JSON/);
    }, { timeout: 30000 });

    test('a Permanent job is dead with its error: wait resolves, it does not reject', async () => {
      const id = await client.enqueue(q, 'permanent', { message: 'no such account' }, { keepResultFor: 60 });
      const status = await client.wait(q, id, { timeoutMs: 15000 });
      assert.equal(status.state, 'dead');
      assert.match(status.error, /no such account/);
      assert.equal(status.result, undefined);
    }, { timeout: 30000 });

    test('a job enqueued without keepResultFor: status null, wait rejects with WaitTimeout and last null', async () => {
      const id = await client.enqueue(q, 'double', { n: 1 });
      const queued = (await client.enqueueMany(q, [{ task: 'double', data: { n: 2 }, keepResultFor: 60 }]))[0];
      await client.wait(q, queued, { timeoutMs: 15000 });
      assert.equal(await client.status(q, id), null);
      const started = Date.now();
      await assert.rejects(client.wait(q, id, { timeoutMs: 300 }), (e) => {
        assert.ok(e instanceof WaitTimeout, `${e}`);
        assert.equal(e.last, null);
        assert.match(e.message, /did not end within 300 ms/);
        return true;
      });
      const took = Date.now() - started;
      assert.ok(took >= 290 && took < 3000, `the timeout took ${took} ms`);
    }, { timeout: 30000 });

    test('enqueueMany keeps each job that asks', async () => {
      const ids = await client.enqueueMany(q, [
        { task: 'double', data: { n: 5 }, keepResultFor: 60 },
        { task: 'double', data: { n: 6 }, keepResultFor: 0.5 },
      ]);
      const outcomes = await Promise.all(ids.map((id) => client.wait(q, id, { timeoutMs: 15000 })));
      assert.deepEqual(outcomes.map((o) => o.result), [{ doubled: 10 }, { doubled: 12 }]);
    }, { timeout: 30000 });
  });
}

throughTheWorker('one job per child', 'results-one', ['--concurrency', '2']);
throughTheWorker('several jobs in one child', 'results-mux', ['--children', '1', '--concurrency', '4']);

describe('waiting', () => {
  const q = 'results-wait';
  let worker;
  before(async () => {
    worker = await startWorker(server.url, ['--queue', q, '--concurrency', '1', '--handler', 'exec', '--',
      process.execPath, RESULTS]);
  });
  after(async () => {
    await worker?.stop();
  });

  test('wait wakes as the job ends: blocked on the end stream, not polling the slice', async () => {
    assert.equal(contract.wait_slice_ms, 5000);
    // A job whose worker has not taken it yet: no outcome to see at first.
    const id = await client.enqueue(q, 'slow', { ms: 300 }, { keepResultFor: 60, delay: 500 });
    const before = await commandCalls(redis);
    const started = Date.now();
    const status = await client.wait(q, id, { timeoutMs: 20000 });
    const took = Date.now() - started;
    assert.equal(status.state, 'done');
    assert.deepEqual(status.result, { slept: 300 });
    assert.ok(took < 3000, `wait took ${took} ms: it should wake when the job ends, not after a ${contract.wait_slice_ms} ms slice`);
    const calls = await commandCalls(redis);
    const xreads = (calls.xread ?? 0) - (before.xread ?? 0);
    const reads = (calls.hgetall ?? 0) - (before.hgetall ?? 0);
    assert.ok(xreads >= 1 && xreads <= 3, `XREAD calls: ${xreads}`);
    assert.ok(reads <= xreads + 1, `HGETALL calls: ${reads}`);
  }, { timeout: 30000 });

  test('two waiters on one job both wake, each on a connection of its own, closed afterwards', async () => {
    const id = await client.enqueue(q, 'slow', { ms: 300 }, { keepResultFor: 60 });
    const [a, b] = await Promise.all([client.wait(q, id, { timeoutMs: 20000 }), client.wait(q, id, { timeoutMs: 20000 })]);
    assert.deepEqual(a, b);
    assert.equal(a.state, 'done');
    assert.equal(client._blockers.size, 0);
  }, { timeout: 30000 });

  test('a wait that times out while the job runs carries its last status', async () => {
    const id = await client.enqueue(q, 'slow', { ms: 3000 }, { keepResultFor: 60 });
    await assert.rejects(client.wait(q, id, { timeoutMs: 1500 }), (e) => {
      assert.ok(e instanceof WaitTimeout);
      assert.equal(e.last?.state, 'running');
      assert.equal(e.last?.id, id);
      return true;
    });
    assert.equal((await client.wait(q, id, { timeoutMs: 20000 })).state, 'done');
  }, { timeout: 30000 });

  test('closing the client ends a wait under way with an error', async () => {
    const other = new Client(server.url);
    const waiting = assert.rejects(other.wait(q, 'never-enqueued', { timeoutMs: 20000 }), (e) => {
      assert.equal(e.name, 'ConnectionError');
      assert.match(e.message, /the client was closed while waiting for job "never-enqueued"/);
      return true;
    });
    await new Promise((r) => setTimeout(r, 300));
    const started = Date.now();
    await other.close();
    await waiting;
    assert.ok(Date.now() - started < 2000);
  }, { timeout: 30000 });
});

describe('Redis Cluster', () => {
  let cluster;
  let worker;
  before(async () => {
    cluster = await startCluster();
    worker = await startWorker(cluster.url, ['--queue', '{res}', '--concurrency', '2', '--handler', 'exec', '--',
      process.execPath, RESULTS]);
  });
  after(async () => {
    await worker?.stop();
    await cluster?.stop();
  });

  test('status and wait through every node, the job\'s keys on its queue\'s slot', async () => {
    for (const node of cluster.nodes) {
      const c = new Client(node.url);
      try {
        const id = await c.enqueue('{res}', 'slow', { ms: 200 }, { keepResultFor: 60 });
        const end = await c.wait('{res}', id, { timeoutMs: 20000 });
        assert.equal(c.isCluster, true);
        assert.equal(end.state, 'done');
        assert.deepEqual(end.result, { slept: 200 });
        assert.deepEqual(await c.status('{res}', id), end);
        await assert.rejects(c.status('res', id), /has no hash tag/);
      } finally {
        await c.close();
      }
    }
  }, { timeout: 60000 });
});

describe('validation', () => {
  test('keepResultFor must be a number of seconds above 0 and at most the longest keep', async () => {
    for (const bad of [0, -1, contract.max_keep_seconds + 1, Infinity, NaN, '60', 10n, {}]) {
      await assert.rejects(client.enqueue('results-bad', 't', null, { keepResultFor: bad }), (e) => {
        assert.ok(e instanceof InvalidJobError, `${e}`);
        assert.match(e.message, /keepResultFor must be a number of seconds above 0 and at most 604800/);
        return true;
      });
      await assert.rejects(client.enqueueMany('results-bad', [{ task: 't' }, { task: 't', keepResultFor: bad }]),
        /job 2: keepResultFor must be .*; nothing was enqueued/);
    }
    assert.equal(await redis.exists('results-bad'), 0);
    await client.enqueue('results-bad', 't', null, { keepResultFor: contract.max_keep_seconds });
    const payload = JSON.parse(await redis.lindex('results-bad', 0));
    assert.equal(payload[contract.keep_field], contract.max_keep_seconds);
    await client.enqueue('results-bad', 't', null, { keepResultFor: null });
    assert.equal(JSON.parse(await redis.lindex('results-bad', 0))[contract.keep_field], undefined);
  });

  test('status and wait check the queue, the id and the options', async () => {
    await assert.rejects(client.status('', 'x'), { name: 'InvalidQueueError' });
    await assert.rejects(client.status('q', ''), InvalidJobError);
    await assert.rejects(client.wait('q', 42), InvalidJobError);
    await assert.rejects(client.wait('q', 'x', { timeoutMs: -1 }), /timeoutMs must be a number of milliseconds/);
    await assert.rejects(client.wait('q', 'x', { timeout: 5 }), /unknown option "timeout"; known: timeoutMs/);
  });

  test('status reads a hash as the worker writes it; non-JSON result text is kept as a string', async () => {
    const k = key(contract.outcome_key, 'results-hand', 'h1');
    await redis.hset(k, { state: 'done', attempt: '2', worker: 'w-1', result: 'not json', updated_at: '5', ended_at: '6' });
    assert.deepEqual(await client.status('results-hand', 'h1'), {
      id: 'h1', state: 'done', attempt: 2, worker: 'w-1', result: 'not json', resultError: null, error: null,
      nextAtMs: null, updatedAtMs: 5, endedAtMs: 6, progress: undefined, progressAtMs: null, cancelRequestedAtMs: null,
    });
    await redis.hset(k, { state: 'retrying', error: 'boom', next_at: '77', result: '[1,{"a":null}]' });
    const s = await client.status('results-hand', 'h1');
    assert.equal(s.state, 'retrying');
    assert.equal(s.nextAtMs, 77);
    assert.deepEqual(s.result, [1, { a: null }]);
    await redis.hset(k, { state: 'unheard-of' });
    assert.equal(await client.status('results-hand', 'h1'), null);
    // A wait on a final outcome resolves without blocking.
    await redis.hset(k, { state: 'dead' });
    assert.equal((await client.wait('results-hand', 'h1', { timeoutMs: 0 })).state, 'dead');
  });
});

describe('App answers with results', () => {
  const app = new App()
    .task('double', (data) => ({ doubled: data.n * 2 }))
    .task('nothing', async () => {})
    .task('bigint', async () => 2n)
    .task('nil', () => null);

  test('handle: the resolved value is the answer\'s result; undefined leaves the answer as it was', async () => {
    assert.deepEqual(await app.handle('{"task":"double","data":{"n":4}}'), { ok: true, result: { doubled: 8 } });
    assert.deepEqual(await app.handle('{"task":"nil"}'), { ok: true, result: null });
    const plain = await app.handle('{"task":"nothing"}');
    assert.deepEqual(plain, { ok: true });
    assert.deepEqual(Object.keys(plain), ['ok']);
  });

  test('a producer\'s cancel aborts job.signal in a process of one job (the default, no --children)', async () => {
    const q = 'results-cancel-one';
    const worker = await startWorker(server.url, ['--queue', q, '--concurrency', '1', '--heartbeat-interval', '200ms',
      '--handler', 'exec', '--', process.execPath, RESULTS]);
    try {
      const id = await client.enqueue(q, 'until_cancelled', { ms: 20000 }, { keepResultFor: 60 });
      await eventually('the task to start', async () => (await client.status(q, id))?.progress === 'waiting for a cancel');
      assert.deepEqual(await client.cancel(q, id), { did: 'requested', state: 'running' });
      const started = Date.now();
      const status = await client.wait(q, id, { timeoutMs: 15000 });
      const took = Date.now() - started;
      assert.equal(status.state, 'cancelled', worker.log);
      assert.match(status.error, /stopped: job\.signal aborted/);
      assert.ok(took < 5000, `the task stopped ${took} ms after the cancel`);
      // The next job runs in the same child, unconfused by the cancel line.
      const next = await client.enqueue(q, 'double', { n: 3 }, { keepResultFor: 60 });
      assert.deepEqual((await client.wait(q, next, { timeoutMs: 15000 })).result, { doubled: 6 });
      assert.doesNotMatch(worker.log, /exited/);
    } finally {
      await worker.stop();
    }
  });

  /** Runs the App in a child (results.mjs) with `env`, writes `lines`, and returns its stdout lines and stderr. */
  async function drive(lines, env) {
    const child = spawn(process.execPath, [RESULTS], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
    let stderr = '';
    child.stderr.on('data', (d) => {
      stderr += d;
    });
    const out = [];
    const reader = readline.createInterface({ input: child.stdout });
    reader.on('line', (l) => out.push(l));
    child.stdin.end(lines.map((l) => `${l}\n`).join(''));
    await new Promise((r) => child.once('close', r));
    return { out, stderr };
  }

  test('one job at a time: answer lines byte for byte, BigInt answered ok without a result and logged', async () => {
    const { out, stderr } = await drive([
      '{"id":"a","task":"double","data":{"n":4}}',
      '{"id":"b","task":"nothing"}',
      '{"id":"c","task":"bigint"}',
    ], { WORKERPOOL_JOBS_PER_CHILD: '' });
    assert.deepEqual(out, ['{"accepts":["cancel"]}', '{"ok":true,"result":{"doubled":8}}', '{"ok":true}', '{"ok":true}']);
    assert.match(stderr, /^workerpool: task "bigint": its result cannot be written as JSON \(.*BigInt.*\); the job is done without it$/m);
  });

  test('several jobs at once: each answer names its job, with its result', async () => {
    const { out, stderr } = await drive([
      '{"id":"a","task":"slow","data":{"ms":100}}',
      '{"id":"b","task":"double","data":{"n":1}}',
      '{"id":"c","task":"nothing"}',
      '{"id":"d","task":"bigint"}',
    ], { WORKERPOOL_JOBS_PER_CHILD: '4' });
    assert.deepEqual(out.sort(), [
      '{"id":"a","ok":true,"result":{"slept":100}}',
      '{"id":"b","ok":true,"result":{"doubled":2}}',
      '{"id":"c","ok":true}',
      '{"id":"d","ok":true}',
    ]);
    assert.match(stderr, /task "bigint": its result cannot be written as JSON/);
  });

  test('a result over the longest a worker keeps is left out, said to the worker and logged', async () => {
    const big = new App().task('big', () => 'x'.repeat(contract.max_result_bytes));
    const original = process.stderr.write;
    let logged = '';
    process.stderr.write = (chunk) => {
      logged += chunk;
      return true;
    };
    try {
      assert.deepEqual(await big.handle('{"task":"big"}'), {
        ok: true,
        result_error: `the result was not kept: ${contract.max_result_bytes + 2} bytes of JSON, over the limit of ${contract.max_result_bytes}`,
      });
    } finally {
      process.stderr.write = original;
    }
    assert.match(logged, /task "big": the result was not kept: \d+ bytes of JSON, over the limit of 1048576/);
  });
});
