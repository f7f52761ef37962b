"""A minimal OTLP/HTTP trace receiver for the end-to-end tests (tests/e2e/traces.rs).

POST /v1/traces takes an ExportTraceServiceRequest in protobuf (OTLP/HTTP's binary encoding),
decodes it with the official `opentelemetry-proto` messages and appends each span to a file as one
JSON object per line: ids in hex, name, kind, status, attributes (arrays as lists) and the
resource's attributes. It answers with an empty ExportTraceServiceResponse, as a collector does.

Usage: receiver.py SPANS_FILE. Prints `listening on http://127.0.0.1:PORT` first (port 0 is
picked by the system), then serves until killed.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

MAX_BODY = 16 << 20
LOCK = threading.Lock()


def value(v):
    """An AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    if kind is None:
        return None
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        if self.path != "/v1/traces" or not 0 < length <= MAX_BODY:
            self.send_error(404 if self.path != "/v1/traces" else 400)
            return
        if self.headers.get("content-type") != "application/x-protobuf":
            self.send_error(415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(length))
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        json.dumps(
                            {
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": Span.SpanKind.Name(span.kind),
                                "start_ns": span.start_time_unix_nano,
                                "end_ns": span.end_time_unix_nano,
                                "status": {
                                    "code": Status.StatusCode.Name(span.status.code),
                                    "message": span.status.message,
                                },
                                "attributes": attributes(span.attributes),
                                "events": [e.name for e in span.events],
                                "resource": resource,
                                "scope": scope_spans.scope.name,
                            }
                        )
                    )
        with LOCK, open(sys.argv[1], "a", encoding="utf-8") as out:
            for line in lines:
                out.write(line + "\n")
        body = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
