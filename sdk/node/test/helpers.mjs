// Test kit: throwaway redis-server processes (one node, TLS, a 3-node
// cluster) on free loopback ports, certificates made with openssl, and the
// real workerpool-worker binary.

import { spawn, spawnSync, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Redis from 'ioredis';

export const SDK = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const ROOT = path.resolve(SDK, '..', '..');
const REDIS_SERVER = process.env.REDIS_SERVER || 'redis-server';
const REDIS_CLI = process.env.REDIS_CLI || 'redis-cli';

/** The folder with workerpool-worker and workerpool, built when missing. */
export function binDir() {
  const dir = process.env.WORKERPOOL_BIN_DIR || path.join(ROOT, 'target', 'debug');
  const missing = ['workerpool-worker', 'workerpool'].filter((b) => !fs.existsSync(path.join(dir, b)));
  if (missing.length && !process.env.WORKERPOOL_BIN_DIR) {
    // The whole workspace with its examples, as its tests build it: one set
    // of features.
    const r = spawnSync('cargo', ['build', '--workspace', '--bins', '--examples'], {
      cwd: ROOT,
      stdio: 'inherit',
    });
    if (r.status !== 0) {
      throw new Error('cargo build --workspace --bins --examples failed');
    }
  } else if (missing.length) {
    throw new Error(`WORKERPOOL_BIN_DIR=${dir} has no ${missing.join(', ')}`);
  }
  return dir;
}

const made = [];
process.on('exit', () => {
  for (const dir of made) {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

/** A fresh temporary folder, removed when the test process exits. */
export function tempDir(what) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `wp-node-${what}-`));
  made.push(dir);
  return dir;
}

/** A TCP port of 127.0.0.1 that was free a moment ago. */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns something other than undefined/false, or fails naming `what` and the last value seen. */
export async function eventually(what, check, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await check();
    if (last !== undefined && last !== false && last !== null) {
      return last;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last seen: ${JSON.stringify(last)}`);
    }
    await sleep(20);
  }
}

function exited(child) {
  return child.exitCode !== null || child.signalCode !== null;
}

async function answers(port, child, tls) {
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    if (exited(child)) {
      return false;
    }
    const ok = await new Promise((resolve) => {
      const sock = net.connect({ host: '127.0.0.1', port }, () => {
        if (tls) {
          // A TLS port accepts the connection: that it listens is enough.
          sock.destroy();
          resolve(true);
          return;
        }
        sock.write('PING\r\n');
      });
      sock.setTimeout(500, () => {
        sock.destroy();
        resolve(false);
      });
      sock.on('data', (d) => {
        sock.destroy();
        resolve(d.toString().startsWith('+PONG'));
      });
      sock.on('error', () => resolve(false));
    });
    if (ok) {
      return true;
    }
    await sleep(20);
  }
  return false;
}

class Server {
  constructor(child, port, dir, args) {
    this.child = child;
    this.port = port;
    this.dir = dir;
    this.args = args;
  }
  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }
  async stop() {
    if (!exited(this.child)) {
      const done = new Promise((r) => this.child.once('exit', r));
      this.child.kill('SIGKILL');
      await done;
    }
  }
  /** Starts the server again, empty, on its port (after `stop`). */
  async start() {
    const child = spawn(REDIS_SERVER, this.args, { stdio: ['ignore', 'ignore', 'inherit'] });
    if (!(await answers(this.port, child, false))) {
      child.kill('SIGKILL');
      throw new Error(`redis-server did not start again on port ${this.port}`);
    }
    this.child = child;
  }
}

/** Starts redis-server with `args` on a free port, trying other ports on a clash. */
async function launch(dir, portArgs, extra, tls) {
  for (let tries = 0; tries < 5; tries++) {
    const port = await (portArgs.cluster ? clusterPort() : freePort());
    const args = tls
      ? ['--port', '0', '--tls-port', String(port)]
      : ['--port', String(port)];
    args.push('--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extra(port));
    const child = spawn(REDIS_SERVER, args, { stdio: ['ignore', 'ignore', 'inherit'] });
    child.on('error', (e) => {
      throw new Error(`redis-server could not start (apt-get install redis-server): ${e.message}`);
    });
    if (await answers(port, child, tls)) {
      return new Server(child, port, dir, args);
    }
    child.kill('SIGKILL');
  }
  throw new Error('redis-server did not start on 5 free ports');
}

/** One redis-server that keeps nothing on disk. */
export async function startRedis() {
  const dir = tempDir('redis');
  return launch(dir, {}, () => [], false);
}

/** A client of a test server for assertions (never the library under test). */
export function raw(url, options = {}) {
  return new Redis(url, { maxRetriesPerRequest: 1, ...options });
}

function openssl(dir, args) {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, in `dir`. */
export function makeCerts(dir) {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1'];
  openssl(dir, ['req', '-x509', '-nodes', '-days', '2', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-subj', '/CN=ca']);
  const signed = (name, ext) => {
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
    openssl(dir, ['req', '-nodes', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`]);
    openssl(dir, ['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial',
      '-days', '2', '-out', `${name}.crt`, '-extfile', `${name}.ext`]);
  };
  signed('server', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
  signed('client', 'extendedKeyUsage=clientAuth\n');
  const p = (f) => path.join(dir, f);
  return { ca: p('ca.crt'), serverCert: p('server.crt'), serverKey: p('server.key'), cert: p('client.crt'), key: p('client.key') };
}

/** A TLS-only redis-server; `mutual` asks clients for a certificate. */
export async function startTlsRedis({ mutual }) {
  const dir = tempDir('tls');
  const certs = makeCerts(dir);
  const server = await launch(dir, {}, () => [
    '--tls-cert-file', certs.serverCert, '--tls-key-file', certs.serverKey,
    '--tls-ca-cert-file', certs.ca, '--tls-auth-clients', mutual ? 'yes' : 'no',
  ], true);
  server.certs = certs;
  Object.defineProperty(server, 'url', { get: () => `rediss://127.0.0.1:${server.port}` });
  return server;
}

/** A Redis Sentinel watching the primary on `primaryPort` as `name`. */
export async function startSentinel(primaryPort, name) {
  const dir = tempDir('sentinel');
  for (let tries = 0; tries < 5; tries++) {
    const port = await freePort();
    const conf = path.join(dir, `sentinel-${port}.conf`);
    fs.writeFileSync(conf, [
      `port ${port}`, 'bind 127.0.0.1', `dir ${dir}`,
      `sentinel monitor ${name} 127.0.0.1 ${primaryPort} 1`,
      `sentinel down-after-milliseconds ${name} 1000`, '',
    ].join('\n'));
    const child = spawn(REDIS_SERVER, [conf, '--sentinel'], { stdio: ['ignore', 'ignore', 'inherit'] });
    if (await answers(port, child, false)) {
      return new Server(child, port, dir);
    }
    child.kill('SIGKILL');
  }
  throw new Error('redis-server --sentinel did not start on 5 free ports');
}

/** A free port whose cluster bus port (+10000) is free too. */
async function clusterPort() {
  for (;;) {
    const port = await freePort();
    if (port >= 55000) {
      continue;
    }
    const busFree = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port + 10000, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (busFree) {
      return port;
    }
  }
}

/** Three primaries joined with redis-cli --cluster create, every slot covered. */
export async function startCluster() {
  const dir = tempDir('cluster');
  const nodes = [];
  for (let i = 0; i < 3; i++) {
    nodes.push(await launch(dir, { cluster: true }, (port) => [
      '--cluster-enabled', 'yes', '--cluster-node-timeout', '1000', '--cluster-config-file', `nodes-${port}.conf`,
    ], false));
  }
  const create = spawnSync(REDIS_CLI, ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'], { encoding: 'utf8' });
  if (create.status !== 0) {
    await Promise.all(nodes.map((n) => n.stop()));
    throw new Error(`redis-cli --cluster create failed: ${create.stdout}${create.stderr}`);
  }
  await eventually('every node to see the cluster ok', async () => {
    for (const n of nodes) {
      const c = raw(n.url);
      try {
        const info = await c.cluster('INFO');
        if (!info.includes('cluster_state:ok') || !info.includes('cluster_slots_assigned:16384')) {
          return false;
        }
      } finally {
        c.disconnect();
      }
    }
    return true;
  }, 30000);
  return {
    nodes,
    url: nodes[0].url,
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
}

/**
 * Starts workerpool-worker on `url` with `args` (queue, concurrency,
 * handler...). Its stderr is kept in `log`.
 */
export async function startWorker(url, args, env = {}) {
  const bin = path.join(binDir(), 'workerpool-worker');
  const listen = `127.0.0.1:${await freePort()}`;
  // A heartbeat of 1 s unless `args` names one.
  const heartbeat = args.includes('--heartbeat-interval') ? [] : ['--heartbeat-interval', '1s'];
  const child = spawn(bin, ['--redis-url', url, '--listen', listen, ...heartbeat, ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...env },
  });
  const worker = { child, log: '' };
  child.stderr.on('data', (d) => {
    worker.log += d.toString();
  });
  worker.stop = async () => {
    if (!exited(child)) {
      const done = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
      await done;
      clearTimeout(timer);
    }
  };
  return worker;
}

/** Runs the workerpool CLI; returns its stdout. */
export function cli(args) {
  return execFileSync(path.join(binDir(), 'workerpool'), args, { encoding: 'utf8' });
}

/** Calls of each command since the server started: `INFO commandstats` as {name: calls}. */
export async function commandCalls(redis) {
  const info = await redis.info('commandstats');
  const out = {};
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    out[m[1]] = Number(m[2]);
  }
  return out;
}
