"""Stand-in HTTP servers on this machine for the proxy tests (a gateway's, a router's): each on a free loopback port,
serving in a thread of its own, quiet when the proxy closes an idle connection. A test's handler says what it
answers; `answer_json` sends one JSON body."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from testbed.tools import free_port


class StandInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a proxy's connections to a server are

    def answer_json(self, body: Any) -> None:
        out = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *_: Any) -> None:
        pass


class StandInServer(ThreadingHTTPServer):
    """`name`: what its answers say it is; `lock` guards the counters a test's server keeps."""

    block_on_close = False  # closing does not wait for the proxy's idle connections' threads

    def __init__(self, name: str, handler: type[StandInHandler]) -> None:
        super().__init__(("127.0.0.1", free_port()), handler)
        self.name, self.lock = name, threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the proxy closing an idle connection: nothing to print
