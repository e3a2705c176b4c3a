"""Connection limits (issue 17), Kafka's way: `max.connections.per.ip` closes a
new connection from an address at its limit as soon as it is accepted, while
that address's open connections and other clients are served;
`max.connections` leaves new connections waiting (unanswered, in the
backlog) until one of the open ones ends."""

import time

import kafka_wire as kw
from conftest import Node, _finish_node, _live_nodes, free_port


def node_with(**settings):
    n = Node(controller_listen=f"127.0.0.1:{free_port()}")
    n.settings.update({k.replace("_", "."): v for k, v in settings.items()})
    _live_nodes.append(n)
    n.start()
    return n


def served(conn):
    error, apis = kw.api_versions(conn)
    return error == 0 and kw.API_API_VERSIONS in apis


def test_an_address_at_its_limit_gets_no_more_connections():
    n = node_with(max_connections_per_ip="3")
    try:
        held = [kw.Conn(n.bootstrap) for _ in range(3)]
        assert all(served(c) for c in held)
        extra = kw.Conn(n.bootstrap)
        assert extra.closed_by_peer(timeout=10), "a 4th connection from 127.0.0.1 was kept"
        extra.close()
        # The three are still served, and one closing makes room for one.
        assert all(served(c) for c in held)
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:
            c = kw.Conn(n.bootstrap)
            try:
                if served(c):
                    break
            except (ConnectionError, OSError):
                pass
            c.close()
            assert time.monotonic() < deadline, "no room after a connection closed"
            time.sleep(0.1)
        held.append(c)
        for c in held:
            c.close()
        log = open(n.log_path, errors="replace").read()
        assert "max.connections.per.ip" in log
        status, text = n.http_get("/metrics")
        refused = [line for line in text.splitlines() if line.startswith("skiff_connections_refused_total ")]
        # The 4th connection, and any retry above that came before the
        # closed one was given back.
        assert status == 200 and refused and float(refused[0].split()[1]) >= 1, refused
    finally:
        _finish_node(n)


def test_past_max_connections_new_ones_wait_until_one_closes():
    n = node_with(max_connections="2")
    try:
        first, second = kw.Conn(n.bootstrap), kw.Conn(n.bootstrap)
        assert served(first) and served(second)
        waiting = kw.Conn(n.bootstrap, timeout=2)  # in the kernel's backlog
        waiting.send_raw(kw.frame(kw.request_header_v1(kw.API_API_VERSIONS, 0, 1)))
        try:
            waiting.recv_frame()
            answered = True
        except (TimeoutError, OSError):
            answered = False
        assert not answered, "a connection past max.connections was served"
        first.close()
        waiting.sock.settimeout(10)
        body = waiting.recv_frame()  # the request sent while it waited
        assert body[:4] == (1).to_bytes(4, "big")
        assert served(second)
        waiting.close()
        second.close()
    finally:
        _finish_node(n)
