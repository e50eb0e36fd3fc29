"""A minimal OTLP/HTTP trace receiver: what an OpenTelemetry Collector's `otlp` receiver does
for `POST /v1/traces` with protobuf bodies, and nothing more.

There is no Collector binary on the dev machine and no network, so the OTLP export tests and
the observed-pipeline bench point the real `OTLPSpanExporter` at this instead. It decodes each
body (gzip/deflate `Content-Encoding` handled) as an `ExportTraceServiceRequest` and answers
200 with an empty `ExportTraceServiceResponse`, like the Collector does.

It is a `http.server` in its own thread (not an aiohttp server on the test's event loop):
`TracerProvider.shutdown()` blocks the loop while the exporter thread sends, so a receiver
on that loop could never answer.

In-process (tests):

    with OtlpReceiver() as rx:
        configure_tracing("otlp", endpoint=rx.endpoint) ...
        rx.requests  # [ReceivedRequest(raw=..., body=..., message=ExportTraceServiceRequest)]

As its own process (the bench, so decoding does not count as the worker's CPU):
`python -m tests.otlp_receiver` prints `PORT <n>` and serves until stdin closes;
`GET /stats` answers `{"requests": n, "spans": n, "bytes": n}`.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"
_EMPTY_RESPONSE = ExportTraceServiceResponse().SerializeToString()


@dataclass
class ReceivedRequest:
    raw: bytes            # the request body exactly as it came over the socket
    body: bytes           # after Content-Encoding was undone (the serialized protobuf)
    headers: dict[str, str]  # names lowercased
    message: ExportTraceServiceRequest | None  # None when `keep_messages=False`


def _decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class OtlpReceiver:
    """Serves `POST /v1/traces` on 127.0.0.1 (a free port unless `port` is given)."""

    def __init__(self, port: int = 0, *, keep_messages: bool = True) -> None:
        self.keep_messages = keep_messages
        self.requests: list[ReceivedRequest] = []
        self.errors: list[str] = []
        self.span_count = 0
        self.byte_count = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != TRACES_PATH:
                    self._answer(404, b"", "text/plain")
                    return
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = _decode_body(raw, self.headers.get("Content-Encoding", ""))
                    msg = ExportTraceServiceRequest.FromString(body)
                except Exception as exc:  # a malformed export is a test failure, reported by `errors`
                    with receiver._lock:
                        receiver.errors.append(f"{type(exc).__name__}: {exc}")
                    self._answer(400, b"", "text/plain")
                    return
                receiver._record(raw, body, {k.lower(): v for k, v in self.headers.items()}, msg)
                self._answer(200, _EMPTY_RESPONSE, "application/x-protobuf")

            def do_GET(self) -> None:
                if self.path != "/stats":
                    self._answer(404, b"", "text/plain")
                    return
                self._answer(200, json.dumps(receiver.stats()).encode(), "application/json")

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        """Base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it (`/v1/traces` is appended)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what arrived -------------------------------------------------------------------------
    def _record(self, raw: bytes, body: bytes, headers: dict[str, str], msg: ExportTraceServiceRequest) -> None:
        n = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        with self._changed:
            self.span_count += n
            self.byte_count += len(raw)
            self.requests.append(ReceivedRequest(raw, body, headers, msg if self.keep_messages else None))
            self._changed.notify_all()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"requests": len(self.requests), "spans": self.span_count, "bytes": self.byte_count,
                    "errors": len(self.errors)}

    def wait_spans(self, n: int, timeout: float = 30.0) -> bool:
        """Block until at least `n` spans arrived (False on timeout)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.span_count >= n, timeout)


def main() -> int:
    """Own-process mode: print the port, serve until stdin is closed."""
    rx = OtlpReceiver(int(sys.argv[1]) if len(sys.argv) > 1 else 0, keep_messages=False).start()
    print(f"PORT {rx.port}", flush=True)
    try:
        sys.stdin.read()
    finally:
        rx.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
