// A quick self-test of the conformance adapter (contract/adapters/node_adapter.mjs)
// in both modes; the conformance suite itself runs it in depth.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { ROOT, eventually, raw, startRedis, startWorker, tempDir } from './helpers.mjs';

const ADAPTER = path.join(ROOT, 'contract', 'adapters', 'node_adapter.mjs');

let server;
let redis;

before(async () => {
  server = await startRedis();
  redis = raw(server.url);
});

after(async () => {
  redis.disconnect();
  await server.stop();
});

test('produce: one answer line per request, errors answered and reading goes on', async () => {
  const child = spawn(process.execPath, [ADAPTER, 'produce'], { stdio: ['pipe', 'pipe', 'inherit'] });
  const answers = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const ask = async (req) => {
    child.stdin.write(`${JSON.stringify({ url: server.url, tls: null, cluster: false, ...req })}\n`);
    return JSON.parse((await answers.next()).value);
  };
  const job = (over) => ({ task: 't', data: null, id: null, delay_ms: null, run_at_ms: null, unique_key: null, unique_for_s: null, ...over });
  try {
    const one = await ask({ queue: 'a', many: false, jobs: [job({ id: 'given', data: { x: '😀' } }), job({ run_at_ms: 4102444800000 })] });
    assert.equal(one.ids[0], 'given');
    assert.match(one.ids[1], /^[0-9a-f]{32}$/);
    assert.deepEqual(JSON.parse(await redis.lindex('a', 0)).data, { x: '😀' });
    assert.equal(await redis.zscore('a:scheduled', (await redis.zrange('a:scheduled', 0, 0))[0]), '4102444800000');
    const many = await ask({ queue: 'b', many: true, jobs: [job({ unique_key: 'u', unique_for_s: 60 }), job({ unique_key: 'u' }), job({ delay_ms: 5000 })] });
    assert.equal(many.ids.length, 3);
    assert.equal(many.ids[1], null);
    const bad = await ask({ queue: 'b:dead', many: false, jobs: [job()] });
    assert.match(bad.error, /^InvalidQueueError: queue name "b:dead" is the dead-letter list/);
    const badJob = await ask({ queue: 'b', many: true, jobs: [job({ unique_for_s: 1.5, unique_key: 'k' })] });
    assert.match(badJob.error, /^InvalidJobError: job 1: uniqueFor must be a whole number of seconds above 0/);
    const again = await ask({ queue: 'c', many: false, jobs: [job()] });
    assert.equal(again.ids.length, 1);
    const exit = new Promise((r) => child.once('exit', r));
    child.stdin.end();
    assert.equal(await exit, 0);
  } finally {
    child.kill();
  }
});

test('handle: every task of the protocol through the real worker', async () => {
  const file = path.join(tempDir('contract'), 'record.jsonl');
  const worker = await startWorker(server.url, ['--queue', 'h', '--concurrency', '2', '--max-attempts', '2',
    '--backoff-base', '10ms', '--backoff-max', '20ms', '--', process.execPath, ADAPTER, 'handle'], { CONTRACT_RECORD: file });
  const push = (job) => redis.lpush('h', JSON.stringify(job));
  try {
    await push({ task: 'record', id: 'r', data: { deep: [[{}]], n: -0.5 } });
    await push({ task: 'sleep', id: 's', data: { ms: 50 } });
    await push({ task: 'print', id: 'p', data: 'x' });
    await push({ task: 'fail', id: 'f', data: { message: 'failed on purpose' } });
    await push({ task: 'permanent', id: 'pm', data: { message: 'no retry' } });
    await push({ task: 'crash', id: 'c', data: { message: 'crashing now' } });
    const lines = await eventually('three records', () => {
      const l = fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];
      return l.length >= 3 && l;
    });
    const byId = Object.fromEntries(lines.map((l) => JSON.parse(l)).map((r) => [r.id, r]));
    assert.deepEqual(byId.r, { id: 'r', attempt: 1, task: 'record', data: { deep: [[{}]], n: -0.5 } });
    assert.deepEqual(byId.s, { id: 's', attempt: 1, task: 'sleep', data: { ms: 50 } });
    assert.deepEqual(byId.p, { id: 'p', attempt: 1, task: 'print', data: 'x' });
    const dead = await eventually('three dead letters', async () => {
      const d = (await redis.lrange('h:dead', 0, -1)).map((l) => JSON.parse(l));
      return d.length >= 3 && Object.fromEntries(d.map((x) => [x.job.id, x]));
    });
    assert.equal(dead.f.reason, 'exhausted');
    assert.match(dead.f.error, /^Error: failed on purpose\n/);
    assert.equal(dead.pm.reason, 'permanent');
    assert.equal(dead.pm.error, 'no retry');
    assert.equal(dead.c.reason, 'exhausted');
    assert.match(dead.c.error, /crashing now/);
    assert.ok(worker.log.includes('stray output'));
  } finally {
    await worker.stop();
  }
});
