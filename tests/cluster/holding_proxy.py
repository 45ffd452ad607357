"""A TCP relay in front of the API server that can hold what a client sends: the network's part
of a split brain.  While holding, every byte a client writes is kept back (the client has sent
it, as far as it can tell); on release it reaches the server in order, late.  What the server
sends back always passes.  The relay never closes a server connection while it holds bytes for
it, so a request the client gave up on still arrives whole, as a delayed packet would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

CHUNK = 65536
END_OF_STREAM_DELAY = 10.0


class HoldingProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._holding = False
        # (server socket, bytes or None for the client's end of stream), in arrival order.
        self._held: list[tuple[socket.socket, bytes | None]] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for _, b in self._held if b)

    def hold(self) -> None:
        with self._lock:
            self._holding = True

    def release(self) -> None:
        """Deliver everything held, in order, then pass bytes through again."""
        with self._lock:
            self._holding = False
            held, self._held = self._held, []
            for server, data in held:
                if data is None:
                    # A client that gave up: its request arrives whole, and the server is not told
                    # of the end of stream (which would cancel the request) until it has answered.
                    threading.Timer(END_OF_STREAM_DELAY, self._forward, (server, None)).start()
                else:
                    self._forward(server, data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        for s in sockets:
            with suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        while True:
            try:
                data: bytes | None = client.recv(CHUNK) or None
            except OSError:
                data = None
            with self._lock:
                if self._holding:
                    self._held.append((server, data))
                else:
                    self._forward(server, data)
            if data is None:
                return

    @staticmethod
    def _forward(server: socket.socket, data: bytes | None) -> None:
        try:
            if data is None:
                server.shutdown(socket.SHUT_WR)
            else:
                server.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _down(server: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = server.recv(CHUNK)
                if not data:
                    client.shutdown(socket.SHUT_WR)
                    return
                client.sendall(data)
            except OSError:
                return


@contextmanager
def holding_proxy(upstream: tuple[str, int]) -> Iterator[HoldingProxy]:
    proxy = HoldingProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
