'use strict';

const { currentTrace } = require('./trace');
const fs = require('node:fs');
const crypto = require('node:crypto');
const Redis = require('ioredis');
const { script } = require('./lua');
const {
  ConfigError,
  ConnectionError,
  InvalidJobError,
  InvalidQueueError,
  RedisError,
  WaitTimeout,
  WorkerpoolError,
} = require('./errors');
const outcome = require('./outcome');
const { checkQueueName, clusterProblem } = require('./queue');
const { serialize } = require('./json');

/** How long a unique job holds its key when `uniqueFor` is not given (seconds). */
const DEFAULT_UNIQUE_FOR = 3600;
/** Jobs per script call or push, as the workerpool CLI sends them. */
const BATCH = 500;
/** How long a measured offset to the Redis clock is trusted (ms). */
const CLOCK_TTL = 10 * 60 * 1000;
/** How long `wait` waits when no timeoutMs is given (ms), as `workerpool job wait`. */
const DEFAULT_WAIT_MS = 60 * 1000;
/**
 * How long `wait` pauses when the end stream has its entry but the outcome
 * is not final yet (a job run again after it ended), so it never spins.
 */
const RECHECK_MS = 100;

const JOB_OPTIONS = ['id', 'delay', 'runAt', 'uniqueKey', 'uniqueFor', 'keepResultFor'];
const WAIT_OPTIONS = ['timeoutMs'];
const MANY_FIELDS = ['task', 'data', ...JOB_OPTIONS];
const CLIENT_OPTIONS = ['ca', 'cert', 'key', 'cluster', 'insecureSkipVerify'];

/** A fresh job id: 32 lowercase hex digits, as the worker and the CLI make them. */
function newId() {
  return crypto.randomBytes(16).toString('hex');
}

/** `url` with its passwords replaced by `***`, for messages. */
function redact(url) {
  return String(url)
    .replace(/^([a-z+]+:\/\/[^:@/]*:)[^@/]*@/i, '$1***@')
    .replace(/([?&]sentinel_password=)[^&]*/gi, '$1***');
}

function decode(part, what, shown) {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new ConfigError(`the ${what} in ${shown} is not valid percent-encoding`);
  }
}

function parseHostPort(text, defaultPort, shown) {
  let host;
  let port;
  const v6 = text.match(/^\[([^\]]+)\](?::(.*))?$/);
  if (v6) {
    host = v6[1];
    port = v6[2];
  } else {
    const at = text.lastIndexOf(':');
    host = at >= 0 ? text.slice(0, at) : text;
    port = at >= 0 ? text.slice(at + 1) : undefined;
  }
  if (!host) {
    throw new ConfigError(`${shown}: a host is missing in ${JSON.stringify(text)}`);
  }
  let n = defaultPort;
  if (port !== undefined && port !== '') {
    if (!/^\d+$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
      throw new ConfigError(`${shown}: port ${JSON.stringify(port)} is not a number from 1 to 65535`);
    }
    n = Number(port);
  }
  return { host, port: n };
}

function parseDb(text, shown) {
  if (text === undefined || text === '') {
    return 0;
  }
  if (!/^\d+$/.test(text)) {
    throw new ConfigError(`${shown}: the database ${JSON.stringify(text)} is not a number`);
  }
  return Number(text);
}

/**
 * The parts of a workerpool Redis URL: `redis://`, `rediss://`,
 * `redis+sentinel://` or `rediss+sentinel://` (the forms the worker takes).
 */
function parseUrl(url) {
  if (typeof url !== 'string' || url === '') {
    throw new ConfigError(
      'the Redis URL must be a string such as redis://localhost:6379 (rediss:// for TLS, ' +
        'redis+sentinel://host:26379/<primary name> for Sentinel)',
    );
  }
  const shown = redact(url);
  const m = url.match(/^([a-z+]+):\/\/(?:([^@/?]*)@)?([^/?]*)(\/[^?]*)?(?:\?(.*))?$/i);
  if (!m) {
    throw new ConfigError(
      `${shown} is not a Redis URL: use redis://[user:password@]host[:port][/db], rediss://… for TLS ` +
        'or redis+sentinel://host1[:26379][,host2…]/<primary name>[/<db>]',
    );
  }
  const [, rawScheme, auth, hosts, pathPart = '', query = ''] = m;
  const scheme = rawScheme.toLowerCase();
  const known = ['redis', 'rediss', 'redis+sentinel', 'rediss+sentinel'];
  if (!known.includes(scheme)) {
    throw new ConfigError(
      `${shown}: the scheme ${JSON.stringify(rawScheme)} is not one workerpool speaks; use ` +
        `${known.map((k) => k + '://').join(', ')}`,
    );
  }
  let username;
  let password;
  if (auth !== undefined) {
    const colon = auth.indexOf(':');
    if (colon >= 0) {
      username = decode(auth.slice(0, colon), 'user name', shown) || undefined;
      password = decode(auth.slice(colon + 1), 'password', shown) || undefined;
    } else {
      // A user name alone, as the worker reads `redis://user@host`.
      username = decode(auth, 'user name', shown) || undefined;
    }
  }
  const params = new URLSearchParams(query);
  const tls = scheme.startsWith('rediss');
  const segments = pathPart.split('/').slice(1);
  if (scheme.endsWith('+sentinel')) {
    if (!hosts) {
      throw new ConfigError(`${shown}: name the sentinels, host1[:26379][,host2[:26379]…]`);
    }
    const sentinels = hosts.split(',').map((h) => parseHostPort(h, 26379, shown));
    const name = segments[0];
    if (!name || !/^[A-Za-z0-9._-]+$/.test(name)) {
      throw new ConfigError(
        `${shown}: the first path segment must be the primary's name as the sentinels monitor it ` +
          '(letters, digits, -, _ and .), as in redis+sentinel://host:26379/mymaster',
      );
    }
    if (segments.length > 2 || (segments.length === 2 && segments[1] === '' && pathPart.endsWith('//'))) {
      throw new ConfigError(`${shown}: the path is /<primary name>[/<db>], nothing more`);
    }
    for (const key of params.keys()) {
      if (key !== 'sentinel_password' && key !== 'sentinel_username') {
        throw new ConfigError(
          `${shown}: unknown query parameter ${JSON.stringify(key)}; known: sentinel_password, sentinel_username`,
        );
      }
    }
    return {
      sentinel: true,
      tls,
      sentinels,
      name,
      db: parseDb(segments[1], shown),
      username,
      password,
      sentinelPassword: params.get('sentinel_password') ?? undefined,
      sentinelUsername: params.get('sentinel_username') ?? undefined,
      shown,
    };
  }
  if (query) {
    throw new ConfigError(`${shown}: a ${scheme}:// URL takes no query parameters`);
  }
  if (!hosts) {
    throw new ConfigError(`${shown}: a host is missing, as in redis://localhost:6379`);
  }
  if (segments.length > 1) {
    throw new ConfigError(`${shown}: the path is /<db>, nothing more`);
  }
  const { host, port } = parseHostPort(hosts, 6379, shown);
  return { sentinel: false, tls, host, port, db: parseDb(segments[0], shown), username, password, shown };
}

function readPem(file, what) {
  if (typeof file !== 'string' || file === '') {
    throw new ConfigError(`${what} must be the path of a PEM file`);
  }
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new ConfigError(`${what} ${JSON.stringify(file)} cannot be read: ${e.message}`);
  }
}

/** ioredis's `tls` option from the client's options, or undefined for plain TCP. */
function tlsOptions(parsed, options) {
  const given = ['ca', 'cert', 'key'].filter((k) => options[k] !== undefined && options[k] !== null);
  if (!parsed.tls) {
    if (given.length || options.insecureSkipVerify) {
      const names = given.concat(options.insecureSkipVerify ? ['insecureSkipVerify'] : []);
      throw new ConfigError(
        `TLS options (${names.join(', ')}) were given with a plain URL (${parsed.shown}); ` +
          'use rediss:// (or rediss+sentinel://) to speak TLS, or drop them',
      );
    }
    return undefined;
  }
  const haveCert = options.cert !== undefined && options.cert !== null;
  const haveKey = options.key !== undefined && options.key !== null;
  if (haveCert !== haveKey) {
    throw new ConfigError(
      haveCert
        ? 'a client certificate (cert) was given without its key: give key too'
        : 'a client key (key) was given without its certificate: give cert too',
    );
  }
  const tls = {};
  if (options.ca !== undefined && options.ca !== null) {
    tls.ca = readPem(options.ca, 'ca');
  }
  if (haveCert) {
    tls.cert = readPem(options.cert, 'cert');
    tls.key = readPem(options.key, 'key');
  }
  if (options.insecureSkipVerify) {
    tls.rejectUnauthorized = false;
  }
  return tls;
}

/** The ioredis settings every connection of a client shares. */
function common() {
  return {
    lazyConnect: true,
    // A producer wants an error it can act on, not a call that hangs while
    // an unreachable server is retried forever.
    maxRetriesPerRequest: 1,
    connectTimeout: 10000,
    retryStrategy: (times) => Math.min(times * 100, 2000),
  };
}

function checkOptions(given, known, what) {
  if (given === undefined || given === null) {
    return {};
  }
  if (typeof given !== 'object' || Array.isArray(given)) {
    throw new InvalidJobError(`${what} must be an object`);
  }
  for (const key of Object.keys(given)) {
    if (!known.includes(key)) {
      throw new InvalidJobError(`${what}: unknown option ${JSON.stringify(key)}; known: ${known.join(', ')}`);
    }
  }
  return given;
}

function present(v) {
  return v !== undefined && v !== null;
}

/**
 * Checks one job and returns what enqueueing it needs, before anything is
 * sent. `at` says which job it is in messages ('' or 'job 3: ').
 */
function prepare(at, task, data, opts) {
  if (typeof task !== 'string' || task === '') {
    throw new InvalidJobError(`${at}task must be a non-empty string naming the handler's task, got ${describe(task)}`);
  }
  let dataText;
  if (data !== undefined) {
    dataText = serialize(data, 'data', (m) => new InvalidJobError(`${at}${m}`));
  }
  const { id, delay, runAt, uniqueKey, uniqueFor, keepResultFor } = opts;
  if (present(id) && (typeof id !== 'string' || id === '')) {
    throw new InvalidJobError(`${at}id must be a non-empty string (or left out for a fresh one), got ${describe(id)}`);
  }
  if (present(delay) && present(runAt)) {
    throw new InvalidJobError(`${at}give delay or runAt, not both`);
  }
  if (present(delay) && !(Number.isSafeInteger(delay) && delay >= 0)) {
    throw new InvalidJobError(`${at}delay must be a whole number of milliseconds, 0 or more, got ${describe(delay)}`);
  }
  let runAtMs;
  if (present(runAt)) {
    if (runAt instanceof Date) {
      runAtMs = runAt.getTime();
      if (Number.isNaN(runAtMs)) {
        throw new InvalidJobError(`${at}runAt is an invalid Date`);
      }
    } else if (Number.isSafeInteger(runAt) && runAt >= 0) {
      runAtMs = runAt;
    } else {
      throw new InvalidJobError(`${at}runAt must be a Date or unix milliseconds (a whole number), got ${describe(runAt)}`);
    }
    if (runAtMs < 0) {
      throw new InvalidJobError(`${at}runAt must not be before 1970`);
    }
  }
  if (present(uniqueKey) && (typeof uniqueKey !== 'string' || uniqueKey === '')) {
    throw new InvalidJobError(`${at}uniqueKey must be a non-empty string, got ${describe(uniqueKey)}`);
  }
  if (present(uniqueFor)) {
    if (!present(uniqueKey)) {
      throw new InvalidJobError(`${at}uniqueFor is set without uniqueKey: give the key the job holds`);
    }
    if (!(Number.isSafeInteger(uniqueFor) && uniqueFor > 0)) {
      throw new InvalidJobError(
        `${at}uniqueFor must be a whole number of seconds above 0, got ${describe(uniqueFor)}`,
      );
    }
  }
  if (present(keepResultFor)) {
    const max = outcome.MAX_KEEP_SECONDS;
    const k = keepResultFor;
    if (!(typeof k === 'number' && Number.isFinite(k) && k > 0 && k <= max)) {
      throw new InvalidJobError(
        `${at}keepResultFor must be a number of seconds above 0 and at most ${max} (the longest an outcome is kept), ` +
          `got ${describe(keepResultFor)}`,
      );
    }
  }
  return {
    task,
    dataText,
    id: present(id) ? id : newId(),
    delay: present(delay) ? delay : undefined,
    runAtMs,
    uniqueKey: present(uniqueKey) ? uniqueKey : undefined,
    uniqueFor: present(uniqueFor) ? uniqueFor : undefined,
    keep: present(keepResultFor) ? keepResultFor : undefined,
    trace: currentTrace(),
  };
}

function describe(v) {
  if (typeof v === 'string') {
    return JSON.stringify(v);
  }
  if (typeof v === 'bigint') {
    return `${v}n (a BigInt)`;
  }
  if (v instanceof Date) {
    return `Date(${v.toString()})`;
  }
  if (typeof v === 'number' || typeof v === 'boolean' || v === null || v === undefined) {
    return String(v);
  }
  return `a ${typeof v === 'object' ? (Array.isArray(v) ? 'array' : 'object') : typeof v}`;
}

/**
 * The job's payload as the workerpool CLI writes it: the producer's fields,
 * then `id` and `enqueued_at` last, so the worker's taking script can stamp
 * it without parsing it.
 */
function payload(job, now) {
  let text = `{"task":${JSON.stringify(job.task)}`;
  if (job.dataText !== undefined) {
    text += `,"data":${job.dataText}`;
  }
  if (job.runAt !== undefined) {
    text += `,"run_at":${job.runAt}`;
  }
  if (job.uniqueKey !== undefined) {
    text += `,"unique_key":${JSON.stringify(job.uniqueKey)}`;
  }
  if (job.uniqueFor !== undefined) {
    text += `,"unique_for":${job.uniqueFor}`;
  }
  if (job.keep !== undefined) {
    text += `,${JSON.stringify(outcome.KEEP_FIELD)}:${JSON.stringify(job.keep)}`;
  }
  if (job.trace !== undefined) {
    text += `,"traceparent":${JSON.stringify(job.trace.traceparent)}`;
    if (job.trace.tracestate !== undefined) {
      text += `,"tracestate":${JSON.stringify(job.trace.tracestate)}`;
    }
  }
  return `${text},"id":${JSON.stringify(job.id)},"enqueued_at":${now}}`;
}

/**
 * A keep in whole milliseconds (at least 1), as the queue crate reads the
 * field: to the nanosecond, then cut to the millisecond.
 */
function keepMs(seconds) {
  return Math.max(1, Math.floor(Math.round(seconds * 1e9) / 1e6));
}

/**
 * The cancel script's reply `[did, state]` as the queue crate's `Cancel`
 * serializes: `{did: 'removed', from}`, `{did: 'requested', state}`,
 * `{did: 'final', state}` or `{did: 'unknown'}`.
 */
function cancelled(reply) {
  const [did, state] = reply.map(String);
  if (did === 'removed') {
    return { did, from: state };
  }
  if (did === 'requested' || did === 'final') {
    return { did, state };
  }
  return { did: 'unknown' };
}

function isReplyError(e) {
  return e && (e.name === 'ReplyError' || e.constructor?.name === 'ReplyError');
}

/** Producer of workerpool jobs on one Redis (a node, a cluster or a Sentinel primary). */
class Client {
  /**
   * @param {string} url redis://, rediss://, redis+sentinel:// or rediss+sentinel://
   * @param {{ca?: string, cert?: string, key?: string, cluster?: boolean, insecureSkipVerify?: boolean}} [options]
   */
  constructor(url, options = {}) {
    if (options === null || typeof options !== 'object' || Array.isArray(options)) {
      throw new ConfigError('the options must be an object: { ca, cert, key, cluster, insecureSkipVerify }');
    }
    for (const key of Object.keys(options)) {
      if (!CLIENT_OPTIONS.includes(key)) {
        throw new ConfigError(`unknown option ${JSON.stringify(key)}; known: ${CLIENT_OPTIONS.join(', ')}`);
      }
    }
    this._parsed = parseUrl(url);
    const cluster = options.cluster;
    if (cluster !== undefined && cluster !== null && typeof cluster !== 'boolean') {
      throw new ConfigError('cluster must be true (a Redis Cluster), false (one node) or left out (ask the server)');
    }
    if (this._parsed.sentinel && cluster === true) {
      throw new ConfigError(`${this._parsed.shown} names Sentinel, which is never a Redis Cluster: drop cluster: true`);
    }
    if (cluster === true && this._parsed.db !== 0) {
      throw new ConfigError(`${this._parsed.shown}: a Redis Cluster has only database 0; drop the /${this._parsed.db}`);
    }
    this._tls = tlsOptions(this._parsed, options);
    this._mode = cluster === true ? 'cluster' : cluster === false ? 'standalone' : 'auto';
    this._redis = null;
    this._connecting = null;
    this._isCluster = false;
    this._lastError = null;
    this._clock = null;
    this._closed = false;
    /** The connections of the waits under way, each blocked on its own. */
    this._blockers = new Set();
  }

  /** Whether the client talks to a Redis Cluster (known once connected). */
  get isCluster() {
    return this._isCluster;
  }

  _watch(redis) {
    // ioredis reports connection errors as events; the last one explains a
    // command that failed for want of a connection.
    redis.on('error', (e) => {
      this._lastError = e;
    });
    return redis;
  }

  _standalone() {
    const p = this._parsed;
    if (p.sentinel) {
      return new Redis({
        ...common(),
        sentinels: p.sentinels,
        name: p.name,
        db: p.db,
        username: p.username,
        password: p.password,
        sentinelUsername: p.sentinelUsername,
        sentinelPassword: p.sentinelPassword,
        tls: this._tls,
        sentinelTLS: this._tls,
        enableTLSForSentinelMode: Boolean(this._tls),
        // A few rounds over the sentinels, then the call fails with what
        // they said rather than waiting for ever.
        sentinelRetryStrategy: (times) => (times > 3 ? null : Math.min(times * 100, 1000)),
      });
    }
    return new Redis({
      ...common(),
      host: p.host,
      port: p.port,
      db: p.db,
      username: p.username,
      password: p.password,
      tls: this._tls,
    });
  }

  _cluster() {
    const p = this._parsed;
    return new Redis.Cluster([{ host: p.host, port: p.port }], {
      lazyConnect: true,
      enableOfflineQueue: true,
      maxRedirections: 16,
      clusterRetryStrategy: (times) => (times > 3 ? null : Math.min(times * 100, 1000)),
      // Nodes are reached at the addresses the cluster announces; with TLS
      // the certificate is checked against those.
      dnsLookup: (address, callback) => callback(null, address),
      redisOptions: {
        ...common(),
        username: p.username,
        password: p.password,
        tls: this._tls,
      },
    });
  }

  async _connection() {
    if (this._closed) {
      throw new WorkerpoolError('the client is closed');
    }
    if (this._redis) {
      return this._redis;
    }
    if (!this._connecting) {
      this._connecting = this._open().finally(() => {
        this._connecting = null;
      });
    }
    return this._connecting;
  }

  async _open() {
    const p = this._parsed;
    if (this._mode === 'cluster') {
      const c = this._watch(this._cluster());
      await this._connect(c);
      this._isCluster = true;
      this._redis = c;
      return c;
    }
    const r = this._watch(this._standalone());
    if (this._mode === 'auto' && !p.sentinel) {
      // As the worker does: ask the server whether it is a cluster.
      let info = '';
      try {
        info = await r.info('cluster');
      } catch (e) {
        if (!isReplyError(e)) {
          r.disconnect();
          throw this._wrap(e, 'INFO cluster');
        }
        // A server that refuses INFO is taken as one node; say
        // `cluster: true` for a cluster that does.
      }
      if (/^cluster_enabled:1\s*$/m.test(info)) {
        r.disconnect();
        if (p.db !== 0) {
          throw new ConfigError(`${p.shown} is a Redis Cluster, which has only database 0; drop the /${p.db}`);
        }
        const c = this._watch(this._cluster());
        await this._connect(c);
        this._isCluster = true;
        this._redis = c;
        return c;
      }
    } else {
      await this._connect(r);
    }
    this._redis = r;
    return r;
  }

  /** Connects `redis`, or stops its reconnecting and throws why it failed. */
  async _connect(redis) {
    try {
      await redis.connect();
    } catch (e) {
      redis.disconnect();
      if (redis instanceof Redis.Cluster) {
        // ioredis says only that no node gave the slot map; one plain
        // connection to the node of the URL says why (refused, TLS, auth).
        const why = await this._probe();
        if (why) {
          throw new ConnectionError(`cannot reach the Redis Cluster at ${this._parsed.shown}: ${why}`, { cause: e });
        }
      }
      throw this._wrap(e, 'connect');
    }
  }

  /** Why one connection to the URL's node fails, or null when it works. */
  async _probe() {
    const p = this._parsed;
    const probe = new Redis({
      host: p.host,
      port: p.port,
      username: p.username,
      password: p.password,
      tls: this._tls,
      lazyConnect: true,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      connectTimeout: 5000,
    });
    let failure = null;
    probe.on('error', (e) => {
      failure = failure ?? e;
    });
    try {
      await probe.connect();
      await probe.ping();
      return null;
    } catch (e) {
      return (failure ?? e).message;
    } finally {
      probe.disconnect();
    }
  }

  _wrap(e, what) {
    if (e instanceof WorkerpoolError) {
      return e;
    }
    if (isReplyError(e)) {
      return new RedisError(`Redis refused ${what} at ${this._parsed.shown}: ${e.message}`, { cause: e });
    }
    // ioredis's own message ("Reached the max retries per request limit")
    // says less than the connection's last error, which says why.
    const why = (this._lastError ?? e).message;
    return new ConnectionError(`cannot reach Redis at ${this._parsed.shown}: ${why}`, { cause: e });
  }

  async _run(fn, what) {
    try {
      return await fn();
    } catch (e) {
      throw this._wrap(e, what);
    }
  }

  /** The Redis server's clock now (unix ms), from an offset measured with TIME. */
  async _now(redis) {
    const local = Date.now();
    if (!this._clock || local - this._clock.at > CLOCK_TTL) {
      const before = Date.now();
      const [secs, micros] = await this._run(() => redis.time(), 'TIME');
      const after = Date.now();
      // The server read its clock between `before` and `after`: taking the
      // middle keeps the offset within half the round trip of the truth.
      const server = Number(secs) * 1000 + Math.floor(Number(micros) / 1000);
      this._clock = { offset: server - Math.round((before + after) / 2), at: after };
    }
    return Date.now() + this._clock.offset;
  }

  _checkQueue(queue) {
    const problem = checkQueueName(queue);
    if (problem) {
      throw new InvalidQueueError(problem);
    }
    if (this._isCluster) {
      const c = clusterProblem(queue);
      if (c) {
        throw new InvalidQueueError(c);
      }
    }
  }

  /**
   * Enqueues one job; resolves to its id, or null when a job holding the
   * same unique key is already in the queue.
   */
  async enqueue(queue, task, data, options) {
    const opts = checkOptions(options, JOB_OPTIONS, 'enqueue options');
    this._checkQueue(queue);
    const job = prepare('', task, data, opts);
    const [id] = await this._send(queue, [job]);
    return id;
  }

  /**
   * Enqueues many jobs in one round trip, in order; resolves to their ids
   * (null for each refused duplicate). Nothing is sent when a job is bad.
   */
  async enqueueMany(queue, jobs) {
    this._checkQueue(queue);
    if (!Array.isArray(jobs)) {
      throw new InvalidJobError(
        'jobs must be an array of { task, data, id, delay, runAt, uniqueKey, uniqueFor, keepResultFor }',
      );
    }
    const prepared = jobs.map((j, i) => {
      const at = `job ${i + 1}: `;
      if (j === null || typeof j !== 'object' || Array.isArray(j)) {
        throw new InvalidJobError(`${at}a job must be an object { task, data, ... }; nothing was enqueued`);
      }
      for (const key of Object.keys(j)) {
        if (!MANY_FIELDS.includes(key)) {
          throw new InvalidJobError(
            `${at}unknown field ${JSON.stringify(key)}; known: ${MANY_FIELDS.join(', ')}; nothing was enqueued`,
          );
        }
      }
      try {
        return prepare(at, j.task, j.data, j);
      } catch (e) {
        e.message += '; nothing was enqueued';
        throw e;
      }
    });
    if (prepared.length === 0) {
      return [];
    }
    return this._send(queue, prepared);
  }

  async _send(queue, jobs) {
    const redis = await this._connection();
    this._checkQueue(queue);
    const now = await this._now(redis);
    for (const job of jobs) {
      job.runAt = job.delay !== undefined ? now + job.delay : job.runAtMs;
      job.payload = payload(job, now);
    }
    const scheduled = `${queue}:scheduled`;
    const pipeline = redis.pipeline();
    const calls = [];
    if (jobs.some((j) => j.uniqueKey !== undefined || j.keep !== undefined)) {
      // Any unique or kept job: every job of the call goes through the
      // script, in order, so a duplicate is refused in the same step that
      // checks it, and a kept job's outcome is written `waiting` (or
      // `scheduled`) in the step that enqueues it. As the queue crate's
      // admin::enqueue: seven ARGV per job, and a kept job's outcome hash
      // and end stream appended to KEYS (its ARGV names the hash's 1-based
      // position).
      const { sha } = script('enqueue.lua');
      for (let i = 0; i < jobs.length; i += BATCH) {
        const args = [];
        const keys = [queue, scheduled, `${queue}:unique`, `${queue}:unique:expiry`];
        for (const j of jobs.slice(i, i + BATCH)) {
          const hold = j.uniqueKey !== undefined ? (j.uniqueFor ?? DEFAULT_UNIQUE_FOR) * 1000 : 0;
          args.push(j.payload, j.runAt !== undefined ? String(j.runAt) : '', j.id, j.uniqueKey ?? '', String(hold));
          if (j.keep === undefined) {
            args.push('', '');
          } else {
            keys.push(outcome.outcomeKey(queue, j.id), outcome.outcomeEndKey(queue, j.id));
            args.push(String(keys.length - 1), String(keepMs(j.keep)));
          }
        }
        pipeline.evalsha(sha, keys.length, ...keys, ...args);
        calls.push({ keys, args, from: i });
      }
      const results = await this._exec(pipeline);
      const out = jobs.map((j) => j.id);
      for (let c = 0; c < calls.length; c++) {
        let [err, reply] = results[c];
        if (err && /NOSCRIPT/.test(err.message)) {
          // The server's script cache was empty (a restart, a failover):
          // EVAL loads the script and runs it; nothing ran before.
          const { source } = script('enqueue.lua');
          reply = await this._run(
            () => redis.eval(source, calls[c].keys.length, ...calls[c].keys, ...calls[c].args),
            'the enqueue script',
          );
          err = null;
        }
        if (err) {
          throw this._wrap(err, 'the enqueue script');
        }
        reply.forEach((ok, k) => {
          if (Number(ok) !== 1) {
            out[calls[c].from + k] = null;
          }
        });
      }
      return out;
    }
    const immediate = jobs.filter((j) => j.runAt === undefined);
    const later = jobs.filter((j) => j.runAt !== undefined);
    for (let i = 0; i < immediate.length; i += BATCH) {
      pipeline.lpush(queue, ...immediate.slice(i, i + BATCH).map((j) => j.payload));
    }
    for (let i = 0; i < later.length; i += BATCH) {
      const members = [];
      for (const j of later.slice(i, i + BATCH)) {
        members.push(String(j.runAt), j.payload);
      }
      pipeline.zadd(scheduled, ...members);
    }
    const results = await this._exec(pipeline);
    for (const [err] of results) {
      if (err) {
        throw this._wrap(err, 'the push');
      }
    }
    return jobs.map((j) => j.id);
  }

  _checkId(id) {
    if (typeof id !== 'string' || id === '') {
      throw new InvalidJobError(`the job id must be a non-empty string, got ${describe(id)}`);
    }
  }

  /**
   * The kept outcome of job `id` (one HGETALL): null when none is kept (the
   * job was enqueued without keepResultFor and no worker that keeps
   * outcomes has taken it yet, or its outcome expired). A job enqueued with
   * keepResultFor reads `waiting` (or `scheduled`) from the moment it is
   * enqueued.
   */
  async status(queue, id) {
    this._checkQueue(queue);
    this._checkId(id);
    const redis = await this._connection();
    this._checkQueue(queue);
    const fields = await this._run(() => redis.hgetall(outcome.outcomeKey(queue, id)), 'HGETALL');
    return outcome.fromFields(id, fields);
  }

  /**
   * Cancels job `id` of `queue` (the queue contract's cancel.lua, one call)
   * and resolves to what it did, as the queue crate's `Cancel` serializes:
   *
   * - `{did: 'removed', from: 'waiting'}` (or 'scheduled', 'retrying'): the
   *   job was taken out of where it waited and will not run; its outcome is
   *   'cancelled' (kept its own keepResultFor, or a day when it kept none),
   *   its unique key is freed and its waiters wake.
   * - `{did: 'requested', state: 'running'}`: it runs (or a worker took it
   *   and has not started it); its worker is asked to stop it, which aborts
   *   the task's `job.signal` when it runs with others in its process. A
   *   task that finishes anyway ends as it would have.
   * - `{did: 'final', state: 'done'}` (or 'dead', 'cancelled'): it ended
   *   already; left alone.
   * - `{did: 'unknown'}`: no job of that id waits, and no outcome is kept
   *   for it.
   *
   * Finding a job that waits scans the queue and its scheduled and retry
   * sets on the server (O(depth)), as removing a job by id costs.
   */
  async cancel(queue, id) {
    this._checkQueue(queue);
    this._checkId(id);
    const redis = await this._connection();
    this._checkQueue(queue);
    const keys = [queue, `${queue}:scheduled`, `${queue}:retry`, `${queue}:unique`, `${queue}:unique:expiry`,
      outcome.outcomeKey(queue, id), outcome.outcomeEndKey(queue, id)];
    const args = [id, String(outcome.CANCELLED_KEEP_SECONDS * 1000)];
    const { sha, source } = script('cancel.lua');
    const reply = await this._run(async () => {
      try {
        return await redis.evalsha(sha, keys.length, ...keys, ...args);
      } catch (e) {
        if (!(isReplyError(e) && /NOSCRIPT/.test(e.message))) {
          throw e;
        }
        // The server's script cache was empty (a restart, a failover):
        // EVAL loads the script and runs it; nothing ran before.
        return redis.eval(source, keys.length, ...keys, ...args);
      }
    }, 'the cancel script');
    return cancelled(reply);
  }

  /**
   * Waits until job `id` ends and resolves to its final status: state
   * 'done' (with its result), 'dead' (with its error) or 'cancelled' (a
   * dead or cancelled job resolves, it does not reject). Rejects with WaitTimeout (its `last`
   * the status as last read, or null) when `timeoutMs` (default 60 s)
   * passes first. Blocks on the job's end stream (XREAD BLOCK) on a
   * connection of its own, in slices, never polling.
   */
  async wait(queue, id, options) {
    const given = checkOptions(options, WAIT_OPTIONS, 'wait options').timeoutMs;
    const timeoutMs = present(given) ? given : DEFAULT_WAIT_MS;
    if (!(typeof timeoutMs === 'number' && Number.isFinite(timeoutMs) && timeoutMs >= 0)) {
      throw new InvalidJobError(`timeoutMs must be a number of milliseconds, 0 or more, got ${describe(timeoutMs)}`);
    }
    this._checkQueue(queue);
    this._checkId(id);
    const deadline = Date.now() + timeoutMs;
    const end = outcome.outcomeEndKey(queue, id);
    let blocker = null;
    let woke = false;
    let marking = true;
    const key = outcome.outcomeKey(queue, id);
    try {
      for (;;) {
        // Marked before it is read: a settlement after the mark adds the
        // entry this wait blocks on, one before it is seen final here. A user
        // the ACL refuses the mark waits out each slice.
        if (marking) {
          const redis = await this._connection();
          try {
            await redis.hset(key, outcome.WAITED_FIELD, 1);
            await redis.pexpire(key, outcome.MAX_KEEP_SECONDS * 1000, 'NX');
          } catch (e) {
            if (!String(e && e.message).startsWith('NOPERM')) {
              throw this._wrap(e, 'HSET');
            }
            marking = false;
          }
        }
        const seen = await this.status(queue, id);
        if (outcome.isFinal(seen)) {
          return seen;
        }
        let left = deadline - Date.now();
        if (woke && left > 0) {
          // The stream has its entry, yet the outcome is not final: the job
          // runs again. Pause rather than spin on a read that returns at once.
          await new Promise((r) => setTimeout(r, Math.min(left, RECHECK_MS)));
          left = deadline - Date.now();
        }
        if (left <= 0) {
          throw new WaitTimeout(
            seen === null
              ? `job ${JSON.stringify(id)} of queue ${JSON.stringify(queue)} did not end within ${timeoutMs} ms, ` +
                  'and no outcome is kept for it (was it enqueued with keepResultFor?)'
              : `job ${JSON.stringify(id)} of queue ${JSON.stringify(queue)} did not end within ${timeoutMs} ms; ` +
                  `it is ${seen.state}`,
            seen,
          );
        }
        if (blocker === null) {
          blocker = await this._blocker();
        }
        // XREAD's BLOCK is in whole milliseconds; 0 would block for ever.
        const slice = Math.max(1, Math.ceil(Math.min(left, outcome.WAIT_SLICE_MS)));
        const b = blocker;
        let got;
        try {
          got = await b.xread('COUNT', 1, 'BLOCK', slice, 'STREAMS', end, '0-0');
        } catch (e) {
          if (this._closed) {
            throw new ConnectionError(`the client was closed while waiting for job ${JSON.stringify(id)}`, { cause: e });
          }
          throw this._wrap(e, 'XREAD');
        }
        woke = got !== null;
      }
    } finally {
      if (blocker !== null) {
        this._blockers.delete(blocker);
        blocker.disconnect();
      }
    }
  }

  /** A connection of its own for one wait (a blocking read blocks its connection). */
  async _blocker() {
    const redis = await this._connection();
    const b = this._watch(redis.duplicate());
    this._blockers.add(b);
    try {
      await this._connect(b);
    } catch (e) {
      this._blockers.delete(b);
      throw e;
    }
    if (this._closed) {
      this._blockers.delete(b);
      b.disconnect();
      throw new WorkerpoolError('the client is closed');
    }
    return b;
  }

  async _exec(pipeline) {
    const results = await this._run(() => pipeline.exec(), 'the pipeline');
    if (!results) {
      throw new ConnectionError(`the connection to ${this._parsed.shown} closed before Redis answered`);
    }
    for (const [err] of results) {
      if (err && !isReplyError(err)) {
        throw this._wrap(err, 'the pipeline');
      }
    }
    return results;
  }

  /** Closes the connection(s); the client cannot be used afterwards. */
  async close() {
    this._closed = true;
    for (const b of this._blockers) {
      // A wait under way rejects with ConnectionError.
      b.disconnect();
    }
    this._blockers.clear();
    if (this._connecting) {
      try {
        await this._connecting;
      } catch {
        // Nothing to close.
      }
    }
    const r = this._redis;
    this._redis = null;
    if (!r) {
      return;
    }
    if (r.status === 'ready') {
      try {
        await r.quit();
        return;
      } catch {
        // Fall through: drop the socket.
      }
    }
    r.disconnect();
  }
}

module.exports = { Client, parseUrl, redact, newId, DEFAULT_UNIQUE_FOR };
