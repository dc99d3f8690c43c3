"""The servers' preStop drain (core/children/drain.py), run as the kubelet runs it: `python3 -c` against a server
whose /metrics reports what it holds (a stand-in answering like vLLM's, on localhost)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cpullm.core.children.drain import DRAIN_SCRIPT


class Held:
    """What the stand-in reports on each read of /metrics, in turn (the last one stays)."""

    def __init__(self, answers: list[tuple[float, float]]) -> None:
        self.answers, self.reads = answers, 0

    def next(self) -> tuple[float, float]:
        answer = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        return answer


@pytest.fixture
def server() -> Iterator[tuple[ThreadingHTTPServer, Held]]:
    held = Held([(0, 0)])

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            running, waiting = held.next()
            body = (
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
                f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
                'vllm:num_requests_running_total{engine="0"} 99.0\n'  # another series of the same prefix
                "\n"  # a blank line: skipped
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, held
    httpd.shutdown()
    httpd.server_close()


def drain(port: int, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRAIN_SCRIPT, str(port), "0"], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("answers", "reads"),
    [
        pytest.param([(0, 0)], 1, id="idle-at-once"),
        pytest.param([(2, 1), (1, 0), (0, 0)], 3, id="waits-for-running-and-waiting"),
    ],
)
def test_the_drain_returns_once_the_server_holds_nothing(server, answers, reads):
    httpd, held = server
    held.answers = answers
    finished = drain(httpd.server_address[1])
    assert (finished.returncode, finished.stderr) == (0, "")
    assert held.reads == reads


def test_a_server_that_no_longer_answers_holds_nothing(server):
    httpd, _ = server
    port = httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    finished = drain(port)
    assert (finished.returncode, finished.stderr) == (0, "")
