// OpenTelemetry, when the application has it: a job enqueued inside a span
// carries that span's traceparent, and a task runs inside the worker's span
// of its attempt, so its own spans are that span's children.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';
import { App, Client } from '../index.mjs';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { eventually, raw, startRedis, startWorker } from './helpers.mjs';

let server;
let redis;
let client;
const tracer = new BasicTracerProvider().getTracer('tests');

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  server = await startRedis();
  redis = raw(server.url);
  client = new Client(server.url);
});

after(async () => {
  await client.close();
  redis.disconnect();
  await server.stop();
  context.disable();
  propagation.disable();
});

test('a job enqueued inside a span carries its traceparent, and none outside', async () => {
  const span = tracer.startSpan('enqueue');
  await context.with(trace.setSpan(context.active(), span), () => client.enqueue('traced', 't', { n: 1 }));
  span.end();
  await client.enqueue('traced', 't', { n: 2 });
  const [second, first] = (await redis.lrange('traced', 0, -1)).map((p) => JSON.parse(p));
  const ctx = span.spanContext();
  const [version, traceId, spanId, flags] = first.traceparent.split('-');
  assert.deepEqual([version, traceId, spanId], ['00', ctx.traceId, ctx.spanId]);
  assert.equal(Number.parseInt(flags, 16) & 1, 1);
  assert.equal(second.traceparent, undefined);
  // id and enqueued_at stay last, where the taking script stamps.
  assert.deepEqual(Object.keys(first).slice(-2), ['id', 'enqueued_at']);
});

test("a task runs inside the attempt's span and its own spans are children", async () => {
  const app = new App();
  let inner;
  app.task('work', async () => {
    await new Promise((resolve) => setTimeout(resolve, 5));
    const span = tracer.startSpan('inside');
    inner = { ctx: span.spanContext(), parent: span.parentSpanContext };
    span.end();
  });
  const attemptTrace = '4bf92f3577b34da6a3ce929d0e0e4736';
  const attemptSpan = '00f067aa0ba902b7';
  const line = JSON.stringify({ id: 'j', task: 'work', attempt: 1, traceparent: `00-${attemptTrace}-${attemptSpan}-01` });
  assert.deepEqual(await app.handle(line), { ok: true });
  assert.equal(inner.ctx.traceId, attemptTrace);
  assert.equal(inner.parent?.spanId, attemptSpan);
  assert.equal(trace.getSpan(context.active()), undefined, 'the attempt context is gone after the task');
});

test('a malformed traceparent leaves the task running in a trace of its own', async () => {
  const app = new App();
  let parent = 'unset';
  app.task('work', () => {
    const span = tracer.startSpan('inside');
    parent = span.parentSpanContext;
    span.end();
  });
  assert.deepEqual(await app.handle(JSON.stringify({ id: 'j', task: 'work', traceparent: '00-nope-01' })), { ok: true });
  assert.equal(parent, undefined);
});

test('through the real worker, the task runs as a child of the attempt that continues the producer', async () => {
  // A collector that takes everything: the worker traces only with one.
  const sink = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end());
  });
  await new Promise((resolve) => sink.listen(0, '127.0.0.1', resolve));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'traced-'));
  const record = path.join(dir, 'record');
  const fixture = fileURLToPath(new URL('./fixtures/traced.mjs', import.meta.url));
  const span = tracer.startSpan('enqueue');
  await context.with(trace.setSpan(context.active(), span), () => client.enqueue('chain', 'traced', {}));
  span.end();
  const worker = await startWorker(server.url, ['--queue', 'chain', '--handler', 'exec', '--', process.execPath, fixture], {
    OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${sink.address().port}`,
    RECORD: record,
  });
  try {
    const line = await eventually('the task\'s record', () => (fs.existsSync(record) && fs.readFileSync(record, 'utf8').trim()) || undefined);
    const seen = JSON.parse(line);
    const [, traceId, attemptSpan] = seen.handed.split('-');
    const producer = span.spanContext();
    assert.equal(traceId, producer.traceId, 'the attempt continues the producer\'s trace');
    assert.notEqual(attemptSpan, producer.spanId, 'the handler gets the attempt\'s span, not the producer\'s');
    assert.equal(seen.trace, producer.traceId);
    assert.equal(seen.parent, attemptSpan, 'the task\'s span is the attempt\'s child');
  } finally {
    await worker.stop();
    sink.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
