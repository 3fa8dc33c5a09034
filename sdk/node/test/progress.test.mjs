// job.progress(value): a progress line before the job's answer, in the
// one-job and the multiplexed protocol, driven through pipes as the worker
// would drive them.

import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { App, InvalidProgressError, WorkerpoolError } from '../index.mjs';
import { SDK, eventually } from './helpers.mjs';

const FIXTURE = path.join(SDK, 'test', 'fixtures', 'progress.mjs');
const LIMIT = JSON.parse(fs.readFileSync(path.join(SDK, 'contract.json'), 'utf8')).outcomes.max_progress_bytes;

/** The fixture as a child with `share` in WORKERPOOL_JOBS_PER_CHILD (undefined: unset). */
function startApp(share) {
  const env = { ...process.env };
  delete env.WORKERPOOL_JOBS_PER_CHILD;
  if (share !== undefined) {
    env.WORKERPOOL_JOBS_PER_CHILD = share;
  }
  const child = spawn(process.execPath, [FIXTURE], { stdio: ['pipe', 'pipe', 'pipe'], env });
  const app = {
    child,
    lines: [],
    raw: [],
    log: '',
    exit: new Promise((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal))),
    send(line) {
      child.stdin.write(`${JSON.stringify(line)}\n`);
    },
    async got(n) {
      return eventually(`${n} lines (have ${app.lines.length}; log: ${app.log})`, () => app.lines.length >= n && app.lines);
    },
    async stop() {
      child.stdin.end();
      return app.exit;
    },
  };
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    // Taking one job at a time, it first says it reads stdin while a job runs.
    if (app.raw.length === 0 && app.accepts === undefined && line === '{"accepts":["cancel"]}') {
      app.accepts = line;
      return;
    }
    app.raw.push(line);
    app.lines.push(JSON.parse(line));
  });
  child.stderr.on('data', (d) => {
    app.log += d.toString();
  });
  return app;
}

async function withApp(share, fn) {
  const app = startApp(share);
  try {
    await fn(app);
  } finally {
    app.child.kill();
  }
}

describe('job.progress', () => {
  for (const task of ['progress', 'sync_progress']) {
    test(`one job at a time (${task}): progress lines, then the answer`, () => withApp(undefined, async (app) => {
      app.send({ attempt: 1, id: 'a', task, data: { values: [10, { done: 2, of: 3 }, 'é'] } });
      app.send({ attempt: 1, id: 'b', task, data: { values: [1] } });
      const result = task === 'progress' ? { result: 'reported' } : {};
      const lines = await app.got(6);
      assert.deepEqual(lines, [
        { progress: 10 }, { progress: { done: 2, of: 3 } }, { progress: 'é' }, { ok: true, ...result },
        { progress: 1 }, { ok: true, ...result },
      ]);
      assert.equal(app.raw[0], '{"progress":10}');
      assert.equal(app.accepts, '{"accepts":["cancel"]}', 'the accepts line came first');
      assert.equal(await app.stop(), 0);
    }));

    test(`several jobs at once (${task}): each progress line names its job, before its answer`, () => withApp('8', async (app) => {
      for (let i = 0; i < 4; i++) {
        app.send({ attempt: 1, id: `j${i}`, task, data: { values: [i, i + 1] } });
      }
      const lines = await app.got(12);
      const result = task === 'progress' ? { result: 'reported' } : {};
      for (let i = 0; i < 4; i++) {
        assert.deepEqual(lines.filter((l) => l.id === `j${i}`), [
          { id: `j${i}`, progress: i }, { id: `j${i}`, progress: i + 1 }, { id: `j${i}`, ok: true, ...result },
        ]);
      }
      assert.ok(app.raw.every((l) => l.startsWith('{"id":')), app.raw.join('\n'));
      assert.equal(await app.stop(), 0);
    }));
  }

  for (const share of [undefined, '4']) {
    test(`an oversized report throws in the task and sends nothing (share ${share ?? 'unset'})`, () => withApp(share, async (app) => {
      app.send({ attempt: 1, id: 'big', task: 'too_big', data: { size: LIMIT } });
      app.send({ attempt: 1, id: 'fits', task: 'too_big', data: { size: LIMIT - 2 } });
      const [big, fitsProgress, fits] = await app.got(3);
      assert.equal(big.ok, false);
      assert.equal(big.progress, undefined);
      assert.match(big.error, /InvalidProgressError/);
      assert.ok(big.error.includes(`${LIMIT + 2} bytes of JSON, over the limit of ${LIMIT}`), big.error);
      assert.equal(JSON.stringify(fitsProgress.progress).length, LIMIT);
      assert.equal(fits.ok, true);
      assert.equal(await app.stop(), 0);
    }));

    test(`a report after the task settled is dropped (share ${share ?? 'unset'})`, () => withApp(share, async (app) => {
      app.send({ attempt: 1, id: 'l', task: 'late', data: null });
      await app.got(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
      app.send({ attempt: 1, id: 'v', task: 'bad_values', data: null });
      const lines = await app.got(2);
      await new Promise((resolve) => setTimeout(resolve, 100));
      const head = share === undefined ? {} : { id: 'l' };
      assert.deepEqual(app.lines[0], { ...head, ok: true, result: 'early' });
      assert.deepEqual(lines[1].result, [true, true, true]);
      assert.equal(app.lines.length, 2, app.raw.join('\n'));
      assert.equal(await app.stop(), 0);
    }));
  }

  test('handle() checks a report and sends it nowhere', async () => {
    const app = new App();
    app.task('t', (data, job) => {
      job.progress({ n: 1 });
      try {
        job.progress('x'.repeat(LIMIT));
      } catch (e) {
        return e instanceof InvalidProgressError && e instanceof WorkerpoolError && /nothing was sent/.test(e.message);
      }
      return false;
    });
    assert.deepEqual(await app.handle('{"task":"t","id":"x"}'), { ok: true, result: true });
  });
});
