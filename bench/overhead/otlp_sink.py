#!/usr/bin/env python
"""An OTLP/HTTP traces endpoint that accepts and drops what it is sent (bench/overhead's steersman-otlp setup):
the gateway's export path runs whole (spans, batch thread, protobuf, HTTP) against a collector that costs ~nothing.

    python bench/overhead/otlp_sink.py PORT
"""

import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
