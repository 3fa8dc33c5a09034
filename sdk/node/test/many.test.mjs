// App with several jobs per process (WORKERPOOL_JOBS_PER_CHILD > 1), driven
// through pipes as the worker would drive it: jobs run concurrently, each
// answer names its job, cancel lines abort job.signal, stdin's end drains.

import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';
import fs from 'node:fs';
import { SDK, eventually, tempDir } from './helpers.mjs';

const FIXTURE = path.join(SDK, 'test', 'fixtures', 'many.mjs');
const CANCELLED = 'Error: the worker cancelled the job: its attempt passed the timeout (--job-timeout)';
const PRODUCER_CANCELLED = 'Error: a producer cancelled the job (client.cancel) while it ran';
/** The first line of a process taking one job at a time: it reads stdin while a job runs. */
const ACCEPTS = { accepts: ['cancel'] };

/** A fixture as a child with `share` in WORKERPOOL_JOBS_PER_CHILD (undefined: unset). */
function startApp(share, fixture = FIXTURE, extraEnv = {}) {
  const env = { ...process.env, ...extraEnv };
  delete env.WORKERPOOL_JOBS_PER_CHILD;
  if (share !== undefined) {
    env.WORKERPOOL_JOBS_PER_CHILD = share;
  }
  const child = spawn(process.execPath, [fixture], { stdio: ['pipe', 'pipe', 'pipe'], env });
  const app = {
    child,
    answers: [],
    log: '',
    exit: new Promise((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal))),
    send(line) {
      child.stdin.write(`${typeof line === 'string' ? line : JSON.stringify(line)}\n`);
    },
    /** Waits for `n` answers in all; returns them. */
    async answered(n, timeoutMs = 15000) {
      return eventually(`${n} answers (have ${app.answers.length})`, () => app.answers.length >= n && app.answers, timeoutMs);
    },
    answerOf(id) {
      return app.answers.find((a) => a.id === id);
    },
    async stop() {
      child.stdin.end();
      return app.exit;
    },
  };
  readline.createInterface({ input: child.stdout }).on('line', (line) => app.answers.push(JSON.parse(line)));
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

describe('several jobs per process', () => {
  test('50 jobs of 200 ms run concurrently and each answer names its job', () => withApp('50', async (app) => {
    const started = Date.now();
    for (let i = 0; i < 50; i++) {
      app.send({ attempt: 1, id: `j${i}`, task: 'sleep', data: { ms: 200 } });
    }
    const answers = await app.answered(50);
    const elapsed = Date.now() - started;
    assert.ok(elapsed < 5000, `50 jobs of 200 ms took ${elapsed} ms`);
    assert.deepEqual(answers.map((a) => a.id).sort(), Array.from({ length: 50 }, (_, i) => `j${i}`).sort());
    for (const a of answers) {
      assert.deepEqual(Object.keys(a), ['id', 'ok'], 'the id comes first, then the answer');
      assert.equal(a.ok, true);
    }
    assert.equal(await app.stop(), 0);
  }));

  test('answers come in completion order: a slow job sent first is answered after a quick one', () => withApp('50', async (app) => {
    app.send({ attempt: 1, id: 'slow', task: 'sleep', data: { ms: 300 } });
    app.send({ attempt: 1, id: 'quick', task: 'ok' });
    const answers = await app.answered(2);
    assert.deepEqual(answers, [{ id: 'quick', ok: true }, { id: 'slow', ok: true }]);
  }));

  test('a cancel line aborts job.signal; the other jobs go on', () => withApp('50', async (app) => {
    app.send({ attempt: 1, id: 'hung', task: 'sleep', data: { ms: 60000 } });
    app.send({ attempt: 1, id: 'stubborn', task: 'stubborn', data: { ms: 300 } });
    app.send({ attempt: 1, id: 'other', task: 'sleep', data: { ms: 400 } });
    app.send({ cancel: 'hung' });
    app.send({ cancel: 'stubborn' });
    app.send({ cancel: 'never-given' });
    const hung = await eventually('the cancelled job\'s answer', () => app.answerOf('hung'), 5000);
    assert.equal(hung.ok, false);
    assert.equal(hung.retry, undefined);
    assert.ok(hung.error.startsWith(CANCELLED), hung.error);
    const answers = await app.answered(3);
    // A task that ignores the signal finishes and is answered then.
    assert.deepEqual(answers.slice(1), [{ id: 'stubborn', ok: true }, { id: 'other', ok: true }]);
    assert.equal(await app.stop(), 0);
    assert.equal(app.answers.length, 3, 'a cancel for a job not in hand is ignored');
    assert.equal(app.log, '');
  }));

  test('Permanent, a thrown error and an unknown task: answers with the id and the retry flag', () => withApp('50', async (app) => {
    app.send({ attempt: 1, id: 'p', task: 'permanent', data: { message: 'no such user' } });
    app.send({ attempt: 1, id: 'f', task: 'fail', data: { message: 'smtp said no' } });
    app.send({ attempt: 1, id: 'u', task: 'send_fax' });
    app.send({ attempt: 1, id: 'n' });
    await app.answered(4);
    assert.deepEqual(app.answerOf('p'), { id: 'p', ok: false, error: 'no such user', retry: false });
    const f = app.answerOf('f');
    assert.equal(f.ok, false);
    assert.equal(f.retry, undefined);
    assert.match(f.error, /^Error: smtp said no\n\s+at /);
    const known = '"ok", "sleep", "stubborn", "permanent", "fail", "signal", "random"';
    assert.deepEqual(app.answerOf('u'), { id: 'u', ok: false, error: `unknown task "send_fax": this handler knows ${known}`, retry: false });
    assert.deepEqual(app.answerOf('n'), {
      id: 'n', ok: false, error: `the job has no "task" naming one of this handler's tasks (${known})`, retry: false,
    });
  }));

  test('a line no answer can name is logged, cut at 200 characters, and the next job is served', () => withApp('50', async (app) => {
    app.send('not json at all');
    app.send('[1,2]');
    app.send({ attempt: 1, task: 'ok' });
    app.send({ attempt: 1, id: 7, task: 'ok' });
    app.send(`"${'x'.repeat(1000)}"`);
    app.send({ attempt: 1, id: 'next', task: 'ok' });
    assert.deepEqual(await app.answered(1), [{ id: 'next', ok: true }]);
    assert.equal(await app.stop(), 0);
    assert.equal(app.answers.length, 1);
    const lines = app.log.trim().split('\n');
    assert.equal(lines.length, 5, app.log);
    assert.ok(lines[0].includes('"not json at all"'), lines[0]);
    assert.ok(lines[1].includes('"[1,2]"'), lines[1]);
    assert.ok(lines[2].includes('{\\"attempt\\":1,\\"task\\":\\"ok\\"}'), lines[2]);
    assert.ok(lines[3].includes('\\"id\\":7'), lines[3]);
    assert.ok(lines[4].endsWith(`: "\\"${'x'.repeat(199)}…"`), lines[4]);
  }));

  test('stdin\'s end with jobs in hand: every one is answered, then the process exits 0', () => withApp('50', async (app) => {
    for (let i = 0; i < 5; i++) {
      app.send({ attempt: 1, id: `d${i}`, task: 'sleep', data: { ms: 200 + 20 * i } });
    }
    assert.equal(await app.stop(), 0);
    assert.deepEqual(app.answers, Array.from({ length: 5 }, (_, i) => ({ id: `d${i}`, ok: true })));
  }));

  test('each job runs in its own attempt\'s trace context, while others run', async () => {
    const record = path.join(tempDir('many-traced'), 'records.jsonl');
    const app = startApp('50', path.join(SDK, 'test', 'fixtures', 'traced.mjs'), { RECORD: record });
    try {
      const trace = (n) => ({ id: `${n}`.repeat(32), span: `${n}`.repeat(16) });
      const jobs = [[trace(1), 150], [trace(2), 10], [trace(3), 80]];
      for (const [{ id, span }, ms] of jobs) {
        app.send({ attempt: 1, id: `t${id[0]}`, task: 'traced', data: { ms }, traceparent: `00-${id}-${span}-01` });
      }
      assert.deepEqual((await app.answered(3)).map((a) => a.id), ['t2', 't3', 't1']);
      const seen = fs.readFileSync(record, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
      assert.deepEqual(seen.map((r) => [r.trace, r.parent]), [trace(2), trace(3), trace(1)].map((t) => [t.id, t.span]));
    } finally {
      app.child.kill();
    }
  });

  test('a seeded random mix: every job gets exactly one answer, naming it, of the right kind', () => withApp('50', async (app) => {
    const seed = Number(process.env.SEED ?? 20261207);
    const rand = mulberry32(seed);
    const kinds = ['ok', 'permanent', 'throw'];
    const jobs = Array.from({ length: 200 }, (_, i) => ({
      id: `r${i}`,
      ms: Math.floor(rand() * 21),
      kind: kinds[Math.floor(rand() * 3)],
      // Some cancels land while the job runs, some after its answer.
      cancelAfter: rand() < 0.3 ? Math.floor(rand() * 25) : undefined,
    }));
    // As the worker does: never more jobs in hand than the share.
    const cancels = [];
    let sent = 0;
    const sendNext = () => {
      const job = jobs[sent++];
      app.send({ attempt: 1, id: job.id, task: 'random', data: { ms: job.ms, kind: job.kind } });
      if (job.cancelAfter !== undefined) {
        cancels.push(new Promise((resolve) => setTimeout(() => resolve(app.send({ cancel: job.id })), job.cancelAfter)));
      }
    };
    while (sent < 50) {
      sendNext();
    }
    await eventually(`all 200 jobs sent and answered (seed ${seed})`, () => {
      while (sent < jobs.length && sent - app.answers.length < 50) {
        sendNext();
      }
      return app.answers.length >= jobs.length;
    }, 30000);
    await Promise.all(cancels);
    assert.equal(await app.stop(), 0);
    assert.equal(app.answers.length, jobs.length, `seed ${seed}: one answer per job`);
    for (const job of jobs) {
      const mine = app.answers.filter((a) => a.id === job.id);
      assert.equal(mine.length, 1, `seed ${seed}: ${job.id} answered ${mine.length} times`);
      const [a] = mine;
      const cancelled = job.cancelAfter !== undefined && a.ok === false && a.error.startsWith(CANCELLED);
      if (cancelled) {
        assert.equal(a.retry, undefined);
      } else if (job.kind === 'ok') {
        assert.deepEqual(a, { id: job.id, ok: true }, `seed ${seed}`);
      } else if (job.kind === 'permanent') {
        assert.deepEqual(a, { id: job.id, ok: false, error: `no ${job.id}`, retry: false }, `seed ${seed}`);
      } else {
        assert.equal(a.ok, false, `seed ${seed}: ${job.id}`);
        assert.equal(a.retry, undefined, `seed ${seed}: ${job.id}`);
        assert.ok(a.error.startsWith(`Error: boom ${job.id}\n`), `seed ${seed}: ${a.error}`);
      }
    }
    const landed = jobs.filter((job) => app.answerOf(job.id).error?.startsWith(CANCELLED)).length;
    assert.ok(landed > 0, `seed ${seed}: no cancel landed while its job ran`);
    assert.equal(app.log, '');
  }));
});

describe('one job per process', () => {
  for (const [what, share] of [['unset', undefined], ['1', '1']]) {
    test(`WORKERPOOL_JOBS_PER_CHILD ${what}: answers in turn without ids, job.signal live`, () => withApp(share, async (app) => {
      app.send({ attempt: 1, id: 'a', task: 'sleep', data: { ms: 100 } });
      app.send({ attempt: 1, id: 'b', task: 'signal' });
      app.send({ attempt: 1, id: 'c', task: 'permanent', data: { message: 'no' } });
      assert.equal(await app.stop(), 0);
      assert.deepEqual(app.answers, [ACCEPTS, { ok: true }, { ok: true }, { ok: false, error: 'no', retry: false }]);
      assert.equal(app.log, '');
    }));
  }

  test('a cancel line for the running job aborts its job.signal; one for another job is ignored', () => withApp(undefined, async (app) => {
    await app.answered(1);
    assert.deepEqual(app.answers, [ACCEPTS], 'it says so first, before any job');
    app.send({ attempt: 1, id: 'hung', task: 'sleep', data: { ms: 60000 } });
    app.send({ cancel: 'someone-else' });
    app.send({ cancel: 'hung' });
    const [, hung] = await app.answered(2, 5000);
    assert.deepEqual(Object.keys(hung), ['ok', 'error'], 'answered in turn, without an id');
    assert.ok(hung.error.startsWith(PRODUCER_CANCELLED), hung.error);
    // A task that ignores the signal finishes and is answered then; a cancel
    // after the answer, for a job no longer running, is ignored.
    app.send({ attempt: 1, id: 'stubborn', task: 'stubborn', data: { ms: 300 } });
    app.send({ cancel: 'stubborn' });
    await app.answered(3);
    app.send({ cancel: 'stubborn' });
    app.send({ attempt: 1, id: 'b', task: 'signal' });
    assert.equal(await app.stop(), 0);
    assert.deepEqual(app.answers.slice(2), [{ ok: true }, { ok: true }]);
    assert.equal(app.log, '');
  }));

  for (const bad of ['many', '0', '-3', '2.5']) {
    test(`WORKERPOOL_JOBS_PER_CHILD=${bad}: one warning, then jobs in turn`, () => withApp(bad, async (app) => {
      app.send({ attempt: 1, id: 'a', task: 'sleep', data: { ms: 50 } });
      app.send({ attempt: 1, id: 'b', task: 'ok' });
      assert.equal(await app.stop(), 0);
      assert.deepEqual(app.answers, [ACCEPTS, { ok: true }, { ok: true }]);
      assert.equal(app.log, `workerpool: WORKERPOOL_JOBS_PER_CHILD="${bad}" is not a whole number of at least 1; serving one job at a time\n`);
    }));
  }
});

/** A small seeded PRNG (mulberry32): the same seed, the same jobs. */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
