"""A router that names the replica it chose in a response header, as a cluster's router can (stdlib only).

``header_router(backends, header)`` serves on 127.0.0.1 (a free port) in a thread: requests to
``/v1/completions`` and ``/v1/chat/completions`` go round robin over ``backends`` (``http://host:port``
each), ``POST /reset_prefix_cache`` goes to every backend, anything else to the first. The response is
relayed as it arrives (a streamed answer stays streamed: the body ends when the connection closes) with
``header: <name of the backend>`` added; ``chosen`` lists the backends picked for completions, in order.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.fakes.serving import serving

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


@dataclass
class HeaderRouter:
    base_url: str
    names: Sequence[str]
    chosen: list[str] = field(default_factory=list)


@contextmanager
def header_router(backends: Sequence[str], names: Sequence[str], header: str) -> Iterator[HeaderRouter]:
    lock = threading.Lock()
    turn = [0]
    router = HeaderRouter(base_url="", names=names)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self._relay()

        def do_POST(self) -> None:
            self._relay()

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            path = urlsplit(self.path).path
            if path == "/reset_prefix_cache":
                targets = list(range(len(backends)))
            elif path in ("/v1/completions", "/v1/chat/completions"):
                with lock:
                    targets = [turn[0] % len(backends)]
                    turn[0] += 1
                    router.chosen.append(names[targets[0]])
            else:
                targets = [0]
            for index in targets:
                upstream = urlsplit(backends[index])
                connection = http.client.HTTPConnection(upstream.hostname or "", upstream.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                if index != targets[-1]:
                    response.read()
                    connection.close()
                    continue
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header(header, names[index])
                self.send_header("Connection", "close")
                self.end_headers()
                while chunk := response.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                connection.close()

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as server:
        router.base_url = f"http://127.0.0.1:{server.server_address[1]}"
        yield router
