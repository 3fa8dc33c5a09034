// Types of @workerpool-dev/client (hand-written; the package runs as plain JavaScript).

/** TLS and topology options, named after the worker's flags. */
export interface ClientOptions {
  /** PEM file of the CA that signed the server's certificate (`--redis-ca-file`); else the system's roots. */
  ca?: string;
  /** PEM client certificate for mutual TLS (`--redis-client-cert`); needs `key`. */
  cert?: string;
  /** PEM key of the client certificate (`--redis-client-key`); needs `cert`. */
  key?: string;
  /** true: a Redis Cluster; false: one node; left out: ask the server (`INFO cluster`), as the worker does. */
  cluster?: boolean;
  /** Accept any server certificate (`--redis-tls-insecure-skip-verify`): tests and emergencies only. */
  insecureSkipVerify?: boolean;
}

/** When and how a job runs; every field is optional. */
export interface EnqueueOptions {
  /** The job's id (idempotency key); a fresh 32-hex-digit one when left out. */
  id?: string;
  /** Run no sooner than this many milliseconds from now (Redis's clock). Not with `runAt`. */
  delay?: number;
  /** Run no sooner than this time: a Date or unix milliseconds. Not with `delay`. */
  runAt?: Date | number;
  /** At most one job with this key in the queue at a time; a duplicate is refused (null id). */
  uniqueKey?: string;
  /** How long the job holds `uniqueKey` at most, in whole seconds (default 3600). */
  uniqueFor?: number;
  /**
   * Keep the job's outcome (state, result or error) for this many seconds
   * after it ends, for `status` and `wait`: a number above 0, at most
   * contract.json's `max_keep_seconds` (604800, a week). Sent as `keep`;
   * the job reads `waiting` (or `scheduled`) from the moment it is enqueued.
   */
  keepResultFor?: number;
}

/**
 * Where a kept job is (contract.json's `states`): waiting (in the queue),
 * scheduled (delayed until `nextAtMs`), running, retrying (another attempt
 * is due), or a final one: done, dead (dead-lettered) or cancelled.
 */
export type JobState = 'waiting' | 'scheduled' | 'running' | 'retrying' | 'done' | 'dead' | 'cancelled';

/** What `cancel` did, as the queue crate's `Cancel` serializes. */
export type CancelResult =
  /** Taken out of where it waited; it will not run, and its outcome is `cancelled`. */
  | { did: 'removed'; from: 'waiting' | 'scheduled' | 'retrying' }
  /** It runs (or a worker took it): its worker is asked to stop it. */
  | { did: 'requested'; state: JobState }
  /** It ended already; left alone. */
  | { did: 'final'; state: 'done' | 'dead' | 'cancelled' }
  /** No job of that id waits, and no outcome is kept for it. */
  | { did: 'unknown' };

/** A job's kept outcome, as `status` and `wait` read it. Fields the outcome lacks are null. */
export interface JobStatus<R = unknown> {
  id: string;
  state: JobState;
  /** The attempt running or last ended. */
  attempt: number | null;
  /** The worker instance it runs or last ran on. */
  worker: string | null;
  /**
   * A done job's result, as its task returned it (parsed JSON; text that is
   * not JSON is kept as a string); undefined when none is kept.
   */
  result?: R;
  /** Why a done job has no result though its task returned one (too large). */
  resultError: string | null;
  /** The last attempt's error (retrying, dead). */
  error: string | null;
  /** When a retrying job's next attempt is due (unix ms, Redis's clock). */
  nextAtMs: number | null;
  /** When the outcome last changed (unix ms, Redis's clock). */
  updatedAtMs: number | null;
  /** When the job ended (done, dead, cancelled; unix ms, Redis's clock). */
  endedAtMs: number | null;
  /**
   * The latest progress the running job reported (`job.progress`), parsed
   * JSON (text that is not JSON is kept as a string); undefined when none.
   */
  progress?: unknown;
  /** When it reported it (unix ms, Redis's clock). */
  progressAtMs: number | null;
  /** When a cancel was asked for while the job ran (unix ms, Redis's clock). */
  cancelRequestedAtMs: number | null;
}

/** Options of `wait`. */
export interface WaitOptions {
  /** How long to wait, in milliseconds (default 60000); then WaitTimeout. */
  timeoutMs?: number;
}

/** One job of `enqueueMany`. */
export interface JobSpec extends EnqueueOptions {
  task: string;
  data?: unknown;
}

export class Client {
  constructor(url: string, options?: ClientOptions);
  /** Whether the client talks to a Redis Cluster (known once connected). */
  readonly isCluster: boolean;
  /** The job's id, or null when a job holding the same unique key is in the queue. */
  enqueue(queue: string, task: string, data?: unknown, options?: EnqueueOptions): Promise<string | null>;
  /** All jobs in one round trip, in order: their ids, null for each refused duplicate. */
  enqueueMany(queue: string, jobs: readonly JobSpec[]): Promise<Array<string | null>>;
  /**
   * The job's kept outcome (one HGETALL), or null when none is kept: the job
   * was enqueued without `keepResultFor` (and no worker with
   * --keep-outcomes has taken it yet), or the outcome expired.
   */
  status<R = unknown>(queue: string, id: string): Promise<JobStatus<R> | null>;
  /**
   * Cancels the job (the queue contract's cancel script): removes it when it
   * waits (queue, scheduled or retry set; its outcome `cancelled`, its
   * unique key freed, its waiters woken), asks its worker to stop it when it
   * runs (its task's `job.signal` is aborted when it shares its process),
   * leaves it alone when it ended. Finding a waiting job scans the queue.
   */
  cancel(queue: string, id: string): Promise<CancelResult>;
  /**
   * Resolves with the job's final status once it ends: `done` with its
   * result, `dead` with its error, or `cancelled` (a dead or cancelled job
   * resolves; check `state`).
   * Rejects with WaitTimeout when `timeoutMs` passes first. Blocks on the
   * job's end stream on a connection of its own, closed afterwards.
   */
  wait<R = unknown>(queue: string, id: string, options?: WaitOptions): Promise<JobStatus<R>>;
  /** Closes the connection(s), ending any wait under way with ConnectionError. */
  close(): Promise<void>;
}

/** The job as a task handler gets it. */
export class Job<D = unknown> {
  /** Idempotency key, kept across retries. */
  readonly id: string;
  /** This attempt's number, from 1. */
  readonly attempt: number;
  readonly task: string;
  readonly data: D;
  /** The whole object the worker sent, stamp included. */
  readonly raw: Record<string, unknown>;
  /**
   * Aborted (with an Error saying so) when the worker cancels the job: a
   * producer cancelled it (`client.cancel`) while it ran, or, with several
   * jobs per process (`--children` below `--concurrency`), its attempt
   * passed `--job-timeout` (a process of one job is killed then).
   */
  readonly signal: AbortSignal;
  /**
   * Reports progress: any JSON value whose JSON text is at most
   * contract.json's `max_progress_bytes` (4096), written to the worker
   * before the job's answer. The worker keeps the latest report of a job
   * enqueued with `keepResultFor` (`status().progress`). Throws
   * InvalidProgressError, sending nothing, for a value over the limit or
   * one JSON cannot hold.
   */
  progress(value: unknown): void;
}

export type TaskHandler<D = any> = (data: D, job: Job<D>) => unknown | Promise<unknown>;

/**
 * The answer the handler process writes for one job: `result` is the value
 * the task resolved to, when it is not undefined and can be written as JSON.
 */
export type Answer = { ok: true; result?: unknown } | { ok: false; error: string; retry?: false };

export class App {
  constructor();
  /**
   * Registers a task; resolving (or returning) means done, throwing means
   * retry. A value other than undefined is the job's result (kept for a job
   * enqueued with `keepResultFor`); one that cannot be written as JSON
   * (a BigInt, a cycle) leaves the job done without it, logged on stderr.
   */
  task<D = any>(name: string, handler: TaskHandler<D>): this;
  /** The names of the registered tasks. */
  readonly tasks: string[];
  /** The answer to one line of the exec protocol (what `run` writes for it). */
  handle(line: string): Promise<Answer>;
  /**
   * Serves jobs from stdin until it closes, then waits for the jobs in hand
   * to be answered; stdout is then the protocol's alone. With
   * `WORKERPOOL_JOBS_PER_CHILD` above 1 (set by the worker) the tasks run
   * concurrently and each answer names its job.
   */
  run(): Promise<void>;
}

/** Thrown by a task: the job is dead-lettered at once, without retries. */
export class Permanent extends Error {
  constructor(message?: string, options?: { cause?: unknown });
}

/** The base of every error the library raises. */
export class WorkerpoolError extends Error {}
/** A URL or option the client cannot use. */
export class ConfigError extends WorkerpoolError {}
/** A queue name the worker would refuse. */
export class InvalidQueueError extends WorkerpoolError {}
/** A job that cannot be enqueued as given; nothing was sent. */
export class InvalidJobError extends WorkerpoolError {}
/** `job.progress` got a value over `max_progress_bytes` of JSON, or one JSON cannot hold; nothing was sent. */
export class InvalidProgressError extends WorkerpoolError {}
/** Redis could not be reached. */
export class ConnectionError extends WorkerpoolError {}
/** Redis answered with an error. */
export class RedisError extends WorkerpoolError {}
/** `wait` ran out of time before the job ended. */
export class WaitTimeout extends WorkerpoolError {
  constructor(message: string, last: JobStatus | null, options?: { cause?: unknown });
  /** The job's status as last read, or null when no outcome is kept for it. */
  readonly last: JobStatus | null;
}

/** The package's version. */
export const version: string;

declare const _default: {
  Client: typeof Client;
  App: typeof App;
  Job: typeof Job;
  Permanent: typeof Permanent;
  WorkerpoolError: typeof WorkerpoolError;
  ConfigError: typeof ConfigError;
  InvalidQueueError: typeof InvalidQueueError;
  InvalidJobError: typeof InvalidJobError;
  InvalidProgressError: typeof InvalidProgressError;
  ConnectionError: typeof ConnectionError;
  RedisError: typeof RedisError;
  WaitTimeout: typeof WaitTimeout;
  version: string;
};
export default _default;
