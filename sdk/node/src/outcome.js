'use strict';

// Kept outcomes (docs/queue-contract.md, "Outcomes"): the facts come from
// contract.json, generated from the queue crate, and are never typed here.

const contract = require('../contract.json');

const facts = contract.outcomes;
const STATES = facts.states;
const FINAL_STATES = facts.final_states;

/** `form` (a key form of contract.json) with `{queue}` and `{id}` filled in, in one pass. */
function fill(form, queue, id) {
  return form.replace(/\{(queue|id)\}/g, (_, name) => (name === 'queue' ? queue : id));
}

/** The hash holding job `id`'s outcome. */
function outcomeKey(queue, id) {
  return fill(facts.outcome_key, queue, id);
}

/** The stream that gets one entry when job `id`'s outcome becomes final. */
function outcomeEndKey(queue, id) {
  return fill(facts.outcome_end_key, queue, id);
}

function number(fields, name) {
  const text = fields[name];
  if (text === undefined || !/^\d+$/.test(text)) {
    return null;
  }
  return Number(text);
}

/**
 * The status in `fields` (a HGETALL of the outcome hash), or null when none
 * is kept or it names no state this library knows.
 */
function fromFields(id, fields) {
  if (!fields || !STATES.includes(fields.state)) {
    return null;
  }
  const result = parsed(fields.result);
  return {
    id,
    state: fields.state,
    attempt: number(fields, 'attempt'),
    worker: fields.worker ?? null,
    result,
    resultError: fields.result_error ?? null,
    error: fields.error ?? null,
    nextAtMs: number(fields, 'next_at'),
    updatedAtMs: number(fields, 'updated_at'),
    endedAtMs: number(fields, 'ended_at'),
    progress: parsed(fields.progress),
    progressAtMs: number(fields, 'progress_at'),
    cancelRequestedAtMs: number(fields, 'cancel_requested'),
  };
}

/** A JSON field of the hash, parsed; undefined when it is not there. */
function parsed(text) {
  if (text === undefined) {
    return undefined;
  }
  try {
    return JSON.parse(text);
  } catch {
    // The worker writes JSON it checked; text that does not parse is
    // shown as it is rather than lost.
    return text;
  }
}

function isFinal(status) {
  return status !== null && FINAL_STATES.includes(status.state);
}

module.exports = {
  KEEP_FIELD: facts.keep_field,
  MAX_KEEP_SECONDS: facts.max_keep_seconds,
  // The field a waiter sets before it blocks: the end stream gets its entry
  // only when one did (a stream costs Redis some KB).
  WAITED_FIELD: facts.waited_field,
  MAX_RESULT_BYTES: facts.max_result_bytes,
  MAX_ANSWER_BYTES: facts.max_answer_bytes,
  MAX_PROGRESS_BYTES: facts.max_progress_bytes,
  CANCELLED_KEEP_SECONDS: facts.cancelled_keep_seconds,
  STATES,
  WAIT_SLICE_MS: facts.wait_slice_ms,
  FINAL_STATES,
  outcomeKey,
  outcomeEndKey,
  fromFields,
  isFinal,
};
