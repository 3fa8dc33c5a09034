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
import zlib from 'node:zlib';
import protobuf from 'protobufjs';
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

// The parts of an OTLP ExportTraceServiceRequest the test reads, with the
// field numbers of opentelemetry-proto (collector/trace/v1/trace_service.proto,
// trace/v1/trace.proto, common/v1/common.proto); the fields left out are
// skipped when decoding.
const ExportTraceServiceRequest = protobuf.parse(`
  syntax = "proto3";
  message ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
  message ResourceSpans { repeated ScopeSpans scope_spans = 2; }
  message ScopeSpans { repeated Span spans = 2; }
  message Span {
    enum SpanKind {
      SPAN_KIND_UNSPECIFIED = 0;
      SPAN_KIND_INTERNAL = 1;
      SPAN_KIND_SERVER = 2;
      SPAN_KIND_CLIENT = 3;
      SPAN_KIND_PRODUCER = 4;
      SPAN_KIND_CONSUMER = 5;
    }
    bytes trace_id = 1;
    bytes span_id = 2;
    bytes parent_span_id = 4;
    string name = 5;
    SpanKind kind = 6;
    repeated KeyValue attributes = 9;
  }
  message KeyValue { string key = 1; AnyValue value = 2; }
  message AnyValue {
    oneof value {
      string string_value = 1;
      bool bool_value = 2;
      int64 int_value = 3;
      double double_value = 4;
    }
  }
`, { keepCase: true }).root.lookupType('ExportTraceServiceRequest');

const hex = (bytes) => Buffer.from(bytes ?? []).toString('hex');

/** The spans of one export request's body: ids in hex, the kind's name, attributes as {key: value}. */
function spansOf(body) {
  const request = ExportTraceServiceRequest.toObject(ExportTraceServiceRequest.decode(body), {
    enums: String, longs: Number, oneofs: true, arrays: true,
  });
  return request.resource_spans.flatMap((resource) => resource.scope_spans.flatMap((scope) => scope.spans.map((s) => ({
    traceId: hex(s.trace_id),
    spanId: hex(s.span_id),
    parentSpanId: hex(s.parent_span_id),
    name: s.name,
    kind: s.kind,
    attributes: Object.fromEntries(s.attributes.map(({ key, value }) => [key, value?.[value.value]])),
  }))));
}

/** An OTLP/HTTP collector on a free port (the worker traces only with one) that keeps the spans of every request it is sent. */
async function startCollector() {
  const spans = [];
  const failures = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      try {
        const body = Buffer.concat(chunks);
        spans.push(...spansOf(req.headers['content-encoding'] === 'gzip' ? zlib.gunzipSync(body) : body));
        res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
      } catch (e) {
        failures.push(`${req.method} ${req.url}: ${e.message}`);
        res.writeHead(400).end();
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    /** The first span named `name`; throws when a request could not be decoded. */
    span(name) {
      assert.deepEqual(failures, [], 'every export request decodes');
      return spans.find((s) => s.name === name);
    },
    close: () => server.close(),
  };
}

/** The entries of `object` under `keys`. */
const pick = (object, keys) => Object.fromEntries(keys.filter((k) => k in object).map((k) => [k, object[k]]));

test('through the real worker, the task runs as a child of the attempt that continues the producer', async () => {
  const collector = await startCollector();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'traced-'));
  const record = path.join(dir, 'record');
  const fixture = fileURLToPath(new URL('./fixtures/traced.mjs', import.meta.url));
  const span = tracer.startSpan('enqueue');
  const id = await context.with(trace.setSpan(context.active(), span), () => client.enqueue('chain', 'traced', {}));
  span.end();
  const worker = await startWorker(server.url, ['--queue', 'chain', '--handler', 'exec', '--', process.execPath, fixture], {
    OTEL_EXPORTER_OTLP_ENDPOINT: collector.url,
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

    // What the worker exported: the attempt, a consumer span that is the
    // producer's child and the one the handler was handed, and the time the
    // job waited in the queue, a span of its own beside it.
    const [attempt, wait] = await eventually('the attempt\'s and the wait\'s spans at the collector', () => {
      const found = [collector.span('process chain'), collector.span('wait chain')];
      return found.every(Boolean) ? found : undefined;
    });
    assert.equal(attempt.spanId, attemptSpan, 'the exported attempt is the span the handler was handed');
    assert.equal(attempt.traceId, producer.traceId, 'the attempt is in the producer\'s trace');
    assert.equal(attempt.parentSpanId, producer.spanId, 'the attempt is the producer\'s child');
    assert.equal(attempt.kind, 'SPAN_KIND_CONSUMER');
    const attributes = ['messaging.system', 'messaging.destination.name', 'messaging.message.id', 'workerpool.job.task', 'workerpool.job.attempt'];
    assert.deepEqual(pick(attempt.attributes, attributes), {
      'messaging.system': 'workerpool',
      'messaging.destination.name': 'chain',
      'messaging.message.id': id,
      'workerpool.job.task': 'traced',
      'workerpool.job.attempt': 1,
    });
    assert.equal(wait.traceId, producer.traceId, 'the wait is in the producer\'s trace');
    assert.equal(wait.parentSpanId, producer.spanId, 'the wait is the producer\'s child');
    assert.notEqual(wait.spanId, attempt.spanId);
    assert.equal(wait.kind, 'SPAN_KIND_INTERNAL');
    assert.deepEqual(pick(wait.attributes, ['messaging.destination.name', 'messaging.message.id']), {
      'messaging.destination.name': 'chain',
      'messaging.message.id': id,
    });
  } finally {
    await worker.stop();
    collector.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
