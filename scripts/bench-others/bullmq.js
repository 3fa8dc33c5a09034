// Drains JOBS preloaded no-op jobs with one BullMQ Worker at CONCURRENCY.
// Prints jobs/s measured from the worker's creation to the last completion.
// With a fourth argument `keep`, jobs are added with BullMQ's defaults (every
// completed job kept, with its return value) and each returns a 100-byte
// value: what workerpool does for jobs that keep their outcome.
const { Queue, Worker } = require('bullmq');

async function main() {
  const [port, jobs, concurrency] = process.argv.slice(2, 5).map(Number);
  const keep = process.argv[5] === 'keep';
  const result = { output: 's3://bucket/videos/2026/12/07/6b1f0c2e9a4d4f0e.mp4', seconds: 12.125, codec: 'h264-high' };
  const opts = keep ? {} : { removeOnComplete: true, removeOnFail: true };
  const connection = { host: '127.0.0.1', port };
  const queue = new Queue('bench', { connection });
  for (let i = 0; i < jobs; i += 1000) {
    const batch = [];
    for (let n = i; n < Math.min(jobs, i + 1000); n++) {
      batch.push({ name: 'noop', data: { n }, opts });
    }
    await queue.addBulk(batch);
  }
  const started = process.hrtime.bigint();
  let done = 0;
  await new Promise((resolve) => {
    const worker = new Worker('bench', async () => (keep ? result : undefined), { connection, concurrency });
    worker.on('completed', () => {
      if (++done === jobs) {
        const seconds = Number(process.hrtime.bigint() - started) / 1e9;
        console.log(`bullmq${keep ? '-keep' : ''} ${concurrency} ${(jobs / seconds).toFixed(0)}`);
        worker.close().then(resolve);
      }
    });
  });
  await queue.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
