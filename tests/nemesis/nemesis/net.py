"""The suite's network: one namespace per node, one for the clients, and one
holding the bridge that joins them (veth pairs), all named with PREFIX so a
killed run's leftovers can be found and removed. Addresses come from one
private /24 used only inside these namespaces; the root namespace's
interfaces and routes are never touched.

Packet drops without netem or tc's drop action: every namespace's eth0 gets
an htb root qdisc whose default class passes traffic and a second class that
ends in `pfifo limit 0` (it drops everything it is given); u32 filters
matching the destination address steer the packets to drop into that class.
A filter on A's eth0 for B's address drops A -> B; one on each side cuts both
directions. Each rule gets its own filter priority so it can be removed alone
(faults compose). A rule may also match a TCP source or destination port, so
one service's traffic (the controller quorum's) is cut while the rest flows.

Delay without netem: `shape` adds an htb class with a low rate whose leaf is
a long pfifo queue and steers A's packets for the given destinations into it;
what exceeds the rate waits in the queue (delay = backlog / rate).

A fraction of the packets (loss, reordering, jitter) without netem: a rule
may also match the low bits of the IPv4 header's identification field, so
it takes one packet in 2^k. Linux gives every TCP transmission (a
retransmission too) the next value of its socket's counter, so a dropped
segment's retransmission is taken no more often than any other packet
(SYN-ACKs, always identification 0, are never taken). (The
TCP checksum would look more random, but veth leaves it to the "hardware":
at the qdisc it holds only the pseudo-header's sum, the same for every
segment of one size, and a rule on it would drop one retransmission after
another.) Dropped, that fraction is loss; steered into a `shape` class, it
arrives after packets sent later: reordering with jitter."""

import re
import subprocess
import time

PREFIX = "skn-"
SUBNET = "10.77.0"  # .0/24, only inside the suite's namespaces
BRIDGE_NS = PREFIX + "br"
CLIENT_NS = PREFIX + "cl"
CLIENT_IP = f"{SUBNET}.100"
CMD_TIMEOUT_S = 20.0


class NetError(Exception):
    pass


def run(args, check=True, timeout=CMD_TIMEOUT_S):
    p = subprocess.run(args, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise NetError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return p


def node_ns(node_id):
    return f"{PREFIX}n{node_id}"


def node_ip(node_id):
    return f"{SUBNET}.{node_id}"


def list_suite_namespaces():
    p = run(["ip", "netns", "list"], check=False)
    names = []
    for line in p.stdout.decode(errors="replace").splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            names.append(name)
    return names


def ns_pids(ns):
    p = run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.decode().split() if x.isdigit()]


def remove_namespaces(log=print):
    """Kill every process left in a suite namespace (a killed run's nodes and
    clients), then delete the namespaces; their veths and the bridge go with
    them. Bounded: a few passes."""
    import os
    import signal

    names = list_suite_namespaces()
    for ns in names:
        pids = ns_pids(ns)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if pids:
            log(f"net: killed {len(pids)} leftover process(es) in {ns}: {pids}")
    deadline = time.monotonic() + 10
    for ns in names:
        while ns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        run(["ip", "netns", "del", ns], check=False)
    left = list_suite_namespaces()
    if left:
        raise NetError(f"could not remove namespaces {left}")
    return names


class Net:
    """The bridge namespace, a namespace per node and the client namespace;
    drop rules on each namespace's eth0."""

    def __init__(self, node_ids, log=print):
        self.node_ids = list(node_ids)
        self.log = log
        self.hosts = {node_ns(i): node_ip(i) for i in self.node_ids}
        self.hosts[CLIENT_NS] = CLIENT_IP
        self.rules = {}  # rule id -> (ns, dst ns, prio)
        self.classes = {}  # rule id -> (ns, class minor): shaping classes
        self._next_prio = 1
        self._next_class = 0x100
        self.up = False

    # -- setup and teardown

    def setup(self):
        leftovers = remove_namespaces(self.log)
        if leftovers:
            self.log(f"net: removed leftovers of an earlier run: {', '.join(leftovers)}")
        self.up = True  # from here teardown has something to remove
        run(["ip", "netns", "add", BRIDGE_NS])
        run(["ip", "-n", BRIDGE_NS, "link", "set", "lo", "up"])
        run(["ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", BRIDGE_NS, "link", "set", "br0", "up"])
        for k, (ns, ip) in enumerate(self.hosts.items()):
            run(["ip", "netns", "add", ns])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            peer = f"v{k}"
            run(["ip", "-n", BRIDGE_NS, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(["ip", "-n", BRIDGE_NS, "link", "set", peer, "master", "br0"])
            run(["ip", "-n", BRIDGE_NS, "link", "set", peer, "up"])
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            self._qdisc(ns)

    def _qdisc(self, ns):
        tc = ["ip", "netns", "exec", ns, "tc"]
        run(tc + ["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"])
        for cls in ("1:10", "1:20"):
            run(tc + ["class", "add", "dev", "eth0", "parent", "1:", "classid", cls,
                      "htb", "rate", "10gbit", "quantum", "60000"])
        run(tc + ["qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "pfifo", "limit", "0"])

    def teardown(self):
        if not self.up:
            return
        self.up = False
        remove_namespaces(self.log)

    # -- drop rules

    def _filter(self, src_ns, dst_ns, flowid, sport=None, dport=None, one_in=None):
        prio = self._next_prio
        self._next_prio += 1
        match = ["match", "ip", "dst", f"{self.hosts[dst_ns]}/32"]
        if sport is not None:
            match += ["match", "ip", "sport", str(sport), "0xffff"]
        if dport is not None:
            match += ["match", "ip", "dport", str(dport), "0xffff"]
        if one_in is not None:
            if one_in < 2 or one_in & (one_in - 1):
                raise NetError(f"one_in must be a power of two >= 2, not {one_in}")
            # The identification field (bytes 4-5 of the IPv4 header): its
            # low bits equal to 1 in one packet of `one_in`. Not 0: SYN-ACKs
            # (with DF) go out with identification 0, and a rule on 0 would
            # take every one of them, so no connection could open.
            match += ["match", "u16", "0x1", f"{one_in - 1:#x}", "at", "4"]
        run(["ip", "netns", "exec", src_ns, "tc", "filter", "add", "dev", "eth0", "parent", "1:",
             "protocol", "ip", "prio", str(prio), "u32", *match, "flowid", flowid])
        self.rules[prio] = (src_ns, dst_ns, prio)
        return prio

    def drop(self, src_ns, dst_ns, sport=None, dport=None, one_in=None):
        """Drop every IPv4 packet src_ns sends to dst_ns (only those from TCP
        port `sport` / to `dport` when given; one in `one_in` of them when
        given, a power of two); returns the rule id."""
        return self._filter(src_ns, dst_ns, "1:20", sport, dport, one_in)

    def cut_port(self, a_ns, b_ns, port):
        """Both directions of every TCP connection between a and b that has
        `port` at one end (either side may be the server): four rule ids."""
        return [self.drop(a_ns, b_ns, dport=port), self.drop(a_ns, b_ns, sport=port),
                self.drop(b_ns, a_ns, dport=port), self.drop(b_ns, a_ns, sport=port)]

    def shape(self, src_ns, dst_nss, rate_kbit, limit_packets=10000, one_in=None):
        """What src_ns sends to dst_nss (one packet in `one_in` of it when
        given) goes through one htb class of rate_kbit (ceil the same) with
        a pfifo of limit_packets: a queue that only grows when the traffic
        exceeds the rate. Returns the rule ids (filters, then the class)."""
        minor = self._next_class
        self._next_class += 1
        cls = f"1:{minor:x}"
        tc = ["ip", "netns", "exec", src_ns, "tc"]
        run(tc + ["class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb", "rate", f"{rate_kbit}kbit",
                  "ceil", f"{rate_kbit}kbit", "burst", "1600", "cburst", "1600"])
        run(tc + ["qdisc", "add", "dev", "eth0", "parent", cls, "handle", f"{minor:x}:", "pfifo", "limit",
                  str(limit_packets)])
        rid = f"class-{minor:x}"
        self.classes[rid] = (src_ns, minor)
        return [self._filter(src_ns, dst, cls, one_in=one_in) for dst in dst_nss] + [rid]

    def class_stats(self, rid):
        """(bytes sent, packets sent, dropped, backlog bytes, backlog packets)
        of a shaping class, from `tc -s class show`; None if unknown."""
        entry = self.classes.get(rid)
        if entry is None:
            return None
        ns, minor = entry
        p = run(["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", "eth0", "classid", f"1:{minor:x}"],
                check=False)
        text = p.stdout.decode(errors="replace")
        sent = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)", text)
        backlog = re.search(r"backlog (\d+)b (\d+)p", text)
        if not sent or not backlog:
            return None
        return (int(sent.group(1)), int(sent.group(2)), int(sent.group(3)), int(backlog.group(1)),
                int(backlog.group(2)))

    def cut(self, a_ns, b_ns):
        """Both directions between a and b: two rule ids."""
        return [self.drop(a_ns, b_ns), self.drop(b_ns, a_ns)]

    def remove(self, rule_ids):
        """Filters first, then shaping classes (what a class still queues is
        dropped with it; TCP sends it again)."""
        for rid in rule_ids:
            rule = self.rules.pop(rid, None)
            if rule is None:
                continue
            ns, _, prio = rule
            run(["ip", "netns", "exec", ns, "tc", "filter", "del", "dev", "eth0", "parent", "1:",
                 "prio", str(prio)], check=False)
        for rid in rule_ids:
            entry = self.classes.pop(rid, None)
            if entry is None:
                continue
            ns, minor = entry
            tc = ["ip", "netns", "exec", ns, "tc"]
            run(tc + ["qdisc", "del", "dev", "eth0", "parent", f"1:{minor:x}"], check=False)
            run(tc + ["class", "del", "dev", "eth0", "classid", f"1:{minor:x}"], check=False)

    def heal_all(self):
        self.remove(list(self.rules) + list(self.classes))
        for ns in self.hosts:
            run(["ip", "netns", "exec", ns, "tc", "filter", "del", "dev", "eth0", "parent", "1:"], check=False)

    def dropped(self, ns):
        """Packets dropped so far by ns's drop class (from `tc -s`)."""
        p = run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "eth0"], check=False)
        text = p.stdout.decode(errors="replace")
        at = text.find("pfifo 20:")
        if at < 0:
            return None
        m = re.search(r"dropped (\d+)", text[at:])
        return int(m.group(1)) if m else None

    def describe(self, rule_ids):
        return ", ".join(f"{self.rules[r][0]}->{self.rules[r][1]}" for r in rule_ids if r in self.rules)
