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
   * Aborted (with an Error saying so) when the worker cancels the job
   * because its attempt passed `--job-timeout`; only with several jobs per
   * process (`--children` below `--concurrency`), never aborted otherwise.
   */
  readonly signal: AbortSignal;
}

export type TaskHandler<D = any> = (data: D, job: Job<D>) => unknown | Promise<unknown>;

/** The answer the handler process writes for one job. */
export type Answer = { ok: true } | { ok: false; error: string; retry?: false };

export class App {
  constructor();
  /** Registers a task; resolving (or returning) means done, throwing means retry. */
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
/** Redis could not be reached. */
export class ConnectionError extends WorkerpoolError {}
/** Redis answered with an error. */
export class RedisError extends WorkerpoolError {}

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
  ConnectionError: typeof ConnectionError;
  RedisError: typeof RedisError;
  version: string;
};
export default _default;
