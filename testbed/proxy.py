"""A TCP relay between the operator and the API server whose open connections a test can cut, as a load
balancer restart or a network blip would: the TLS session runs end to end through it, untouched."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class CuttableProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._refusing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, rewritten: Path) -> CuttableProxy:
        """A relay to the kubeconfig's API server, and a copy of the kubeconfig (at `rewritten`) that goes
        through it. The server certificate stays valid: the relay listens on the same address, 127.0.0.1."""
        config = yaml.safe_load(kubeconfig.read_text())
        server = urlsplit(config["clusters"][0]["cluster"]["server"])
        assert server.hostname and server.port, server
        proxy = cls((server.hostname, server.port))
        config["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
        rewritten.write_text(yaml.safe_dump(config))
        return proxy

    def cut(self) -> int:
        """Resets every open connection (both sides see it at once); returns how many there were."""
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)
        return len(sockets) // 2

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """The API server unreachable through the relay while inside: open connections are cut and new ones
        closed at once (a network partition between the operator and the API server)."""
        self._refusing.set()
        self.cut()
        try:
            yield
        finally:
            self._refusing.clear()

    def close(self) -> None:
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._refusing.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, sink}
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
