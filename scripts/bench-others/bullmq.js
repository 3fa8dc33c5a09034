// Drains JOBS preloaded no-op jobs with one BullMQ Worker at CONCURRENCY.
// Prints jobs/s measured from the worker's creation to the last completion.
const { Queue, Worker } = require('bullmq');

async function main() {
  const [port, jobs, concurrency] = process.argv.slice(2).map(Number);
  const connection = { host: '127.0.0.1', port };
  const queue = new Queue('bench', { connection });
  for (let i = 0; i < jobs; i += 1000) {
    const batch = [];
    for (let n = i; n < Math.min(jobs, i + 1000); n++) {
      batch.push({ name: 'noop', data: { n }, opts: { removeOnComplete: true, removeOnFail: true } });
    }
    await queue.addBulk(batch);
  }
  const started = process.hrtime.bigint();
  let done = 0;
  await new Promise((resolve) => {
    const worker = new Worker('bench', async () => {}, { connection, concurrency });
    worker.on('completed', () => {
      if (++done === jobs) {
        const seconds = Number(process.hrtime.bigint() - started) / 1e9;
        console.log(`bullmq ${concurrency} ${(jobs / seconds).toFixed(0)}`);
        worker.close().then(resolve);
      }
    });
  });
  await queue.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
