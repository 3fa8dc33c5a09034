// ESM entry point: the same objects as the CommonJS one (src/index.js), so
// `instanceof` holds whichever way a program loads the package.
import lib from './src/index.js';

export const {
  Client,
  App,
  Job,
  Permanent,
  WorkerpoolError,
  ConfigError,
  InvalidQueueError,
  InvalidJobError,
  InvalidProgressError,
  ConnectionError,
  RedisError,
  WaitTimeout,
  version,
} = lib;
export default lib;
