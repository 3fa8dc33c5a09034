"""A handler whose task starts a span of its own (OpenTelemetry's SDK, in memory)
and records its trace id and parent span id in the file TRACED_RECORD names."""

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from workerpool_client import App

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("traced_app")
app = App()


@app.task("traced")
def traced(data):
    with tracer.start_as_current_span("inside the task") as span:
        ctx = span.get_span_context()
        with open(os.environ["TRACED_RECORD"], "a") as out:
            out.write(f"{ctx.trace_id:032x} {span.parent.span_id:016x}\n")


if __name__ == "__main__":
    app.run()
