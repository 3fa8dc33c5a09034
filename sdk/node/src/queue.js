'use strict';

// Queue names, checked as the worker checks them (queue/src/keys.rs), so a
// job is never pushed where no worker would take it.

const contract = require('../contract.json');

/**
 * The words after a colon that name a queue's other keys, and a queue's own
 * keys by their suffix with what each is: from contract.json, generated
 * from the queue crate.
 */
const KEY_PARTS = contract.queue_names.key_parts;
const KEY_NAMES = contract.queue_names.key_names;

/** Why `name` cannot be a queue's name, or null. */
function checkQueueName(name) {
  if (typeof name !== 'string') {
    return `the queue name must be a string, got ${name === null ? 'null' : typeof name}`;
  }
  if (name.trim() === '' || /\s/.test(name)) {
    return `queue name ${JSON.stringify(name)} must be non-empty and without white space`;
  }
  const parts = name.split(':');
  let at = -1;
  for (let i = 1; i < parts.length; i++) {
    if (KEY_PARTS.includes(parts[i])) {
      at = i;
      break;
    }
  }
  if (at < 0) {
    return null;
  }
  const owner = parts.slice(0, at).join(':');
  const what = KEY_NAMES[parts.slice(at).join(':')];
  const how = what
    ? `is ${what} of the queue ${JSON.stringify(owner)}`
    : `would share the keys of the queue ${JSON.stringify(owner)} (${owner}:${parts[at]}:…)`;
  return (
    `queue name ${JSON.stringify(name)} ${how}; no part of a queue name after a colon may be ` +
    `${KEY_PARTS.join(', ')}: rename it, for example ${JSON.stringify(name.replaceAll(':', '-'))}`
  );
}

/** The hash tag of a key: the text between the first `{` and the next `}`, when not empty. */
function hashTag(key) {
  const open = key.indexOf('{');
  if (open < 0) {
    return null;
  }
  const close = key.indexOf('}', open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : null;
}

/** Why `name` cannot be used on a Redis Cluster, or null. */
function clusterProblem(name) {
  if (hashTag(name) !== null) {
    return null;
  }
  const tag = name.split(':')[0] || 'jobs';
  const rest = name.slice(tag.length).replace(/^:+/, '');
  const renamed = rest ? `{${tag}}:${rest}` : `{${tag}}`;
  return (
    `Redis is a cluster and queue ${name} has no hash tag, so its keys would land in different slots; ` +
    `name queues with a hash tag in braces, for example ${renamed}`
  );
}

module.exports = { checkQueueName, clusterProblem, hashTag, KEY_PARTS };
