"""Metadata v4 over a raw socket, to one given broker: librdkafka picks the
broker that answers a metadata request itself, and the suite needs each
node's own view (a leader cut off from the cluster may still name itself).
Built by hand from Kafka's schemas; nothing shared with the node's code."""

import socket
import struct

API_METADATA = 3
VERSION = 4


class WireError(Exception):
    pass


def _string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class _Reader:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise WireError("metadata response truncated")
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take(">h")
        if n < 0:
            return None
        if self.pos + n > len(self.buf):
            raise WireError("metadata response truncated")
        s = self.buf[self.pos:self.pos + n].decode(errors="replace")
        self.pos += n
        return s

    def array(self, item):
        n = self.take(">i")
        if n < 0:
            return []
        if n > 100_000:
            raise WireError(f"implausible array length {n}")
        return [item() for _ in range(n)]


def _recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise WireError("connection closed")
        out += chunk
    return bytes(out)


def metadata(host, port, topics, timeout=1.0, correlation_id=1):
    """{'brokers': {id: (host, port)}, 'controller': id, 'topics': {name:
    {'error': code, 'partitions': {p: {'error', 'leader', 'replicas', 'isr'}}}}}."""
    body = struct.pack(">i", len(topics)) + b"".join(_string(t) for t in topics) + b"\x00"
    header = struct.pack(">hhi", API_METADATA, VERSION, correlation_id) + _string("skiff-nemesis")
    frame = header + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        if size < 4 or size > 16 << 20:
            raise WireError(f"bad response size {size}")
        buf = _recv_exact(s, size)
    r = _Reader(buf)
    if r.take(">i") != correlation_id:
        raise WireError("correlation id mismatch")
    r.take(">i")  # throttle_time_ms
    brokers = {}
    for node_id, bhost, bport in r.array(lambda: (r.take(">i"), r.string(), r.take(">i"), r.string())[:3]):
        brokers[node_id] = (bhost, bport)
    r.string()  # cluster_id
    controller = r.take(">i")

    def partition():
        err = r.take(">h")
        index = r.take(">i")
        leader = r.take(">i")
        replicas = r.array(lambda: r.take(">i"))
        isr = r.array(lambda: r.take(">i"))
        return index, {"error": err, "leader": leader, "replicas": replicas, "isr": isr}

    def topic():
        err = r.take(">h")
        name = r.string()
        r.take(">b")  # is_internal
        parts = dict(r.array(partition))
        return name, {"error": err, "partitions": parts}

    return {"brokers": brokers, "controller": controller, "topics": dict(r.array(topic))}
