'use strict';

/** The base of every error this library raises. */
class WorkerpoolError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
  }
}

/** The client was given a URL or options it cannot use. */
class ConfigError extends WorkerpoolError {}

/** A queue name the worker would refuse (or, on a cluster, one without a hash tag). */
class InvalidQueueError extends WorkerpoolError {}

/** A job (task, data or an option of it) that cannot be enqueued as given. */
class InvalidJobError extends WorkerpoolError {}

/**
 * `job.progress(value)` got a value JSON cannot hold, or one whose JSON text
 * is over contract.json's `max_progress_bytes`; nothing was sent.
 */
class InvalidProgressError extends WorkerpoolError {}

/** Redis could not be reached, or the connection broke before the answer came. */
class ConnectionError extends WorkerpoolError {}

/** Redis answered a command with an error (WRONGTYPE, NOPERM, OOM, ...). */
class RedisError extends WorkerpoolError {}

/**
 * A wait ran out of time before the job ended (done, dead or cancelled). `last` is the
 * job's status as last read, or null when no outcome was kept for it.
 */
class WaitTimeout extends WorkerpoolError {
  constructor(message, last, options) {
    super(message, options);
    this.last = last;
  }
}

/**
 * Thrown by a task handler: the job fails for good and is dead-lettered at
 * once, without the retries an ordinary error gets.
 */
class Permanent extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'Permanent';
  }
}

module.exports = {
  WorkerpoolError,
  ConfigError,
  InvalidQueueError,
  InvalidJobError,
  InvalidProgressError,
  ConnectionError,
  RedisError,
  WaitTimeout,
  Permanent,
};
