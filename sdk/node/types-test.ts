// Compiled with `tsc --noEmit` only: checks that index.d.ts describes a
// typical producer and handler.
import {
  App,
  Client,
  ConfigError,
  InvalidJobError,
  InvalidProgressError,
  Permanent,
  WaitTimeout,
  WorkerpoolError,
  type CancelResult,
  type Job,
  type JobStatus,
} from './index';

async function produce(): Promise<void> {
  const client = new Client('rediss://redis.example:6380', { ca: 'ca.pem', cert: 'c.pem', key: 'k.pem' });
  const id: string | null = await client.enqueue('emails', 'send_email', { to: 'a@example.com' });
  await client.enqueue('emails', 'send_email', null, { delay: 60_000, uniqueKey: 'a', uniqueFor: 60 });
  await client.enqueue('emails', 'send_email', undefined, { runAt: new Date(), id: 'order-1' });
  const ids: Array<string | null> = await client.enqueueMany('{mail}:high', [
    { task: 'send_email', data: [1, 2] },
    { task: 'report', runAt: Date.now() + 1000 },
  ]);
  console.log(id, ids.length, client.isCluster);
  const kept = await client.enqueue('reports', 'render', { n: 1 }, { keepResultFor: 3600 });
  await client.enqueueMany('reports', [{ task: 'render', keepResultFor: 60 }]);
  const now: JobStatus | null = await client.status('reports', kept!);
  if (now !== null) {
    const state: 'waiting' | 'scheduled' | 'running' | 'retrying' | 'done' | 'dead' | 'cancelled' = now.state;
    const due: number | null = now.nextAtMs;
    console.log(state, due, now.attempt, now.worker, now.error, now.resultError, now.updatedAtMs, now.endedAtMs);
    const asked: number | null = now.cancelRequestedAtMs;
    console.log(now.progress, now.progressAtMs, asked);
  }
  const did: CancelResult = await client.cancel('reports', kept!);
  if (did.did === 'removed') {
    const from: 'waiting' | 'scheduled' | 'retrying' = did.from;
    console.log(from);
  } else if (did.did !== 'unknown') {
    console.log(did.state);
  }
  try {
    const end = await client.wait<{ url: string }>('reports', kept!, { timeoutMs: 30_000 });
    if (end.state === 'done' && end.result !== undefined) {
      const url: string = end.result.url;
      console.log(url);
    }
  } catch (e) {
    if (e instanceof WaitTimeout) {
      const last: JobStatus | null = e.last;
      console.log(last?.state);
    }
  }
  // @ts-expect-error: keepResultFor is seconds, a number
  await client.enqueue('reports', 'render', null, { keepResultFor: '1h' });
  // @ts-expect-error: no such wait option
  await client.wait('reports', 'x', { timeout: 5 });
  await client.close();
  // @ts-expect-error: the task is required
  await client.enqueueMany('emails', [{ data: 1 }]);
  // @ts-expect-error: runAt is a Date or a number
  await client.enqueue('emails', 't', null, { runAt: 'tomorrow' });
  // @ts-expect-error: no such option
  new Client('redis://localhost', { tls: true });
}

interface Email {
  to: string;
}

const app = new App();
app
  .task<Email>('send_email', async (data, job: Job<Email>) => {
    const to: string = data.to;
    const attempt: number = job.attempt;
    if (!to) {
      throw new Permanent(`no address in job ${job.id} (attempt ${attempt})`);
    }
  })
  .task('double', (data: { n: number }) => ({ doubled: data.n * 2 }))
  .task('report', async (data, job) => {
    const signal: AbortSignal = job.signal;
    signal.throwIfAborted();
    job.progress({ done: 1, of: 2 });
    try {
      job.progress('x'.repeat(5000));
    } catch (e) {
      console.log(e instanceof InvalidProgressError);
    }
    await fetch('http://127.0.0.1:9000/report', { method: 'POST', body: JSON.stringify(data), signal });
  });
const names: string[] = app.tasks;
void app.run();
void app.handle('{"task":"report"}').then((a) => (a.ok ? a.result : a.error.length));

const e: WorkerpoolError = new ConfigError('x');
const f: Error = new InvalidJobError('y');
void produce;
console.log(names, e, f);
