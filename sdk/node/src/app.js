'use strict';

// The exec handler protocol (workerpool-worker --handler exec): one job per
// line of JSON on stdin, one answer per line on stdout. With a share of one
// job per child (WORKERPOOL_JOBS_PER_CHILD unset or 1) the jobs run one at a
// time; with a larger share their promises run concurrently, each answer
// names its job, and `{"cancel":"<id>"}` (a timeout, or a producer's cancel)
// aborts that job's `job.signal` (docs/worker.md, "Many jobs in one child").
// `job.progress(value)` writes `{"progress":<value>}` (naming the job with
// "id" in the multiplexed protocol) before the job's answer, never after it;
// a progress line has no "ok". With a share of one, the process says at start
// that it reads stdin while a job runs (`{"accepts":["cancel"]}`), and a
// `{"cancel":"<id>"}` line (a producer's cancel of the running job) aborts
// its `job.signal` (docs/worker.md, "Writing a handler (exec)").

const readline = require('node:readline');
const { InvalidProgressError, Permanent, WorkerpoolError } = require('./errors');
const { withJobTrace } = require('./trace');
const { MAX_ANSWER_BYTES, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES } = require('./outcome');

/** How much of a line that is not a job an answer quotes. */
const QUOTE = 200;
/**
 * The longest error an answer carries (characters): the worker takes
 * answer lines up to contract.json's max_answer_bytes and replaces a
 * process that writes a longer one.
 */
const ERROR_CHARS = 64 * 1024;
/**
 * The longest answer line the worker reads, newline included
 * (contract.json's max_answer_bytes); a longer one ends the process.
 */
const ANSWER_LINE_BYTES = MAX_ANSWER_BYTES;
/** How many jobs the worker hands this process at once (settings::JOBS_PER_CHILD). */
const JOBS_PER_CHILD = 'WORKERPOOL_JOBS_PER_CHILD';
/** The reason `job.signal` is aborted with when a cancel line names the job. */
const CANCELLED = 'the worker cancelled the job: its attempt passed the timeout (--job-timeout)';
/** The reason `job.signal` is aborted with when a producer cancels the job a one-job process runs. */
const PRODUCER_CANCELLED = 'a producer cancelled the job (client.cancel) while it ran';
/** What a one-job process says at start: it reads stdin while a job runs, so it may get a cancel line. */
const ACCEPTS_LINE = '{"accepts":["cancel"]}\n';

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

/** Writes one line to the handler's log (stderr). */
function log(text) {
  process.stderr.write(`workerpool: ${text}\n`);
}

/** The JSON text of an answer's result, kept apart so the answer line is encoded once. */
const RESULT_TEXT = Symbol('workerpool.resultText');

/**
 * The answer for a task that resolved to `value`: `{ ok: true }` when it is
 * undefined, else with `result`. A value that cannot be encoded as JSON
 * (a BigInt, a cycle, a function) or whose JSON is over the longest result
 * a worker keeps leaves the job done without it, and the log says why.
 */
function done(task, value) {
  if (value === undefined) {
    return { ok: true };
  }
  let text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    const why = e.message.replace(/\s*\n\s*/g, ' ');
    log(`task ${JSON.stringify(task)}: its result cannot be written as JSON (${why}); the job is done without it`);
    return { ok: true };
  }
  if (text === undefined) {
    log(`task ${JSON.stringify(task)}: its result (a ${typeof value}) cannot be written as JSON; ` +
      'the job is done without it');
    return { ok: true };
  }
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_RESULT_BYTES) {
    // Said to the worker, which keeps the reason in the job's outcome.
    const why = `the result was not kept: ${bytes} bytes of JSON, over the limit of ${MAX_RESULT_BYTES}`;
    log(`task ${JSON.stringify(task)}: ${why}; the job is done without it`);
    return { ok: true, result_error: why };
  }
  const answer = { ok: true, result: value };
  Object.defineProperty(answer, RESULT_TEXT, { value: { text, task } });
  return answer;
}

/** An answer as one line of the protocol, naming job `id` when given (the multiplexed protocol). */
function answerLine(answer, id) {
  const held = answer[RESULT_TEXT];
  if (held === undefined) {
    return JSON.stringify(id === undefined ? answer : { id, ...answer });
  }
  const head = id === undefined ? '{"ok":true' : `{"id":${JSON.stringify(id)},"ok":true`;
  const line = `${head},"result":${held.text}}`;
  if (Buffer.byteLength(line) + 1 > ANSWER_LINE_BYTES) {
    log(`task ${JSON.stringify(held.task)}: its answer with the result would be over the ${ANSWER_LINE_BYTES} bytes ` +
      'a worker reads; the job is done without it');
    return `${head}}`;
  }
  return line;
}

/**
 * The share of jobs the worker gives this process: 1 when the variable is
 * unset or empty, and (with a warning) when it is not a whole number of at
 * least 1.
 */
function jobsPerChild(value) {
  if (value === undefined || value.trim() === '') {
    return 1;
  }
  const n = /^[+-]?\d+$/.test(value.trim()) ? Number(value) : NaN;
  if (!Number.isSafeInteger(n) || n < 1) {
    log(`${JOBS_PER_CHILD}=${quote(value)} is not a whole number of at least 1; serving one job at a time`);
    return 1;
  }
  return n;
}

/** The job object a line holds, or why it holds none (`refusal`). */
function parseJob(line) {
  let raw;
  try {
    raw = JSON.parse(line);
  } catch (e) {
    return { refusal: `the handler got a line that is not JSON (${e.message}): ${quote(line)}` };
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    return { refusal: `the handler got JSON that is not a job object: ${quote(line)}` };
  }
  return { raw };
}

/**
 * The JSON text of a progress report, checked: InvalidProgressError when
 * JSON cannot hold the value or its text is over MAX_PROGRESS_BYTES.
 */
function progressText(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    const why = e.message.replace(/\s*\n\s*/g, ' ');
    throw new InvalidProgressError(`job.progress(): the value cannot be written as JSON (${why}); ` +
      'report numbers, strings, arrays and plain objects');
  }
  if (text === undefined) {
    throw new InvalidProgressError(`job.progress(): the value (${typeof value}) cannot be written as JSON; ` +
      'report numbers, strings, arrays and plain objects');
  }
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_PROGRESS_BYTES) {
    throw new InvalidProgressError(`job.progress(): the value is ${bytes} bytes of JSON, over the limit of ` +
      `${MAX_PROGRESS_BYTES}; report a number or a small object, and return the rest as the result; nothing was sent`);
  }
  return text;
}

/** Where a job's reports go: the JSON text of each, or nowhere (`handle`). */
const REPORT = Symbol('workerpool.report');

/** The job as a handler sees it. */
class Job {
  constructor(raw, signal, report) {
    /** The whole object the worker sent, stamp included. */
    this.raw = raw;
    /** Idempotency key, kept across retries. */
    this.id = raw.id;
    /** This attempt's number, from 1. */
    this.attempt = raw.attempt;
    this.task = raw.task;
    this.data = raw.data;
    /**
     * Aborted when the worker cancels the job: a producer cancelled it
     * (`client.cancel`) while it ran, or, with several jobs per process,
     * its attempt passed `--job-timeout` (a process taking one job at a
     * time is killed then). Hand it to `fetch`, timers and the like to stop
     * the work; a task that ignores it finishes normally.
     */
    this.signal = signal;
    Object.defineProperty(this, REPORT, { value: report });
  }

  /**
   * Reports the task's progress: `value` is any JSON value (a number, or a
   * small object such as `{ done: 40, of: 100 }`) whose JSON text is at
   * most contract.json's `max_progress_bytes` (4096). It goes to the worker
   * as a line before the job's answer; the worker writes the latest report
   * of a job enqueued with keepResultFor to its outcome (`status().progress`),
   * at most every `progress_interval_ms`, and drops those of other jobs. A
   * report after the task settled is dropped. Throws InvalidProgressError,
   * sending nothing, for a value JSON cannot hold or one over the limit.
   * Outside `run()` (`handle` in a test) a report goes nowhere.
   */
  progress(value) {
    const text = progressText(value);
    this[REPORT]?.(text);
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
    return this._handle(line, undefined);
  }

  /** As `handle`, the task's progress reports going to `report`. */
  async _handle(line, report) {
    const { raw, refusal } = parseJob(line);
    if (refusal !== undefined) {
      return { ok: false, error: refusal, retry: false };
    }
    return this._run(raw, new AbortController().signal, report);
  }

  /** Runs the job's task; its outcome as an answer. Never rejects. */
  async _run(raw, signal, report) {
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
      const value = await withJobTrace(raw, () => fn(raw.data, new Job(raw, signal, report)));
      return done(raw.task, value);
    } catch (e) {
      if (e instanceof Permanent) {
        return { ok: false, error: cap(e.message), retry: false };
      }
      return { ok: false, error: cap(errorText(e)) };
    }
  }

  /**
   * Serves jobs from stdin until it closes, then waits for the jobs in hand
   * to be answered. stdout carries only answers: from here on `console.log`
   * and `process.stdout.write` go to stderr, the handler's log.
   */
  async run() {
    if (this._running) {
      throw new WorkerpoolError('run() was called twice');
    }
    this._running = true;
    const share = jobsPerChild(process.env[JOBS_PER_CHILD]);
    const stdout = process.stdout;
    const write = stdout.write.bind(stdout);
    const stderr = process.stderr;
    stdout.write = (chunk, encoding, callback) => stderr.write(chunk, encoding, callback);
    stdout.on('error', (e) => {
      // The worker closed our stdout: it is gone or replacing us.
      if (e.code === 'EPIPE') {
        process.exit(0);
      }
      throw e;
    });
    // One write call per answer line: Node queues writes in order, so
    // concurrent answers never interleave. Resolves once it is written.
    const send = (answer, id) => new Promise((resolve) => {
      write(`${answerLine(answer, id)}\n`, () => resolve());
    });
    const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
    if (share > 1) {
      await this._serveConcurrently(lines, send, write);
    } else {
      await this._serveInTurn(lines, send, write);
    }
  }

  /**
   * One job at a time: read a line, answer it, read the next. The job's
   * progress lines go out as it reports, before its answer; a report after
   * the answer (from a timer the task left behind) is dropped. stdin is
   * read on while a job runs: the process said so at start, and a cancel
   * line naming the job aborts its `job.signal`.
   */
  async _serveInTurn(lines, send, write) {
    write(ACCEPTS_LINE);
    /** Job lines read and not yet started, with their parse and controller. */
    const queued = [];
    /** The job read last (the one running: the worker sends the next after its answer). */
    let latest;
    let closed = false;
    let wake;
    lines.on('line', (line) => {
      const parsed = parseJob(line);
      const { raw } = parsed;
      if (raw !== undefined && raw.id === undefined && typeof raw.cancel === 'string') {
        if (latest !== undefined && latest.id === raw.cancel) {
          latest.controller.abort(new Error(PRODUCER_CANCELLED));
        }
        return;
      }
      latest = { id: raw?.id, controller: new AbortController() };
      queued.push({ parsed, controller: latest.controller });
      wake?.();
    });
    lines.on('close', () => {
      closed = true;
      wake?.();
    });
    for (;;) {
      if (queued.length === 0) {
        if (closed) {
          return;
        }
        await new Promise((resolve) => {
          wake = resolve;
        });
        wake = undefined;
        continue;
      }
      const { parsed, controller } = queued.shift();
      let open = true;
      const report = (text) => {
        if (open) {
          write(`{"progress":${text}}\n`);
        }
      };
      const answer = parsed.refusal !== undefined
        ? { ok: false, error: parsed.refusal, retry: false }
        : await this._run(parsed.raw, controller.signal, report);
      open = false;
      await send(answer);
    }
  }

  /**
   * Every job line starts its task at once; each answer names its job and
   * is written when the task settles. The worker sends no more jobs than
   * the share, so nothing here waits for a slot.
   */
  async _serveConcurrently(lines, send, write) {
    /** Job id → the AbortController behind its `job.signal`. */
    const inHand = new Map();
    /** Jobs started and not yet answered. */
    const answering = new Set();
    for await (const line of lines) {
      const { raw } = parseJob(line);
      if (raw !== undefined && raw.id === undefined && typeof raw.cancel === 'string') {
        // A cancel for a job answered already (or never given) is moot.
        inHand.get(raw.cancel)?.abort(new Error(CANCELLED));
        continue;
      }
      if (raw === undefined || typeof raw.id !== 'string') {
        log(`dropped a line that is not a job with a string "id", so no answer can name it: ${quote(line)}`);
        continue;
      }
      const { id } = raw;
      const controller = new AbortController();
      inHand.set(id, controller);
      let open = true;
      const head = `{"id":${JSON.stringify(id)},"progress":`;
      const report = (text) => {
        if (open) {
          write(`${head}${text}}\n`);
        }
      };
      const done = this._run(raw, controller.signal, report).then((answer) => {
        open = false;
        if (inHand.get(id) === controller) {
          inHand.delete(id);
        }
        return send(answer, id);
      });
      answering.add(done);
      done.then(() => answering.delete(done));
    }
    // stdin closed (the worker drains or is gone): answer what is in hand.
    await Promise.all(answering);
  }
}

module.exports = { App, Job, errorText, answerLine };
