// Enqueues twelve notifications and one broken job:
//   node produce.mjs [redis://localhost:6379] [queue]
import { Client } from '@workerpool-dev/client';

const url = process.argv[2] ?? process.env.WORKERPOOL_REDIS_URL ?? 'redis://localhost:6379';
const queue = process.argv[3] ?? 'notifications';

const client = new Client(url);
const jobs = Array.from({ length: 12 }, (_, i) => ({
  task: 'notify',
  data: { user: `user-${i + 1}`, channel: i % 2 ? 'sms' : 'email', ms: 100 },
}));
// The broken one goes in the middle, so it fails while others run.
jobs.splice(5, 0, { task: 'broken', data: { template: 'welcome-v0' } });
const ids = await client.enqueueMany(queue, jobs);
console.log(ids.join('\n'));
await client.close();
