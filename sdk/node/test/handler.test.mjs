// App through the real worker (`--handler exec -- node app.mjs`): done,
// retries with the stack in the dead letter, Permanent, unknown tasks,
// stray output on stdout, id and attempt; and the protocol line by line.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { Client } from '../index.mjs';
import { SDK, eventually, raw, startRedis, startWorker, tempDir } from './helpers.mjs';

const APP = path.join(SDK, 'test', 'fixtures', 'app.mjs');
const Q = 'handler';

let server;
let redis;
let client;
let worker;
let recordFile;

function records() {
  if (!fs.existsSync(recordFile)) {
    return [];
  }
  return fs.readFileSync(recordFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

async function deadLetters() {
  return (await redis.lrange(`${Q}:dead`, 0, -1)).map((l) => JSON.parse(l));
}

async function deadOf(id) {
  return eventually(`a dead letter for job ${id}`, async () => (await deadLetters()).find((d) => d.job.id === id));
}

before(async () => {
  server = await startRedis();
  redis = raw(server.url);
  client = new Client(server.url);
  recordFile = path.join(tempDir('records'), 'records.jsonl');
  worker = await startWorker(server.url, ['--queue', Q, '--concurrency', '2', '--max-attempts', '3',
    '--backoff-base', '10ms', '--backoff-max', '20ms', '--handler', 'exec', '--', process.execPath, APP],
  { RECORD: recordFile });
});

after(async () => {
  await worker?.stop();
  await client.close();
  redis.disconnect();
  await server.stop();
});

describe('through the worker', () => {
  test('a job is done, and the handler sees its id, attempt, task and data', async () => {
    await client.enqueue(Q, 'record', { to: 'a@example.com', n: [1, 2.5] }, { id: 'job-1' });
    const seen = await eventually('the record of job-1', () => records().find((r) => r.id === 'job-1'));
    assert.deepEqual(seen, { id: 'job-1', attempt: 1, task: 'record', data: { to: 'a@example.com', n: [1, 2.5] } });
    await eventually('job-1 counted as processed', async () => Number(await redis.get(`${Q}:stats:processed`)) >= 1);
  });

  test('job.raw is the whole object the worker sent, stamp included', async () => {
    const id = await client.enqueue(Q, 'raw', { k: 'v' }, { uniqueKey: 'raw-1' });
    const seen = await eventually('the raw record', () => records().find((r) => r.id === id));
    assert.deepEqual(Object.keys(seen.raw).sort(), ['attempt', 'data', 'enqueued_at', 'id', 'task', 'unique_key']);
    assert.equal(seen.raw.attempt, 1);
    assert.equal(seen.raw.unique_key, 'raw-1');
    assert.deepEqual(seen.raw.data, { k: 'v' });
  });

  test('a thrown Error is retried: the second attempt sees attempt 2 and the same id', async () => {
    const id = await client.enqueue(Q, 'flaky', null);
    const seen = await eventually('the flaky job to succeed', () => records().find((r) => r.id === id));
    assert.equal(seen.attempt, 2);
  });

  test('an Error on every attempt: dead letter "exhausted" with the message and the stack', async () => {
    const id = await client.enqueue(Q, 'fail', { message: 'smtp said no' });
    const dead = await deadOf(id);
    assert.equal(dead.reason, 'exhausted');
    assert.equal(dead.attempts, 3);
    assert.match(dead.error, /^Error: smtp said no\n\s+at failingTask \(.*app\.mjs:\d+:\d+\)/);
  });

  test('Permanent: dead letter "permanent" after one attempt with the message alone', async () => {
    const id = await client.enqueue(Q, 'permanent', { message: 'no such user 42' });
    const dead = await deadOf(id);
    assert.equal(dead.reason, 'permanent');
    assert.equal(dead.attempts, 1);
    assert.equal(dead.error, 'no such user 42');
  });

  test('an unknown task is permanent and names the tasks the handler knows', async () => {
    const id = await client.enqueue(Q, 'send_fax', {});
    const dead = await deadOf(id);
    assert.equal(dead.reason, 'permanent');
    assert.equal(dead.error, 'unknown task "send_fax": this handler knows "record", "raw", "fail", "permanent", "flaky", "noisy", "reject"');
  });

  test('a rejection with a non-Error value is retried with that value as the error', async () => {
    const id = await client.enqueue(Q, 'reject', null);
    const dead = await deadOf(id);
    assert.equal(dead.reason, 'exhausted');
    assert.equal(dead.error, 'a plain string');
  });

  test('console.log and process.stdout.write go to the log, not into the protocol', async () => {
    const ids = await client.enqueueMany(Q, [{ task: 'noisy' }, { task: 'noisy' }, { task: 'record', data: 'after' }]);
    await eventually('the three jobs recorded', () => ids.every((id) => records().some((r) => r.id === id)));
    for (const id of ids) {
      assert.equal(records().find((r) => r.id === id).attempt, 1, 'no attempt was lost to a corrupted answer');
    }
    for (const text of ['console.log', 'process.stdout.write', 'console.info']) {
      assert.ok(worker.log.includes(`stray output from ${text}`), `the worker's log has no line from ${text}`);
    }
  });
});

describe('the protocol, line by line', () => {
  test('an error too long for one answer line is cut, and the answer stays valid', async () => {
    const { App, Permanent } = await import('../index.mjs');
    const app = new App().task('huge', () => {
      throw new Permanent('x'.repeat(2 * 1024 * 1024));
    });
    const answer = await app.handle('{"attempt":1,"id":"h","task":"huge"}');
    assert.equal(answer.retry, false);
    assert.ok(JSON.stringify(answer).length < 1024 * 1024, 'under the worker\'s 1 MiB answer limit');
    assert.match(answer.error, /… \(cut at 65536 characters\)$/);
  });

  test('tasks are registered once each, as functions', async () => {
    const { App, WorkerpoolError } = await import('../index.mjs');
    const app = new App().task('a', () => {});
    assert.throws(() => app.task('a', () => {}), (e) => e instanceof WorkerpoolError && /task "a" is registered twice/.test(e.message));
    assert.throws(() => app.task('b', 'not a function'), /task "b": the handler must be a function/);
    assert.throws(() => app.task('', () => {}), /a task name must be a non-empty string/);
    assert.deepEqual(app.tasks, ['a']);
  });

  test('lines that are not jobs get a permanent failure and the process keeps serving', async () => {
    const child = spawn(process.execPath, [APP], { stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, RECORD: recordFile } });
    const answers = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    // First, before any answer: it reads stdin while a job runs (a cancel line).
    assert.equal((await answers.next()).value, '{"accepts":["cancel"]}');
    const ask = async (line) => {
      child.stdin.write(`${line}\n`);
      const { value } = await answers.next();
      return JSON.parse(value);
    };
    try {
      assert.deepEqual(await ask('not json at all'), {
        ok: false, retry: false,
        error: 'the handler got a line that is not JSON (Unexpected token \'o\', "not json at all" is not valid JSON): "not json at all"',
      });
      assert.deepEqual(await ask('[1,2]'), { ok: false, retry: false, error: 'the handler got JSON that is not a job object: "[1,2]"' });
      assert.deepEqual(await ask('{"attempt":1,"id":"x"}'), {
        ok: false, retry: false,
        error: 'the job has no "task" naming one of this handler\'s tasks ("record", "raw", "fail", "permanent", "flaky", "noisy", "reject")',
      });
      assert.deepEqual(await ask('{"attempt":1,"id":"direct","task":"record","data":12345678901234567890}'), { ok: true });
      // Past 2^53 an integer arrives as the nearest double (JSON.parse).
      assert.equal(records().find((r) => r.id === 'direct').data, 12345678901234567000);
      const fail = await ask('{"attempt":1,"id":"y","task":"fail","data":{"message":"m"}}');
      assert.equal(fail.ok, false);
      assert.equal(fail.retry, undefined);
      assert.match(fail.error, /^Error: m\n/);
      const exit = new Promise((r) => child.once('exit', (code) => r(code)));
      child.stdin.end();
      assert.equal(await exit, 0);
    } finally {
      child.kill();
    }
  });
});
