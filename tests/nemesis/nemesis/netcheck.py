"""A TCP probe run inside a namespace (`ip netns exec NS python -m
nemesis.netcheck ...`), used to prove the drop rules work before the suite
relies on them.

  serve IP:PORT SECONDS   accept and answer b"ok" until SECONDS passed
  connect IP:PORT         print "ok" or "fail <error>"; exit 0 either way
"""

import socket
import sys
import time


def serve(host, port, seconds):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    print("listening", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            c, _ = s.accept()
        except socket.timeout:
            break
        with c:
            c.sendall(b"ok")


def connect(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout) as c:
            c.settimeout(timeout)
            got = c.recv(2)
        print("ok" if got == b"ok" else f"fail answer {got!r}")
    except OSError as e:
        print(f"fail {e!r}")


def main(argv):
    mode, addr = argv[0], argv[1]
    host, port = addr.rsplit(":", 1)
    if mode == "serve":
        serve(host, int(port), float(argv[2]))
    elif mode == "connect":
        connect(host, int(port))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
