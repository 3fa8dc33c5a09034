// The notification worker example at 1, 2 and 4 slots: as many
// notifications run at once as there are slots (from the handlers' own
// start and end events, no timing assertion), and a job that crashes its
// process ends dead-lettered with the error while the others finish.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { SDK, eventually, raw, startRedis, startWorker, tempDir } from './helpers.mjs';

const EXAMPLE = path.join(SDK, 'examples', 'notifications');

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

/** The most jobs running at one time, from start/end events (an end before a start at the same instant). */
function maxOverlap(events) {
  const sorted = events
    .map((e) => ({ t: e.t, d: e.event === 'start' ? 1 : -1 }))
    .sort((a, b) => a.t - b.t || a.d - b.d);
  let running = 0;
  let most = 0;
  for (const e of sorted) {
    running += e.d;
    most = Math.max(most, running);
  }
  return most;
}

const walls = {};

for (const slots of [1, 2, 4]) {
  test(`${slots} slot(s): ${slots} notification(s) at once, the broken job dead-lettered`, async () => {
    const queue = `notifications-${slots}`;
    const record = path.join(tempDir('notify'), 'events.jsonl');
    const read = () => (fs.existsSync(record) ? fs.readFileSync(record, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : []);
    const started = Date.now();
    const worker = await startWorker(server.url, ['--queue', queue, '--concurrency', String(slots),
      '--max-attempts', '2', '--backoff-base', '20ms', '--backoff-max', '50ms',
      '--', process.execPath, path.join(EXAMPLE, 'worker.mjs')], { NOTIFICATIONS_RECORD: record });
    try {
      // Every slot's process up before the jobs arrive, so a slow start of
      // one process on a busy machine does not stagger the slots.
      await eventually(`${slots} handler processes ready`, () => read().filter((e) => e.event === 'ready').length >= slots);
      const ids = execFileSync(process.execPath, [path.join(EXAMPLE, 'produce.mjs'), server.url, queue], { encoding: 'utf8' })
        .trim().split('\n');
      assert.equal(ids.length, 13);
      await eventually('12 notifications done and the broken job dead', async () =>
        (await redis.get(`${queue}:stats:processed`)) === '12' && (await redis.llen(`${queue}:dead`)) === 1, 30000);
      const wall = Date.now() - started;
      const events = read().filter((e) => e.event !== 'ready');
      const notify = events.filter((e) => ids.indexOf(e.id) !== 5);
      // Each of the twelve ran once, start before end.
      for (const id of ids.filter((_, i) => i !== 5)) {
        const mine = notify.filter((e) => e.id === id);
        assert.deepEqual(mine.map((e) => e.event), ['start', 'end'], `events of ${id}`);
        assert.ok(mine[0].t <= mine[1].t);
      }
      const overlap = maxOverlap(notify);
      assert.equal(overlap, slots, `at most ${slots} at once and that many at some point; saw ${overlap}`);
      const pids = new Set(notify.map((e) => e.pid));
      assert.ok(pids.size >= slots, `${slots} processes ran the jobs, saw ${pids.size}`);
      const [dead] = (await redis.lrange(`${queue}:dead`, 0, -1)).map((l) => JSON.parse(l));
      assert.equal(dead.job.id, ids[5]);
      assert.equal(dead.reason, 'exhausted');
      assert.equal(dead.attempts, 2);
      assert.match(dead.error, /template "welcome-v0" is missing; giving up/);
      assert.equal(events.filter((e) => e.id === ids[5]).length, 2, 'the broken job started once per attempt');
      const span = Math.round(Math.max(...notify.map((e) => e.t)) - Math.min(...notify.map((e) => e.t)));
      walls[slots] = span;
      console.log(`${slots} slot(s): 12 notifications of 100 ms ran in ${span} ms (first start to last end); ${wall} ms from the worker's start until the broken job was dead too (processes started first)`);
    } finally {
      await worker.stop();
    }
  });
}

test('more slots, less wall time (printed, not asserted)', () => {
  console.log(`wall times of the twelve by slots: ${JSON.stringify(walls)}`);
});
