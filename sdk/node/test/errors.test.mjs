// Bad input gets the library's own errors, saying what to fix, and sends
// nothing to Redis.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  Client,
  ConfigError,
  ConnectionError,
  InvalidJobError,
  InvalidQueueError,
  RedisError,
  WorkerpoolError,
} from '../index.mjs';
import { eventually, freePort, raw, startRedis } from './helpers.mjs';

let server;
let redis;
let client;

before(async () => {
  server = await startRedis();
  redis = raw(server.url);
  client = new Client(server.url);
});

after(async () => {
  await client.close();
  redis.disconnect();
  await server.stop();
});

function rejects(promise, type, pattern) {
  return assert.rejects(promise, (e) => {
    assert.ok(e instanceof type, `${e.name}: ${e.message} is not a ${type.name}`);
    assert.ok(e instanceof WorkerpoolError);
    assert.match(e.message, pattern);
    return true;
  });
}

describe('queue names', () => {
  const cases = [
    ['', /must be non-empty and without white space/],
    ['my queue', /must be non-empty and without white space/],
    ['emails:dead', /"emails:dead" is the dead-letter list of the queue "emails".*rename it, for example "emails-dead"/],
    ['emails:stats:processed', /is a counter of the queue "emails"/],
    ['a:b:processing:x', /would share the keys of the queue "a:b" \(a:b:processing:…\)/],
  ];
  for (const [name, pattern] of cases) {
    test(`refused: ${JSON.stringify(name)}`, async () => {
      await rejects(client.enqueue(name, 't'), InvalidQueueError, pattern);
      await rejects(client.enqueueMany(name, [{ task: 't' }]), InvalidQueueError, pattern);
    });
  }

  test('accepted: colons and hash tags that name no key of another queue', async () => {
    for (const name of ['emails', 'mail:high', '{mail}:low', 'a:deadline']) {
      assert.match(await client.enqueue(name, 't'), /^[0-9a-f]{32}$/);
    }
    await rejects(client.enqueue(42, 't'), InvalidQueueError, /must be a string/);
  });
});

describe('jobs', () => {
  const cyclic = { a: {} };
  cyclic.a.back = cyclic;
  const cases = [
    ['no task', [undefined, {}], /task must be a non-empty string/],
    ['task not a string', [5, {}], /task must be a non-empty string.*got 5/],
    ['BigInt data', ['t', { n: 10n }], /data\.n is a BigInt \(10n\)/],
    ['a cycle', ['t', cyclic], /data\.a\.back refers back to an object that contains it \(a cycle\)/],
    ['NaN', ['t', [1, NaN]], /data\[1\] is NaN, which JSON cannot hold/],
    ['Infinity', ['t', { 'a b': Infinity }], /data\["a b"\] is Infinity/],
    ['a function', ['t', { f() {} }], /data\.f is a function/],
    ['undefined in an array', ['t', [undefined]], /data\[0\] is undefined/],
    ['uniqueFor 0', ['t', null, { uniqueKey: 'k', uniqueFor: 0 }], /uniqueFor must be a whole number of seconds above 0, got 0/],
    ['uniqueFor negative', ['t', null, { uniqueKey: 'k', uniqueFor: -5 }], /uniqueFor must be a whole number of seconds above 0/],
    ['uniqueFor fractional', ['t', null, { uniqueKey: 'k', uniqueFor: 1.5 }], /whole number of seconds above 0, got 1.5/],
    ['uniqueFor alone', ['t', null, { uniqueFor: 10 }], /uniqueFor is set without uniqueKey/],
    ['empty uniqueKey', ['t', null, { uniqueKey: '' }], /uniqueKey must be a non-empty string/],
    ['delay and runAt', ['t', null, { delay: 1, runAt: new Date() }], /give delay or runAt, not both/],
    ['negative delay', ['t', null, { delay: -1 }], /delay must be a whole number of milliseconds, 0 or more/],
    ['delay as a string', ['t', null, { delay: '5s' }], /delay must be a whole number of milliseconds.*"5s"/],
    ['invalid Date', ['t', null, { runAt: new Date('nope') }], /runAt is an invalid Date/],
    ['runAt as a string', ['t', null, { runAt: '2030-01-01' }], /runAt must be a Date or unix milliseconds/],
    ['empty id', ['t', null, { id: '' }], /id must be a non-empty string/],
    ['misspelt option', ['t', null, { dealy: 5 }], /unknown option "dealy"; known: id, delay, runAt, uniqueKey, uniqueFor/],
  ];
  for (const [what, args, pattern] of cases) {
    test(`refused: ${what}`, async () => {
      await rejects(client.enqueue('jobs', ...args), InvalidJobError, pattern);
    });
  }

  test('nothing reached Redis, and Dates in data are written as JSON writes them', async () => {
    assert.equal(await redis.exists('jobs'), 0);
    await client.enqueue('jobs', 't', { at: new Date(0) });
    assert.deepEqual(JSON.parse(await redis.lindex('jobs', 0)).data, { at: '1970-01-01T00:00:00.000Z' });
  });

  test('enqueueMany takes an array of job objects', async () => {
    await rejects(client.enqueueMany('jobs', 'x'), InvalidJobError, /jobs must be an array/);
    await rejects(client.enqueueMany('jobs', [null]), InvalidJobError, /^job 1: a job must be an object/);
    await rejects(client.enqueueMany('jobs', [{ task: 't', when: 1 }]), InvalidJobError, /^job 1: unknown field "when"/);
  });
});

describe('client', () => {
  test('URLs and options it cannot use', () => {
    const cases = [
      [['http://localhost:6379'], /the scheme "http" is not one workerpool speaks/],
      [['localhost:6379'], /is not a Redis URL/],
      [[''], /must be a string such as redis:\/\/localhost:6379/],
      [['redis://:s3cret@host:99999'], /redis:\/\/:\*\*\*@host:99999: port "99999" is not a number from 1 to 65535/],
      [['redis://host/abc'], /the database "abc" is not a number/],
      [['redis://localhost', { ca: '/x.pem' }], /TLS options \(ca\) were given with a plain URL .*use rediss:\/\//],
      [['rediss://localhost', { cert: '/c.pem' }], /a client certificate \(cert\) was given without its key/],
      [['rediss://localhost', { key: '/k.pem' }], /a client key \(key\) was given without its certificate/],
      [['rediss://localhost', { ca: '/no/such/ca.pem' }], /ca "\/no\/such\/ca.pem" cannot be read/],
      [['redis+sentinel://h:26379/my master'], /the first path segment must be the primary's name/],
      [['redis+sentinel://h:26379/m?password=x'], /unknown query parameter "password"/],
      [['redis+sentinel://h:26379/m', { cluster: true }], /names Sentinel, which is never a Redis Cluster/],
      [['redis://h/2', { cluster: true }], /a Redis Cluster has only database 0/],
      [['redis://h', { tls: true }], /unknown option "tls"; known: ca, cert, key, cluster, insecureSkipVerify/],
      [['redis://h', { cluster: 'yes' }], /cluster must be true/],
    ];
    for (const [args, pattern] of cases) {
      assert.throws(() => new Client(...args), (e) => e instanceof ConfigError && pattern.test(e.message), String(args[0]));
    }
    // Accepted forms, not connected until used.
    new Client('redis+sentinel://:pw@10.0.0.1:26379,[fd00::1]:26380,sent/mymaster/2?sentinel_password=x');
    new Client('redis://user:p%40ss@localhost:6380/3');
  });

  test('an unreachable Redis is a ConnectionError naming the URL without its password', async () => {
    const port = await freePort();
    for (const options of [{}, { cluster: false }, { cluster: true }]) {
      const c = new Client(`redis://:s3cret@127.0.0.1:${port}`, options);
      try {
        await rejects(c.enqueue('{q}', 't'), ConnectionError, new RegExp(`cannot reach (the )?Redis( Cluster)? at redis://:\\*\\*\\*@127.0.0.1:${port}: .*ECONNREFUSED`));
      } finally {
        await c.close();
      }
    }
  });

  test('calls during an outage fail at once with a ConnectionError; the next after it works', async () => {
    const own = await startRedis();
    const c = new Client(own.url);
    try {
      await c.enqueue('outage', 't');
      await own.stop();
      await rejects(c.enqueue('outage', 't'), ConnectionError, /cannot reach Redis at redis:\/\/127\.0\.0\.1:\d+: .*(ECONNREFUSED|closed)/);
      await own.start();
      const id = await eventually('an enqueue to work again after the restart', async () => {
        try {
          return await c.enqueue('outage', 't');
        } catch (e) {
          assert.ok(e instanceof ConnectionError, `${e.name}: ${e.message}`);
          return null;
        }
      });
      const r = raw(own.url);
      assert.equal(JSON.parse(await r.lindex('outage', 0)).id, id);
      r.disconnect();
    } finally {
      await c.close();
      await own.stop();
    }
  });

  test('a key of the wrong type is a RedisError saying what to do', async () => {
    await redis.set('taken', 'x');
    await rejects(client.enqueue('taken', 't'), RedisError, /WRONGTYPE/);
    await rejects(client.enqueue('taken', 't', null, { uniqueKey: 'k' }), RedisError, /key taken holds a string where the queue contract keeps a list; nothing was changed/);
  });

  test('a closed client says so', async () => {
    const c = new Client(server.url);
    await c.enqueue('q', 't');
    await c.close();
    await rejects(c.enqueue('q', 't'), WorkerpoolError, /the client is closed/);
  });
});
