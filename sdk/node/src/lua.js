'use strict';

// The queue's Lua scripts ship inside the package (lua/, copied byte for
// byte from the workerpool repository's queue/src/lua/ by
// scripts/sync-sdk-lua.sh): the scripts the client runs, enqueue.lua and
// cancel.lua, and the pieces they use. Any of them is composed by name
// (`script('cancel.lua')`). A script is the
// files its first line names (`-- uses: a.lua, b.lua as f(args)`) followed
// by the script itself, composed exactly as the Rust side composes it, so
// both load the same script (same SHA1) into Redis.

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');

const DIR = path.join(__dirname, '..', 'lua');

function read(file) {
  return fs.readFileSync(path.join(DIR, file), 'utf8');
}

function compose(file) {
  const text = read(file);
  const first = text.split('\n', 1)[0];
  let source = '';
  const uses = first.match(/^-- uses: (.*)$/);
  if (uses) {
    for (const piece of uses[1].split(',').map((p) => p.trim())) {
      const at = piece.indexOf(' as ');
      if (at >= 0) {
        source += `local function ${piece.slice(at + 4)}\n${read(piece.slice(0, at))}\nend\n`;
      } else {
        source += read(piece);
      }
    }
  }
  return source + text;
}

const cache = new Map();

/** `{source, sha}` of a composed script, read once. */
function script(file) {
  let s = cache.get(file);
  if (!s) {
    const source = compose(file);
    s = { source, sha: crypto.createHash('sha1').update(source).digest('hex') };
    cache.set(file, s);
  }
  return s;
}

module.exports = { script, compose, DIR };
