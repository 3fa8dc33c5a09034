'use strict';

// Job data as JSON, refusing what JSON.stringify would throw on (BigInt,
// cycles) or silently change (NaN and Infinity become null, functions and
// symbols vanish), with the path of the bad value in the message.

function walk(value, path, seen, fail) {
  if (value !== null && typeof value === 'object' && typeof value.toJSON === 'function') {
    value = value.toJSON();
  }
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return value;
    case 'number':
      if (!Number.isFinite(value)) {
        throw fail(`${path} is ${value}, which JSON cannot hold; use null or a string`);
      }
      return value;
    case 'bigint':
      throw fail(
        `${path} is a BigInt (${value}n), which JSON cannot hold; pass a Number (exact up to 2^53) or a string`,
      );
    case 'function':
    case 'symbol':
      throw fail(`${path} is a ${typeof value}, which JSON cannot hold`);
    case 'undefined':
      return undefined;
    default:
      break;
  }
  if (value === null) {
    return null;
  }
  if (seen.has(value)) {
    throw fail(`${path} refers back to an object that contains it (a cycle), which JSON cannot hold`);
  }
  seen.add(value);
  let out;
  if (Array.isArray(value)) {
    out = value.map((v, i) => {
      const w = walk(v, `${path}[${i}]`, seen, fail);
      if (w === undefined) {
        throw fail(`${path}[${i}] is undefined, which JSON cannot hold in an array; use null`);
      }
      return w;
    });
  } else {
    out = {};
    for (const key of Object.keys(value)) {
      const shown = /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
      const w = walk(value[key], shown, seen, fail);
      // An undefined property is left out, as JSON.stringify does.
      if (w !== undefined) {
        out[key] = w;
      }
    }
  }
  seen.delete(value);
  return out;
}

/** `value` as compact JSON text; `fail(message)` makes the error to throw. */
function serialize(value, path, fail) {
  const plain = walk(value, path, new Set(), fail);
  if (plain === undefined) {
    throw fail(`${path} is undefined: leave it out or pass null`);
  }
  return JSON.stringify(plain);
}

module.exports = { serialize };
