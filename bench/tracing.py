"""Traces (issue 28): what OpenTelemetry costs the pipeline, off and on, next to Celery alone,
in one run.

``end_to_end``'s backlog run (``--messages`` committed in one app transaction, drained by
beat's relay and one worker, prefork x2), in ``--rounds`` alternating rounds of four:

- ``alone``: Celery alone (``bench.celery_alone``), the baseline of the end-to-end bar;
- ``no_extra``: delivery with OpenTelemetry impossible to import in worker and beat (a
  ``sitecustomize`` refuses it, as when the ``[otel]`` extra is not installed): today's cost;
- ``off``: the extra installed, no SDK configured (the default);
- ``on``: worker and beat configure the SDK from ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a batch span
  processor, OTLP over HTTP to a sink process that only counts the spans), and the app
  enqueues inside a recorded span, so every message's spans join its trace.

Figures: ``off`` / ``alone`` (the bar: >= 1.5x) and ``off`` / ``no_extra`` (free when off:
within noise), and what ``on`` costs per message (CPU ms of worker, beat, app and PostgreSQL
over ``off``'s), with the spans the sink received. Medians of the rounds.

    python -m bench.tracing [--messages 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.common import RUN_DIR, log, median, report, row, session
from bench.end_to_end import BACKLOG_RUNS, backlog_run, produce_backlog
from delivery.testing.processes import free_port

NO_OTEL = "import delivery.testing.without_otel\n"  # the sitecustomize of ``no_extra``

SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

counted = [0]
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        counted[0] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with open(sys.argv[2], "w") as out:
            out.write(str(counted[0]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
print("sink ready", flush=True)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _app_tracer(endpoint: str) -> Any:
    """This process (the app) as an app with the SDK configured: a batch span processor to
    the sink. Set once; ``no_extra`` and ``off`` open no span, so they store no context."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "bench-app"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    return trace.get_tracer("bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs = {run[0]: run for run in BACKLOG_RUNS}
    site = RUN_DIR / "no-otel"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(NO_OTEL))
    port, counted = free_port(), RUN_DIR / "spans-counted"
    sink = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SINK), str(port), str(counted)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None and "sink ready" in sink.stdout.readline()
    endpoint = f"http://127.0.0.1:{port}"
    tracer = _app_tracer(f"{endpoint}/v1/traces")
    root = str(Path(__file__).resolve().parents[1])
    kinds: dict[str, tuple[Any, dict[str, str]]] = {
        "alone": (runs["alone"], {}),
        "no_extra": (runs["batch"], {"PYTHONPATH": f"{site}:{root}"}),
        "off": (runs["batch"], {}),
        "on": (runs["batch"], {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}),
    }
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    spans: list[int] = []

    def traced(engine: Any, n: int, prefix: str) -> None:
        with tracer.start_as_current_span("bench checkout"):
            produce_backlog(engine, n, prefix, "delivery")

    try:
        with session() as procs:
            from bench.common import fresh_database

            engine = fresh_database()
            stub = procs.stub()
            stub_pid = procs.pids()[-1]
            for n in range(args.rounds):
                order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
                for kind in order:
                    run, env = kinds[kind]
                    before = int(counted.read_text()) if counted.exists() else 0
                    log(f"round {n + 1}: {kind}")
                    result = backlog_run(
                        engine,
                        procs,
                        stub,
                        stub_pid,
                        run=run,
                        pool="prefork",
                        concurrency=2,
                        messages=args.messages,
                        produce=traced if kind == "on" else None,
                        env=env,
                    )
                    if kind == "on":
                        time.sleep(1.0)  # the batch processors' last export (every 5 s max)
                        spans.append(int(counted.read_text()) - before)
                        result["spans"] = spans[-1]
                    log(f"  {result}")
                    rounds[kind].append(result)
            _report(args, rounds, engine)
            engine.dispose()
    finally:
        sink.terminate()
        sink.wait(10)


def _cpu(result: dict[str, Any]) -> float:
    return float(result["cpu_ms_total"])


def _report(args: Any, rounds: dict[str, list[dict[str, Any]]], engine: Any) -> None:
    rate = {kind: median([r["rate"] for r in runs]) for kind, runs in rounds.items()}
    cpu = {kind: median([_cpu(r) for r in runs]) for kind, runs in rounds.items()}
    loads = {kind: [r["load"][0] for r in runs] for kind, runs in rounds.items()}

    def each(kind: str) -> str:
        return ", ".join(f"{r['rate']:,.0f}" for r in rounds[kind])

    def side(kind: str) -> str:
        return (
            f"{rate[kind]:,.0f} msg/s ({each(kind)}), CPU ms/msg {cpu[kind]:.3f} "
            f"(load {loads[kind]})"
        )

    spans = [r.get("spans", 0) for r in rounds["on"]]
    title = f"end to end, {args.messages:,}-message backlog, prefork x2, medians of {args.rounds}"
    rows = [
        row(
            f"{title}: tracing off (the [otel] extra installed, no SDK) vs Celery alone",
            rate["off"] / rate["alone"],
            ">= 1.5x",
            rate["off"] / rate["alone"] >= 1.5,
            side("off"),
            f"Celery alone {side('alone')}",
        ),
        row(
            f"{title}: tracing off vs OpenTelemetry not importable (today's cost)",
            rate["off"] / rate["no_extra"],
            "within noise (>= 0.9x)",
            rate["off"] / rate["no_extra"] >= 0.9,
            side("off"),
            f"no OpenTelemetry {side('no_extra')}",
        ),
        row(
            f"{title}: tracing on (SDK, batch span processor, OTLP/HTTP to a local sink) vs "
            "off: msg/s, and CPU ms per message it adds",
            rate["on"] / rate["off"],
            "(cost)",
            None,
            f"{side('on')}; +{cpu['on'] - cpu['off']:.3f} CPU ms/msg over off; spans "
            f"received per round {spans} ({median(spans) / args.messages:.1f} per message)",
            f"off {side('off')}",
        ),
    ]
    report("tracing", {"messages": args.messages, "rounds": rounds}, rows, engine)


if __name__ == "__main__":
    main()
