'use strict';

// OpenTelemetry, when the application has it: `@opentelemetry/api` is
// looked up once, and without it (or without a registered propagator)
// nothing is added and nothing changes. The client does not depend on it.

let api;

function otel() {
  if (api === undefined) {
    try {
      api = require('@opentelemetry/api');
    } catch {
      api = null;
    }
  }
  return api;
}

/**
 * The W3C trace context of the active span, as the job fields `traceparent`
 * (and `tracestate`), or undefined outside a span or without OpenTelemetry.
 */
function currentTrace() {
  const o = otel();
  if (!o) {
    return undefined;
  }
  const carrier = {};
  o.propagation.inject(o.context.active(), carrier);
  if (typeof carrier.traceparent !== 'string' || carrier.traceparent === '') {
    return undefined;
  }
  const trace = { traceparent: carrier.traceparent };
  if (typeof carrier.tracestate === 'string' && carrier.tracestate !== '') {
    trace.tracestate = carrier.tracestate;
  }
  return trace;
}

/**
 * Runs `fn` with the worker's span of this attempt (the job line's
 * `traceparent`) as the active context, so the task's own spans are its
 * children.
 */
function withJobTrace(raw, fn) {
  const o = otel();
  if (!o || typeof raw.traceparent !== 'string') {
    return fn();
  }
  const carrier = { traceparent: raw.traceparent };
  if (typeof raw.tracestate === 'string') {
    carrier.tracestate = raw.tracestate;
  }
  return o.context.with(o.propagation.extract(o.context.active(), carrier), fn);
}

module.exports = { currentTrace, withJobTrace };
