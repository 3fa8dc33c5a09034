// The package as users get it: `require` and `import` by name give the
// same objects, `npm pack` ships the Lua files, the types and both entry
// points, and the Lua files are the repository's own, byte for byte.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT, SDK, tempDir } from './helpers.mjs';

const pkg = JSON.parse(fs.readFileSync(path.join(SDK, 'package.json'), 'utf8'));
/** The scripts the client runs, and every piece they use. */
const RUN = ['enqueue.lua', 'cancel.lua'];
const SHIPPED = ['cancel.lua', 'enqueue.lua', 'guard.lua', 'now.lua', 'outcome.lua', 'unique.lua'];

/** A project folder whose node_modules holds the package (a link to the checkout). */
function project() {
  const dir = tempDir('project');
  fs.mkdirSync(path.join(dir, 'node_modules', '@workerpool-dev'), { recursive: true });
  fs.symlinkSync(SDK, path.join(dir, 'node_modules', '@workerpool-dev', 'client'), 'dir');
  return dir;
}

function node(dir, file, code) {
  fs.writeFileSync(path.join(dir, file), code);
  return execFileSync(process.execPath, [file], { cwd: dir, encoding: 'utf8' });
}

test('CommonJS require and ESM import by package name give the same classes', () => {
  const dir = project();
  const cjs = node(dir, 'a.cjs', `
    const lib = require('@workerpool-dev/client');
    const { Client, App, Permanent, InvalidJobError, WaitTimeout, WorkerpoolError, version } = lib;
    console.log(JSON.stringify({ version, client: typeof Client, app: typeof new App().task,
      permanent: new Permanent('x') instanceof Error,
      hierarchy: new InvalidJobError('x') instanceof WorkerpoolError && new WaitTimeout('x', null) instanceof WorkerpoolError }));
  `);
  assert.deepEqual(JSON.parse(cjs), { version: pkg.version, client: 'function', app: 'function', permanent: true, hierarchy: true });
  const esm = node(dir, 'b.mjs', `
    import { Client, ConfigError, version } from '@workerpool-dev/client';
    import lib from '@workerpool-dev/client';
    import { createRequire } from 'node:module';
    const cjs = createRequire(import.meta.url)('@workerpool-dev/client');
    let error;
    try { new Client('http://x'); } catch (e) { error = e; }
    console.log(JSON.stringify({ version, same: Client === cjs.Client && lib.Client === Client,
      instance: error instanceof cjs.ConfigError && error instanceof ConfigError }));
  `);
  assert.deepEqual(JSON.parse(esm), { version: pkg.version, same: true, instance: true });
});

test('npm pack ships the Lua files, contract.json, the types and both entry points, and no tests', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json'], { cwd: SDK, encoding: 'utf8' });
  const files = JSON.parse(out)[0].files.map((f) => f.path);
  for (const f of ['package.json', 'README.md', 'index.mjs', 'index.d.ts', 'contract.json', 'src/index.js', 'src/client.js',
    'src/app.js', 'src/outcome.js', ...SHIPPED.map((f) => `lua/${f}`)]) {
    assert.ok(files.includes(f), `${f} is not in the package: ${files.join(', ')}`);
  }
  for (const f of files) {
    assert.ok(!f.startsWith('test/') && !f.startsWith('node_modules/') && !f.startsWith('examples/'), `${f} should not ship`);
  }
  assert.equal(pkg.exports['.'].require, './src/index.js');
  assert.equal(pkg.exports['.'].import, './index.mjs');
  assert.equal(pkg.exports['.'].types, './index.d.ts');
});

test('the shipped Lua files are the queue crate\'s, byte for byte, and cover what the scripts it runs use', () => {
  const source = path.join(ROOT, 'queue', 'src', 'lua');
  const shipped = fs.readdirSync(path.join(SDK, 'lua')).sort();
  assert.deepEqual(shipped, SHIPPED);
  for (const f of shipped) {
    assert.ok(fs.readFileSync(path.join(SDK, 'lua', f)).equals(fs.readFileSync(path.join(source, f))),
      `sdk/node/lua/${f} differs from queue/src/lua/${f}: run scripts/sync-sdk-lua.sh`);
  }
  for (const script of RUN) {
    const uses = fs.readFileSync(path.join(source, script), 'utf8').split('\n')[0];
    assert.match(uses, /^-- uses: /);
    const pieces = uses.replace(/^-- uses: /, '').split(',').map((p) => p.trim().split(' as ')[0]);
    for (const p of pieces) {
      assert.ok(shipped.includes(p), `${script} uses ${p}, which the package does not ship`);
    }
  }
});

test('each script is composed as the queue crate composes it: its pieces, then itself', async () => {
  const { createRequire } = await import('node:module');
  const { script } = createRequire(import.meta.url)('../src/lua.js');
  const crypto = await import('node:crypto');
  const source = path.join(ROOT, 'queue', 'src', 'lua');
  for (const name of RUN) {
    const text = fs.readFileSync(path.join(source, name), 'utf8');
    const pieces = text.split('\n')[0].replace(/^-- uses: /, '').split(',').map((p) => p.trim());
    const expected = pieces.map((p) => fs.readFileSync(path.join(source, p), 'utf8')).join('') + text;
    const got = script(name);
    assert.equal(got.source, expected, name);
    assert.equal(got.sha, crypto.createHash('sha1').update(expected).digest('hex'));
  }
});
