// The video platform's transcode (examples/video-platform/node) end to end:
// the real worker runs transcode.mjs (simulated, no ffmpeg), produce.mjs
// enqueues with keepResultFor, follows status and ends with wait.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { Client } from '../index.mjs';
import { ROOT, binDir, freePort, startRedis, tempDir } from './helpers.mjs';

const EXAMPLE = path.join(ROOT, 'examples', 'video-platform', 'node');

let server;
let client;

before(async () => {
  server = await startRedis();
  client = new Client(server.url);
});

after(async () => {
  await client.close();
  await server.stop();
});

/**
 * The README's worker command, as the transcode pool runs it (one job per
 * process), with a 200 ms heartbeat (when the worker learns of a producer's
 * cancel).
 */
async function startTranscoder(queue, out) {
  const args = ['--redis-url', server.url, '--listen', `127.0.0.1:${await freePort()}`,
    '--heartbeat-interval', '200ms', '--shutdown-timeout', '5s', '--queue', queue,
    '--handler', 'exec', '--', process.execPath, path.join(EXAMPLE, 'transcode.mjs')];
  const child = spawn(path.join(binDir(), 'workerpool-worker'), args, {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, TRANSCODE_SIMULATE: '1', TRANSCODE_OUT: out, TRANSCODE_STEP_SECONDS: '0.1' },
  });
  const worker = { log: '' };
  child.stderr.on('data', (d) => {
    worker.log += d.toString();
  });
  worker.stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const done = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
      await done;
      clearTimeout(timer);
    }
  };
  return worker;
}

/** Runs produce.mjs; `onLine` sees each line of its stdout as it comes. Resolves to {code, lines}. */
function produce(queue, src, renditions, onLine = () => {}) {
  const args = [path.join(EXAMPLE, 'produce.mjs'), '--redis', server.url, '--queue', queue, '--src', src,
    '--timeout', '30', ...renditions.flatMap((r) => ['--rendition', r])];
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = [];
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    lines.push(line);
    onLine(line, lines);
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 40000);
  return new Promise((resolve) => child.on('close', (code) => {
    clearTimeout(timer);
    resolve({ code, lines });
  }));
}

const progress = (lines) => lines.map((l) => /^progress (\d+)% \d+p$/.exec(l)).filter(Boolean).map((m) => Number(m[1]));

test('a transcode reports progress and its outputs', async () => {
  const dir = tempDir('video');
  const src = path.join(dir, 'movie.mp4');
  fs.writeFileSync(src, 'not really a video');
  const worker = await startTranscoder('video-done', path.join(dir, 'out'));
  let run;
  try {
    run = await produce('video-done', src, ['720p', '480p', '360p']);
  } finally {
    await worker.stop();
  }
  const { code, lines } = run;
  assert.equal(code, 0, `${lines.join('\n')}\nworker: ${worker.log.slice(-3000)}`);
  assert.match(lines[0], /^[0-9a-f]{32}$/);
  const pcts = progress(lines);
  assert.ok(pcts.length >= 2, lines.join('\n'));
  assert.deepEqual(pcts, [...new Set(pcts)].sort((a, b) => a - b), 'progress in increasing pct');
  assert.match(lines.at(-4), /^done in [0-9.]+ s: 3 output\(s\)$/);
  const outputs = lines.slice(-3).map((l) => l.trim());
  assert.deepEqual(outputs.map((p) => path.basename(p)), ['movie-720p.mp4', 'movie-480p.mp4', 'movie-360p.mp4']);
  for (const p of outputs) {
    assert.equal(path.dirname(p), path.join(dir, 'out', lines[0]));
    assert.ok(fs.statSync(p).isFile(), p);
  }
  const status = await client.status('video-done', lines[0]);
  assert.equal(status.state, 'done');
  assert.deepEqual(status.result.outputs, outputs);
});

test('a missing src is dead at once', async () => {
  const dir = tempDir('video');
  const worker = await startTranscoder('video-dead', path.join(dir, 'out'));
  let run;
  try {
    run = await produce('video-dead', path.join(dir, 'nope.mp4'), []);
  } finally {
    await worker.stop();
  }
  assert.equal(run.code, 1, run.lines.join('\n'));
  assert.equal(run.lines.at(-1), `dead: src not found: ${path.join(dir, 'nope.mp4')}`);
});

test('a cancel stops a running transcode between steps', async () => {
  const dir = tempDir('video');
  const src = path.join(dir, 'long.mp4');
  fs.writeFileSync(src, '');
  const renditions = Array.from({ length: 20 }, (_, i) => `${(i + 1) * 100}p`); // 20 x 0.5 s if not cancelled
  const worker = await startTranscoder('video-cancel', path.join(dir, 'out'));
  let run;
  let asked;
  try {
    run = await produce('video-cancel', src, renditions, (line, lines) => {
      if (line.startsWith('progress ') && asked === undefined) {
        asked = client.cancel('video-cancel', lines[0]);
      }
    });
  } finally {
    await worker.stop();
  }
  const { code, lines } = run;
  assert.deepEqual(await asked, { did: 'requested', state: 'running' });
  assert.equal(code, 1, `${lines.join('\n')}\nworker: ${worker.log.slice(-3000)}`);
  const m = /^cancelled: Error: cancelled at (\d+)%$/.exec(lines.at(-1));
  assert.ok(m, lines.join('\n'));
  assert.ok(Number(m[1]) < 50, `stopped at ${m[1]}%, long after the cancel`);
  const status = await client.status('video-cancel', lines[0]);
  assert.equal(status.state, 'cancelled');
  assert.ok(status.cancelRequestedAtMs);
  assert.ok(fs.readdirSync(path.join(dir, 'out', lines[0])).length < renditions.length);
});
