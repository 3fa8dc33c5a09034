'use strict';

const errors = require('./errors');
const { Client } = require('./client');
const { App, Job } = require('./app');
const { version } = require('../package.json');

module.exports = {
  Client,
  App,
  Job,
  Permanent: errors.Permanent,
  WorkerpoolError: errors.WorkerpoolError,
  ConfigError: errors.ConfigError,
  InvalidQueueError: errors.InvalidQueueError,
  InvalidJobError: errors.InvalidJobError,
  InvalidProgressError: errors.InvalidProgressError,
  ConnectionError: errors.ConnectionError,
  RedisError: errors.RedisError,
  WaitTimeout: errors.WaitTimeout,
  version,
};
