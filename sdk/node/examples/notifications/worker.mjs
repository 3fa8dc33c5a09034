// The notification worker: run it as the exec handler of workerpool-worker,
//
//   workerpool-worker --redis-url redis://localhost:6379 --queue notifications \
//     --concurrency 4 -- node worker.mjs
//
// Each process runs one job at a time; --concurrency is how many processes
// (slots) the worker keeps, so four slots send four notifications at once.
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { App } from '@workerpool-dev/client';

// Where start/end events go (one JSON line each), when set: how the test
// measures how many notifications ran at once.
const RECORD = process.env.NOTIFICATIONS_RECORD;

function note(event, job = {}) {
  const line = JSON.stringify({ event, id: job.id, attempt: job.attempt, pid: process.pid, t: performance.timeOrigin + performance.now() });
  if (RECORD) {
    fs.appendFileSync(RECORD, `${line}\n`);
  }
}

const app = new App();

// Sending a notification: here a 100 ms wait stands in for the provider's API.
app.task('notify', async (data, job) => {
  note('start', job);
  await sleep(data.ms ?? 100);
  console.log(`notified ${data.user} via ${data.channel}`); // goes to the worker's log (stderr)
  note('end', job);
});

// A job whose handler brings its whole process down (a native crash, an
// out-of-memory kill, a stray process.exit): the worker fails the attempt
// with the process's last words, starts another process, and dead-letters
// the job once its attempts are spent, while the other jobs carry on.
app.task('broken', (data, job) => {
  note('start', job);
  process.stderr.write(`template ${JSON.stringify(data.template)} is missing; giving up\n`);
  process.exit(1);
});

note('ready');
await app.run();
