"""A TCP forwarder between two loopback ports that a test can cut and heal: the chaos suite puts
one between billing and PostgreSQL (PostgreSQL "stopped" without stopping the machine's shared
server) and one on each route link of a NATS node (a network partition without iptables or
network namespaces)."""

from __future__ import annotations

import socket
import struct
import threading


class Forwarder:
    """Forwards 127.0.0.1:`listen` to 127.0.0.1:`target`. `cut()` closes the listening socket (new
    connections are refused, as by a stopped server) and resets every open connection; `heal()`
    listens again."""

    def __init__(self, listen: int, target: int):
        self.listen, self.target = listen, target
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self.heal()

    def heal(self) -> None:
        with self._lock:
            if self._server is not None:
                return
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.listen))
            s.listen(128)
            self._server = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            server, self._server = self._server, None
            conns, self._conns = self._conns, set()
        if server is not None:
            try:
                server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            except OSError:
                pass
            server.close()
        for c in conns:
            # SO_LINGER 0: the pump's close() sends a reset; shutdown wakes the pump's recv().
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.cut()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._server is not server:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
