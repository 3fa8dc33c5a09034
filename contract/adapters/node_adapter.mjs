#!/usr/bin/env node
// The Node.js client's conformance adapter, run by the conformance runner (tests/tests/contract.rs):
//   node contract/adapters/node_adapter.mjs produce   JSON requests on stdin, one JSON answer line each
//   node contract/adapters/node_adapter.mjs handle    the exec handler (workerpool-worker --handler exec -- ...)
// It loads the library straight from the checkout (sdk/node), with no build step.

import fs from 'node:fs';
import readline from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { App, Client, Permanent, WaitTimeout } from '../../sdk/node/index.mjs';

const given = (v) => (v === null ? undefined : v);

// The library's status (camelCase) as the protocol's outcome object, which
// uses the queue crate's names; absent fields are null.
const OUTCOME_NAMES = {
  id: 'id',
  state: 'state',
  attempt: 'attempt',
  worker: 'worker',
  result: 'result',
  resultError: 'result_error',
  error: 'error',
  nextAtMs: 'next_at_ms',
  updatedAtMs: 'updated_at_ms',
  endedAtMs: 'ended_at_ms',
  progress: 'progress',
  progressAtMs: 'progress_at_ms',
  cancelRequestedAtMs: 'cancel_requested_at_ms',
};

function outcome(status) {
  if (status === null || status === undefined) {
    return null;
  }
  const out = {};
  for (const [ours, theirs] of Object.entries(OUTCOME_NAMES)) {
    out[theirs] = status[ours] ?? null;
  }
  return out;
}

// The answer to a status, wait or cancel request.
async function ask(client, req) {
  switch (req.op) {
    case 'status':
      return { status: outcome(await client.status(req.queue, req.id)) };
    case 'wait':
      try {
        return { status: outcome(await client.wait(req.queue, req.id, { timeoutMs: req.timeout_ms })) };
      } catch (e) {
        if (e instanceof WaitTimeout) {
          return { timeout: outcome(e.last) };
        }
        throw e;
      }
    case 'cancel':
      return { cancel: await client.cancel(req.queue, req.id) };
    default:
      throw new Error(`unknown op ${JSON.stringify(req.op)}`);
  }
}

async function produce() {
  const clients = new Map();
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === '') {
      continue;
    }
    let answer;
    try {
      const req = JSON.parse(line);
      const tls = req.tls ?? {};
      const options = {
        ca: given(tls.ca),
        cert: given(tls.cert),
        key: given(tls.key),
        cluster: req.cluster ? true : undefined,
      };
      const key = JSON.stringify([req.url, options]);
      let client = clients.get(key);
      if (!client) {
        client = new Client(req.url, options);
        clients.set(key, client);
      }
      if (req.op !== undefined) {
        answer = await ask(client, req);
        process.stdout.write(`${JSON.stringify(answer)}\n`);
        continue;
      }
      const jobs = (req.jobs ?? []).map((j) => ({
        task: j.task,
        data: j.data,
        id: given(j.id),
        delay: given(j.delay_ms),
        runAt: given(j.run_at_ms),
        uniqueKey: given(j.unique_key),
        uniqueFor: given(j.unique_for_s),
        keepResultFor: given(j.keep_s),
      }));
      let ids;
      if (req.many) {
        ids = await client.enqueueMany(req.queue, jobs);
      } else {
        ids = [];
        for (const { task, data, ...options } of jobs) {
          ids.push(await client.enqueue(req.queue, task, data, options));
        }
      }
      answer = { ids };
    } catch (e) {
      answer = { error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) };
    }
    // A write to a pipe is synchronous on Linux, so each answer is out
    // (flushed) before the next request is read.
    process.stdout.write(`${JSON.stringify(answer)}\n`);
  }
  await Promise.all([...clients.values()].map((c) => c.close()));
}

function record(job) {
  const line = JSON.stringify({ id: job.id, attempt: job.attempt, task: job.task, data: job.data === undefined ? null : job.data });
  // One write of the whole line: records of concurrent processes never interleave.
  fs.appendFileSync(process.env.CONTRACT_RECORD, `${line}\n`);
}

async function handle() {
  if (!process.env.CONTRACT_RECORD) {
    process.stderr.write('node_adapter.mjs handle: set CONTRACT_RECORD to the file to record jobs in\n');
    process.exit(2);
  }
  const app = new App();
  app.task('record', (data, job) => record(job));
  app.task('sleep', async (data, job) => {
    await sleep(data.ms);
    record(job);
  });
  app.task('returning', (data, job) => {
    record(job);
    return data.value;
  });
  app.task('progress', async (data, job) => {
    const steps = data.steps ?? [];
    for (let i = 0; i < steps.length; i += 1) {
      if (i > 0) await sleep(data.step_ms ?? 50);
      job.progress(steps[i]);
    }
    record(job);
    return data.value;
  });
  // job.signal is aborted when a producer cancels the job (the worker's
  // cancel line, when the process holds several jobs).
  app.task('hold', async (data, job) => {
    record(job);
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, data.ms ?? 10000);
      job.signal.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve();
      }, { once: true });
    });
    if (job.signal.aborted) throw new Error('stopped as asked');
  });
  app.task('print', (data, job) => {
    console.log('stray output');
    record(job);
  });
  app.task('fail', (data) => {
    throw new Error(data.message);
  });
  app.task('permanent', (data) => {
    throw new Permanent(data.message);
  });
  // Recorded only once data.n jobs of data.group are in this process at the
  // same time: one process running them one by one never gets there.
  const met = new Map();
  app.task('meet', async (data, job) => {
    let group = met.get(data.group);
    if (!group) {
      let release;
      group = { arrived: 0, all: new Promise((resolve) => { release = resolve; }) };
      group.release = release;
      met.set(data.group, group);
    }
    group.arrived += 1;
    if (group.arrived >= data.n) group.release(true);
    let timer;
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve(false), data.within_ms ?? 5000); });
    const all = await Promise.race([group.all, timeout]);
    clearTimeout(timer);
    if (!all) throw new Error(`only ${group.arrived} of ${data.n} jobs met in one process`);
    record(job);
  });
  app.task('crash', (data, job) => {
    if (data.attempts !== undefined && job.attempt > data.attempts) {
      record(job);
      return;
    }
    fs.writeSync(2, data.message);
    process.exit(3);
  });
  await app.run();
}

const mode = process.argv[2];
if (mode === 'produce') {
  await produce();
} else if (mode === 'handle') {
  await handle();
} else {
  process.stderr.write(`usage: node_adapter.mjs produce|handle (got ${JSON.stringify(mode ?? '')})\n`);
  process.exit(2);
}
