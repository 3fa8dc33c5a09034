// Enqueues one transcode, follows its progress and prints how it ended:
//
//   node examples/video-platform/node/produce.mjs --redis redis://localhost:6379 \
//     --queue video:transcode --src movie.mp4 --rendition 720p --rendition 480p
//
// Prints the job's id, then a line each time its progress changes (read with
// status every 0.5 s), then the outcome from wait: the outputs of a done job,
// the error of a dead or cancelled one. Exits 0 when the job is done, 1
// otherwise (dead, cancelled, or not ended within --timeout seconds).
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, WaitTimeout } from '../../../sdk/node/index.mjs';

const KEEP = 86400; // the outcome stays readable for a day after the job ends

const { values: args } = parseArgs({
  options: {
    redis: { type: 'string', default: 'redis://localhost:6379' },
    queue: { type: 'string', default: 'video:transcode' },
    src: { type: 'string' },
    rendition: { type: 'string', multiple: true },
    timeout: { type: 'string', default: '60' },
  },
});
if (!args.src) {
  console.error('usage: produce.mjs --src PATH [--redis URL] [--queue Q] [--rendition 720p ...] [--timeout 60]');
  process.exit(2);
}
const data = { src: args.src, renditions: args.rendition ?? ['720p', '480p'] };
const timeoutMs = Number(args.timeout) * 1000;
const deadline = Date.now() + timeoutMs;
const firstLine = (error) => (error ? String(error).split('\n')[0] : '(no error kept)');

const client = new Client(args.redis);
let code = 1;
try {
  const id = await client.enqueue(args.queue, 'transcode', data, { keepResultFor: KEEP });
  console.log(id);
  let shown;
  while (Date.now() < deadline) {
    const status = await client.status(args.queue, id);
    if (status === null || ['done', 'dead', 'cancelled'].includes(status.state)) {
      break;
    }
    const text = JSON.stringify(status.progress);
    if (status.state === 'running' && status.progress !== undefined && text !== shown) {
      shown = text;
      const p = status.progress;
      const line = typeof p === 'object' && p !== null ? `progress ${p.pct}% ${p.rendition ?? ''}` : `progress ${p}%`;
      console.log(line.trimEnd());
    }
    await sleep(500);
  }
  let end;
  try {
    end = await client.wait(args.queue, id, { timeoutMs: Math.max(deadline - Date.now(), 100) });
  } catch (e) {
    if (!(e instanceof WaitTimeout)) {
      throw e;
    }
    console.log(`not ended after ${args.timeout} s (state ${e.last?.state ?? 'unknown'})`);
  }
  if (end?.state === 'done') {
    const outputs = end.result?.outputs ?? [];
    console.log(`done in ${end.result?.seconds ?? '?'} s: ${outputs.length} output(s)`);
    for (const p of outputs) {
      console.log(`  ${p}`);
    }
    code = 0;
  } else if (end) {
    console.log(`${end.state}: ${firstLine(end.error)}`);
  }
} finally {
  await client.close();
}
process.exit(code);
