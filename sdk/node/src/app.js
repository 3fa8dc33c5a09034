'use strict';

// The exec handler protocol (workerpool-worker --handler exec): one job per
// line of JSON on stdin, one answer per line on stdout, one job at a time.
// The worker runs `--concurrency` copies of the process for parallelism.

const readline = require('node:readline');
const { Permanent, WorkerpoolError } = require('./errors');
const { withJobTrace } = require('./trace');

/** How much of a line that is not a job an answer quotes. */
const QUOTE = 200;
/**
 * The longest error an answer carries (characters): the worker takes
 * answer lines up to 1 MiB and replaces a process that writes a longer one.
 */
const ERROR_CHARS = 64 * 1024;

function cap(text) {
  return text.length > ERROR_CHARS ? `${text.slice(0, ERROR_CHARS)}… (cut at ${ERROR_CHARS} characters)` : text;
}

function errorText(e) {
  if (e instanceof Error) {
    const head = `${e.name}: ${e.message}`;
    // The stack starts with the name and message; keep both when a custom
    // stack does not.
    if (typeof e.stack === 'string' && e.stack.length > 0) {
      return e.stack.startsWith(head) || e.stack.includes(e.message) ? e.stack : `${head}\n${e.stack}`;
    }
    return head;
  }
  try {
    return typeof e === 'string' ? e : `thrown value: ${JSON.stringify(e) ?? String(e)}`;
  } catch {
    return `thrown value: ${String(e)}`;
  }
}

function quote(line) {
  return JSON.stringify(line.length > QUOTE ? `${line.slice(0, QUOTE)}…` : line);
}

/** The job as a handler sees it. */
class Job {
  constructor(raw) {
    /** The whole object the worker sent, stamp included. */
    this.raw = raw;
    /** Idempotency key, kept across retries. */
    this.id = raw.id;
    /** This attempt's number, from 1. */
    this.attempt = raw.attempt;
    this.task = raw.task;
    this.data = raw.data;
  }
}

/** A handler process: register tasks, then `run()`. */
class App {
  constructor() {
    this._tasks = new Map();
    this._running = false;
  }

  /** Registers `fn(data, job)` for `name`; its promise resolving means done. */
  task(name, fn) {
    if (typeof name !== 'string' || name === '') {
      throw new WorkerpoolError('a task name must be a non-empty string');
    }
    if (typeof fn !== 'function') {
      throw new WorkerpoolError(`task ${JSON.stringify(name)}: the handler must be a function (data, job) => …`);
    }
    if (this._tasks.has(name)) {
      throw new WorkerpoolError(`task ${JSON.stringify(name)} is registered twice`);
    }
    this._tasks.set(name, fn);
    return this;
  }

  /** The names of the registered tasks. */
  get tasks() {
    return [...this._tasks.keys()];
  }

  /** The answer to one line from the worker. */
  async handle(line) {
    let raw;
    try {
      raw = JSON.parse(line);
    } catch (e) {
      return { ok: false, error: `the handler got a line that is not JSON (${e.message}): ${quote(line)}`, retry: false };
    }
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      return { ok: false, error: `the handler got JSON that is not a job object: ${quote(line)}`, retry: false };
    }
    const known = this.tasks.map((t) => JSON.stringify(t)).join(', ') || 'none';
    if (typeof raw.task !== 'string') {
      return {
        ok: false,
        error: `the job has no "task" naming one of this handler's tasks (${known})`,
        retry: false,
      };
    }
    const fn = this._tasks.get(raw.task);
    if (!fn) {
      return {
        ok: false,
        error: `unknown task ${JSON.stringify(raw.task)}: this handler knows ${known}`,
        retry: false,
      };
    }
    try {
      await withJobTrace(raw, () => fn(raw.data, new Job(raw)));
      return { ok: true };
    } catch (e) {
      if (e instanceof Permanent) {
        return { ok: false, error: cap(e.message), retry: false };
      }
      return { ok: false, error: cap(errorText(e)) };
    }
  }

  /**
   * Serves jobs from stdin until it closes. stdout carries only answers:
   * from here on `console.log` and `process.stdout.write` go to stderr, the
   * handler's log.
   */
  async run() {
    if (this._running) {
      throw new WorkerpoolError('run() was called twice');
    }
    this._running = true;
    const stdout = process.stdout;
    const answer = stdout.write.bind(stdout);
    const stderr = process.stderr;
    stdout.write = (chunk, encoding, callback) => stderr.write(chunk, encoding, callback);
    stdout.on('error', (e) => {
      // The worker closed our stdout: it is gone or replacing us.
      if (e.code === 'EPIPE') {
        process.exit(0);
      }
      throw e;
    });
    const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
    for await (const line of lines) {
      const reply = await this.handle(line);
      await new Promise((resolve) => {
        answer(`${JSON.stringify(reply)}\n`, () => resolve());
      });
    }
  }
}

module.exports = { App, Job, errorText };
