"""OpenTelemetry, when it is installed: a job enqueued inside a span carries that
span's traceparent, and a task runs inside the worker's span of its attempt."""

from __future__ import annotations

import json

import pytest

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from workerpool_client import App, Client  # noqa: E402

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
TRACER = PROVIDER.get_tracer("tests")


def test_a_job_enqueued_inside_a_span_carries_its_traceparent(redis_server, r, queue):
    with Client(redis_server.url) as client:
        with TRACER.start_as_current_span("enqueue") as span:
            client.enqueue(queue, "t", {"n": 1})
        client.enqueue(queue, "t", {"n": 2})
    first, second = (json.loads(p) for p in reversed(r.lrange(queue, 0, -1)))
    ctx = span.get_span_context()
    version, trace_id, span_id, flags = first["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1, "sampled"
    assert "traceparent" not in second, "outside a span nothing is added"
    # id and enqueued_at stay last, where the taking script stamps.
    assert list(first)[-2:] == ["id", "enqueued_at"]


def test_a_task_runs_inside_the_attempts_span_and_its_own_spans_are_children():
    app = App()
    seen = {}

    @app.task("work")
    def work(data):
        with TRACER.start_as_current_span("inside") as inner:
            seen["inner"] = inner.get_span_context()
            seen["parent"] = inner.parent

    attempt_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    attempt_span = "00f067aa0ba902b7"
    line = json.dumps({"id": "j", "task": "work", "attempt": 1,
                       "traceparent": f"00-{attempt_trace}-{attempt_span}-01"}).encode()
    assert json.loads(app.handle(line)) == {"ok": True}
    assert f"{seen['inner'].trace_id:032x}" == attempt_trace
    assert f"{seen['parent'].span_id:016x}" == attempt_span
    # After the task, the attempt's context is gone again.
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_malformed_traceparent_leaves_the_task_running_in_a_trace_of_its_own():
    app = App()
    seen = {}

    @app.task("work")
    def work(data):
        with TRACER.start_as_current_span("inside") as inner:
            seen["parent"] = inner.parent

    line = json.dumps({"id": "j", "task": "work", "traceparent": "00-nope-01"}).encode()
    assert json.loads(app.handle(line)) == {"ok": True}
    assert seen["parent"] is None


class _Receiver:
    """An OTLP/HTTP receiver on a free port: the spans of every request, decoded
    from the official protobuf definitions."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        spans = self.spans = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def _attributes(span, keys) -> dict:
    """The span's attributes under `keys`, as {key: string or int value}."""
    found = {}
    for kv in span.attributes:
        if kv.key in keys:
            found[kv.key] = getattr(kv.value, kv.value.WhichOneof("value"))
    return found


def test_producer_attempt_and_task_spans_form_one_trace_through_the_real_worker(
        redis_server, queue, tmp_path):
    pytest.importorskip("opentelemetry.proto")
    from opentelemetry.proto.trace.v1.trace_pb2 import Span
    from support import Worker, python_env, python_handler

    receiver = _Receiver()
    record = tmp_path / "task-spans"
    env = python_env()
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "TRACED_RECORD": str(record)})
    try:
        with Client(redis_server.url) as client:
            with TRACER.start_as_current_span("enqueue") as producer:
                job_id = client.enqueue(queue, "traced", {"n": 1})
        with Worker(redis_server.url, [queue], python_handler("traced_app"), env=env) as worker:
            from support import eventually

            def exported():
                found = tuple(next((s for s in receiver.spans if s.name == name), None)
                              for name in (f"process {queue}", f"wait {queue}"))
                return all(found) and found

            # The attempt, and the time the job waited in the queue (the
            # client stamps enqueued_at), a span of its own beside it.
            attempt, wait = eventually(
                exported, "the attempt's and the wait's spans at the receiver",
                seen=lambda: [s.name for s in receiver.spans])
            eventually(lambda: record.exists() and record.read_text().strip(), "the task's span")
            log = worker.read_log()
        produced = producer.get_span_context()
        assert attempt.trace_id.hex() == f"{produced.trace_id:032x}", log
        assert attempt.parent_span_id.hex() == f"{produced.span_id:016x}", log
        task_trace, task_parent = record.read_text().split()
        assert task_trace == f"{produced.trace_id:032x}"
        assert task_parent == attempt.span_id.hex(), "the task's span is the attempt's child"
        assert attempt.kind == Span.SpanKind.SPAN_KIND_CONSUMER
        assert _attributes(attempt, {"messaging.system", "messaging.destination.name",
                                     "messaging.message.id", "workerpool.job.task",
                                     "workerpool.job.attempt"}) == {
            "messaging.system": "workerpool",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "workerpool.job.task": "traced",
            "workerpool.job.attempt": 1,
        }
        assert wait.trace_id.hex() == f"{produced.trace_id:032x}", "in the producer's trace"
        assert wait.parent_span_id.hex() == f"{produced.span_id:016x}", "the producer's child"
        assert wait.span_id != attempt.span_id
        assert wait.kind == Span.SpanKind.SPAN_KIND_INTERNAL
        assert _attributes(wait, {"messaging.destination.name", "messaging.message.id"}) == {
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
        }
    finally:
        receiver.stop()
