// The video platform's transcode handler in Node.js: one App task, `transcode`.
//
//   workerpool-worker --redis-url redis://localhost:6379 --queue video:transcode \
//     --handler exec -- node examples/video-platform/node/transcode.mjs
//
// A job's data is {"src": <a path or URL>, "renditions": ["720p", "480p", ...]}.
// Each rendition is made in turn: with ffmpeg on PATH and `src` a local file,
// `ffmpeg -y -i src -vf scale=-2:H out` (H from "720p"); otherwise (a URL, no
// ffmpeg, or TRANSCODE_SIMULATE=1) a few short sleeps and a small file in
// place of the video. The task reports {pct, rendition} with job.progress as
// it goes and returns {outputs: [paths...], seconds}, the job's result.
//
// Outputs go to $TRANSCODE_OUT/<job id>/ (default: a folder under the
// system's temp dir). A missing `src` fails for good (Permanent:
// dead-lettered at once). A producer's cancel (client.cancel) aborts
// job.signal: the task stops between steps (and kills a running ffmpeg) and
// throws "cancelled at N%", which ends the job `cancelled`, with one job
// per process (the pool's concurrency: 1) as with several.
//
// The example imports the library from this checkout (sdk/node, after
// `npm ci` there); in a project of your own: import ... from '@workerpool-dev/client'.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { App, Permanent } from '../../../sdk/node/index.mjs';

const SIM_STEPS = 5;
const SIM_STEP_MS = Number(process.env.TRANSCODE_STEP_SECONDS ?? '0.1') * 1000;

function outDir(jobId) {
  const base = process.env.TRANSCODE_OUT || path.join(os.tmpdir(), 'video-transcode');
  const dir = path.join(base, jobId ?? 'local');
  fs.mkdirSync(dir, { recursive: true });
  return dir;
}

function height(rendition) {
  const m = typeof rendition === 'string' ? /^([1-9][0-9]{1,3})p$/.exec(rendition) : null;
  if (!m) {
    throw new Permanent(`rendition ${JSON.stringify(rendition)} is not a height such as "720p"`);
  }
  return Number(m[1]);
}

const isUrl = (src) => /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//.test(src);

function onPath(program) {
  return spawnSync(program, ['-version'], { stdio: 'ignore' }).status === 0;
}

/** A stand-in for ffmpeg: SIM_STEPS short sleeps, then a small file. */
async function simulate(src, rendition, out, step, signal) {
  for (let i = 0; i < SIM_STEPS; i++) {
    if (signal.aborted) {
      return;
    }
    await sleep(SIM_STEP_MS);
    step((i + 1) / SIM_STEPS);
  }
  fs.writeFileSync(out, `simulated ${rendition} rendition of ${src}\n`);
}

/** The source's duration from ffprobe, for progress within a rendition. */
function probeSeconds(src) {
  const r = spawnSync('ffprobe', ['-v', 'error', '-show_entries', 'format=duration', '-of', 'csv=p=0', src],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 30_000 });
  const seconds = Number.parseFloat(r.stdout ?? '');
  return r.status === 0 && seconds > 0 ? seconds : null;
}

/**
 * ffmpeg -y -i src -vf scale=-2:H out, reporting from its -progress lines;
 * killed when job.signal aborts. Its stdout (the progress) is a pipe of ours,
 * so it never writes on the worker's protocol.
 */
async function ffmpeg(src, h, out, duration, step, signal) {
  const child = spawn('ffmpeg', ['-nostdin', '-y', '-loglevel', 'error', '-i', src, '-vf', `scale=-2:${h}`,
    '-progress', 'pipe:1', '-nostats', out], { stdio: ['ignore', 'pipe', 'pipe'], signal });
  let err = '';
  child.stderr.on('data', (d) => {
    err = (err + d.toString()).slice(-2000);
  });
  child.on('error', () => {}); // an abort: the exit below says the rest
  const exited = new Promise((resolve) => child.on('close', resolve));
  for await (const line of readline.createInterface({ input: child.stdout })) {
    const [key, value] = line.trim().split('=');
    if (key === 'out_time_us' && duration && /^\d+$/.test(value)) {
      step(Math.min(Number(value) / 1e6 / duration, 1));
    }
  }
  const code = await exited;
  if (code !== 0 && !signal.aborted) {
    throw new Error(`ffmpeg exited with ${code}: ${err}`);
  }
}

const app = new App();

app.task('transcode', async (data, job) => {
  const started = performance.now();
  if (typeof data?.src !== 'string' || !data.src) {
    throw new Permanent('data.src is missing: the path or URL of the video');
  }
  const { src } = data;
  const renditions = data.renditions ?? ['720p', '480p'];
  if (!Array.isArray(renditions) || renditions.length === 0) {
    throw new Permanent('data.renditions is not a list such as ["720p", "480p"]');
  }
  const heights = renditions.map(height);
  if (!isUrl(src) && !fs.statSync(src, { throwIfNoEntry: false })?.isFile()) {
    throw new Permanent(`src not found: ${src}`);
  }
  const real = process.env.TRANSCODE_SIMULATE !== '1' && !isUrl(src) && onPath('ffmpeg');
  const duration = real && onPath('ffprobe') ? probeSeconds(src) : null;
  const dir = outDir(job.id);
  const stem = path.parse(src.replace(/\/+$/, '')).name || 'video';
  let pct = 0;
  const outputs = [];
  job.progress({ pct: 0, rendition: renditions[0] });
  for (let i = 0; i < renditions.length; i++) {
    const rendition = renditions[i];
    const out = path.join(dir, `${stem}-${rendition}.mp4`);
    const step = (fraction) => {
      pct = Math.floor((100 * (i + fraction)) / renditions.length);
      job.progress({ pct, rendition });
    };
    if (real) {
      await ffmpeg(src, heights[i], out, duration, step, job.signal);
    } else {
      await simulate(src, rendition, out, step, job.signal);
    }
    if (job.signal.aborted) {
      throw new Error(`cancelled at ${pct}%`);
    }
    step(1);
    outputs.push(out);
    console.log(`job ${job.id}: ${rendition} -> ${out}`); // the worker's log (stderr)
  }
  return { outputs, seconds: Math.round(performance.now() - started) / 1000 };
});

app.run();
