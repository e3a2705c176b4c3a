"""A user-space TCP proxy for one link between nodes on loopback, so a test can
cut that link alone while everything else (clients, other links) goes on.

`cut()` makes the link silent the way a dropped network is: connections stay
open but nothing crosses them, new connections are accepted and never answered
(no reset, no error: the peer only learns through its own timeouts).
`heal()` closes what was held, so both ends reconnect. `stall_existing()`
is the heal TCP gives after a real cut: the connections that lived through
it stay silent (their retransmission timers backed off), new ones work.
Threads, bounded: one
accept thread, two pump threads per connection; `close()` ends them all."""

import socket
import threading


class Proxy:
    def __init__(self, target_host, target_port):
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._silent = False
        self._closed = False
        self._conns = []  # (client, upstream or None)
        self._stalled = set()  # sockets of pairs that stay silent for good
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def cut(self):
        with self._lock:
            self._silent = True

    def stall_existing(self):
        """Every open connection goes silent for good; new ones are served."""
        with self._lock:
            for pair in self._conns:
                self._stalled.update(s for s in pair if s is not None)

    def heal(self):
        with self._lock:
            self._silent = False
            held, self._conns = self._conns, []
        for pair in held:
            self._close_pair(pair)

    def close(self):
        with self._lock:
            self._closed = True
            held, self._conns = self._conns, []
        try:
            self.listener.close()
        except OSError:
            pass
        for pair in held:
            self._close_pair(pair)

    @staticmethod
    def _close_pair(pair):
        for s in pair:
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept_loop(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    client.close()
                    return
                if self._silent:
                    # Held open, never answered.
                    self._conns.append((client, None))
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self._lock:
                self._conns.append(pair)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                self._close_pair((src, dst))
                return
            with self._lock:
                silent = self._silent or src in self._stalled
            if silent:
                continue  # dropped on the floor, as a cut network does
            try:
                dst.sendall(data)
            except OSError:
                return
