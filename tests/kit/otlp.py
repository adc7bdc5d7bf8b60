"""An OTLP/HTTP collector on localhost: what the web and worker processes export when their
``OTEL_EXPORTER_OTLP_ENDPOINT`` points here, decoded from the protobuf they send (the real
exporter path, configured by the standard variables)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

#: attributes the tree leaves out (the same on every span of a job)
SAID_ONCE = ("spacejobs.job.id", "spacejobs.organization.id", "spacejobs.exception.summary")
KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[str]
    status: int
    children: list[ReceivedSpan] = field(default_factory=list)

    def values(self) -> Iterator[str]:
        """Every text the span carries: its name, its attributes and its events'."""
        yield self.name
        for key, value in self.attributes.items():
            yield f"{key}={value}"
        for name, attributes in self.events:
            yield name
            for key, value in attributes.items():
                yield f"{key}={value}"


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Collector:
    """Receives ``POST /v1/traces``; :attr:`spans` is everything received so far."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.receive(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def receive(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        service=service, name=span.name, kind=KINDS.get(span.kind, "?"),
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(), start=span.start_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes)) for e in span.events],
                        links=[link.span_id.hex() for link in span.links],
                        status=span.status.code))
        with self._lock:
            self.spans.extend(received)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]


@contextmanager
def collector() -> Iterator[Collector]:
    running = Collector()
    thread = threading.Thread(target=running.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.server.shutdown()
        running.server.server_close()


def tree(spans: list[ReceivedSpan]) -> str:
    """The trace as an indented tree, children in the order they started: the spans' names,
    services and ``spacejobs.*`` attributes (what the operations guide shows)."""
    by_id = {span.span_id: span for span in spans}
    for span in spans:
        span.children = []
    roots = []
    for span in sorted(spans, key=lambda s: s.start):
        parent = by_id.get(span.parent_id)
        (parent.children if parent else roots).append(span)
    lines: list[str] = []

    def show(span: ReceivedSpan, depth: int) -> None:
        own = {k.removeprefix("spacejobs."): v for k, v in span.attributes.items()
               if k.startswith("spacejobs.") and k not in SAID_ONCE}
        said = " ".join(f"{k}={v}" for k, v in own.items())
        events = "".join(f" [{name}{' ' if attrs else ''}"
                         f"{' '.join(f'{k}={v}' for k, v in attrs.items() if k not in SAID_ONCE)}]"
                         for name, attrs in span.events)
        lines.append(f"{'  ' * depth}{span.name} ({span.kind}, {span.service}) {said}{events}"
                     .rstrip())
        for child in span.children:
            previous = lines[-1].strip()
            if child.kind == "client" and not child.children and previous.startswith(
                    f"{child.name} ({child.kind}, {child.service})"):
                # statements in a row: one line, with their count
                count = int(previous.rpartition(" x")[2]) if previous.endswith(tuple("0123456789")) else 1
                lines[-1] = f"{'  ' * (depth + 1)}{child.name} ({child.kind}, {child.service}) x{count + 1}"
                continue
            show(child, depth + 1)

    for root in roots:
        if root.parent_id and root.parent_id in by_id:  # an orphan's placeholder: below
            continue
        if root.parent_id:
            # Its parent is still running (a drain that lingers): one placeholder for them all.
            placeholder = ReceivedSpan(
                service="", name=f"(span {root.parent_id}, not exported yet)", kind="?",
                trace_id=root.trace_id, span_id=root.parent_id, parent_id="", start=root.start,
                attributes={}, events=[], links=[], status=0,
                children=[r for r in roots if r.parent_id == root.parent_id])
            by_id[root.parent_id] = placeholder
            lines.append(placeholder.name)
            clients = [c for c in placeholder.children if c.kind == "client" and not c.children]
            for child in placeholder.children:
                if child not in clients:
                    show(child, 1)
            if clients:
                lines.append(f"  {len(clients)} statements (client, {clients[0].service})")
            continue
        show(root, 0)
    return "\n".join(lines)
