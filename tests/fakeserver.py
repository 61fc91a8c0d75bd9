"""The tests' fake OpenAI-compatible streaming server: SSE events in a chunked HTTP body, one
fault per first path segment (``/<fault>/v1/completions``). Each test module subclasses
``Streaming`` with its own faults and serves it with ``serving``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def event(text: str, finish: str | None = None, **extra) -> bytes:
    """One completions stream event: a token's ``text``, ``finish`` its finish_reason."""
    body = {"choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


class Streaming(BaseHTTPRequestHandler):
    """A handler's streaming pieces: the chunked body's chunks, its start and its end."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # a client hanging up is the point
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], stop: threading.Event) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of ``handler`` served on a free loopback port; ``stop`` is
    cleared first and set at the end, so a stalling fault returns and the server can shut down."""
    stop.clear()
    httpd = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
