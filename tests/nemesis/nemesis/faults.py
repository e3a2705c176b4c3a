"""The nemeses. Each is drawn with the run's seeded random.Random: the
partition whose leader it hits and how long it lasts are drawn before the
cluster is asked anything, so a seed always makes the same draws (the node
that leads that partition at that moment is the cluster's doing, and is
printed in the timeline).

A fault has start(run) and heal(run); faults compose (several in one cycle
start in order and heal in reverse order; network rules are removed one by
one, so healing one leaves the others)."""

import glob
import os
import re
import subprocess
import threading
import time

from . import net
from .nodes import CONTROLLER_PORT, NodeError

NAMES = ("kill", "pause", "isolate", "partition-leader", "one-way", "quorum-split", "slow", "disk-full", "bitflip",
         "lossy", "reorder", "slow-controller")
# Nemeses that need the topic's segments to roll during the run (segment.ms):
# disk-full bites when a roll needs new blocks, bitflip needs closed segments.
ROLLING = ("disk-full", "bitflip")


class Fault:
    name = "?"

    def __init__(self, partition, duration):
        self.partition = partition
        self.duration = duration
        self.node = None
        self.note = ""

    def resolve(self, leaders, nodes, controller=None):
        """The leader of the drawn partition now (`leaders`: {partition:
        leader or None}), or, with none known, the node the partition
        number names. (`controller`: the active controller, for the
        nemeses that hit it.)"""
        leader = leaders.get(self.partition)
        if leader is None:
            leader = 1 + self.partition % len(nodes)
            self.note = "no leader known; "
        self.node = leader
        return leader

    def target(self):
        return f"node {self.node} (leader of p{self.partition})"

    def start(self, run):
        raise NotImplementedError

    def tick(self, run):
        """Called every ~50 ms while the fault lasts."""

    def heal(self, run):
        """Undo the fault at once (every fault of the cycle heals before
        any settles)."""
        raise NotImplementedError

    def settle(self, run):
        """Wait (bounded) for what the heal started, e.g. a restart."""


class Kill(Fault):
    """SIGKILL and start again at once: same ports, same data directory."""
    name = "kill"

    def start(self, run):
        node = run.nodes[self.node]
        node.kill()
        self.killed_at = time.time()
        self.listening_at = None
        self.failures = []
        node.launch()

    def tick(self, run):
        """A start that fails (a listener's port still held by the killed
        process: issue 14, item 1) is recorded and started again at once."""
        node = run.nodes[self.node]
        if self.listening_at is not None:
            return
        if node.listening():
            self.listening_at = time.time()
        elif node.proc.poll() is not None and len(self.failures) < 10:
            self._failed(run, node)
            node.launch()

    def _failed(self, run, node):
        f = {"t": time.time(), "node": node.id, "after_kill_s": round(time.time() - self.killed_at, 3),
             "attempt": len(self.failures) + 1, "error": node.last_error()}
        self.failures.append(f)
        run.finding("restart_failed", f)
        time.sleep(min(0.02 * 2 ** len(self.failures), 1.0))

    def heal(self, run):
        pass  # started again already

    def settle(self, run):
        """Until the restarted node serves (after the cycle's network rules
        are gone: a node cut off cannot register)."""
        node = run.nodes[self.node]
        for _ in range(10):
            try:
                node.wait_listening()
                break
            except NodeError:
                if node.alive():  # did not listen in time: give up on it
                    raise
                self._failed(run, node)
                node.launch()
        else:
            raise NodeError(f"node {node.id} did not restart: {self.failures[-1]['error']}")
        if self.listening_at is None:
            self.listening_at = time.time()
        if self.failures:
            self.note += f"restart needed {len(self.failures) + 1} attempts; "
        self.note += f"listening {self.listening_at - self.killed_at:.1f}s after the kill; "


class Pause(Fault):
    """SIGSTOP the leader, SIGCONT it after the duration."""
    name = "pause"

    def start(self, run):
        run.nodes[self.node].pause()

    def heal(self, run):
        run.nodes[self.node].resume()


class _NetFault(Fault):
    def __init__(self, partition, duration):
        super().__init__(partition, duration)
        self.rules = []
        self.dropped_before = {}

    def _count_drops(self, run):
        self.dropped_before = {ns: run.net.dropped(ns) or 0 for ns in run.net.hosts}

    def _cut_from_other_nodes(self, run):
        """Both directions between this node and every other node."""
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules += run.net.cut(me, net.node_ns(other))

    def heal(self, run):
        dropped = sum((run.net.dropped(ns) or 0) - before for ns, before in self.dropped_before.items())
        run.net.remove(self.rules)
        self.rules = []
        self.note += f"{dropped} packets dropped; "


class Isolate(_NetFault):
    """Cut the node from the other nodes and from the clients."""
    name = "isolate"

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) from all"

    def start(self, run):
        self._cut_from_other_nodes(run)
        self.rules += run.net.cut(net.node_ns(self.node), net.CLIENT_NS)


class PartitionLeader(_NetFault):
    """Cut the leader from its followers; clients still reach it."""
    name = "partition-leader"

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) | others"

    def start(self, run):
        self._cut_from_other_nodes(run)


class OneWay(_NetFault):
    """Drop what the leader sends to its followers; the rest flows."""
    name = "one-way"

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) -> others"

    def start(self, run):
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules.append(run.net.drop(me, net.node_ns(other)))


def controller_status(run, node_id, timeout_ms=2000):
    """`skiff cluster status` asked of one node's controller from the client
    namespace (not cut by quorum-split): {"leader", "term", "commit"} or
    {"error"}. Starts the command and returns a function that waits for it."""
    addr = f"{net.node_ip(node_id)}:{CONTROLLER_PORT}"
    proc = subprocess.Popen(["ip", "netns", "exec", net.CLIENT_NS, run.cfg.skiff_bin, "cluster", "status",
                             "--controller", addr, "--timeout-ms", str(timeout_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait():
        try:
            out = proc.communicate(timeout=timeout_ms / 1000 + 10)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"error": "no answer"}
        return parse_status(out)

    wait.done = lambda: proc.poll() is not None
    return wait


def parse_status(text):
    """The fields of `skiff cluster status` the suite uses."""
    m = re.search(r"active controller: (?:node (\d+)|none)", text)
    term = re.search(r"raft term:\s+(\d+)", text)
    commit = re.search(r"commit index:\s+(\d+)", text)
    if not m or not term or not commit:
        return {"error": (text.strip().splitlines() or ["(no output)"])[-1][:200]}
    return {"leader": int(m.group(1)) if m.group(1) else None, "term": int(term.group(1)),
            "commit": int(commit.group(1))}


# How long after a quorum split the majority may take to name a new active
# controller (a few election rounds of 1-2 s) before that counts as an anomaly.
ELECTION_BOUND_S = 10.0
# How often the majority is asked for its active controller during the cut.
ELECTION_POLL_S = 0.25


def _resolve_controller(fault, leader_of, leaders, nodes, controller):
    """For the nemeses that hit the active controller: it, or (unknown) the
    leader of the drawn partition as any other nemesis picks."""
    if controller is None:
        fault.note = "active controller unknown; "
        return leader_of(leaders, nodes)
    fault.node = controller
    return controller


class QuorumSplit(_NetFault):
    """The active controller cut from the other two on the controller port
    only (both directions, either side the client): the quorum splits 1 | 2
    while every Kafka-port connection (replication, clients) still flows.
    Expected: the majority elects a new controller; the old one commits
    nothing from then on (it cannot reach a majority), so it decides nothing.
    Checked at the heal, before the rules go: each controller asked on its
    own (from the client namespace)."""
    name = "quorum-split"

    def resolve(self, leaders, nodes, controller=None):
        return _resolve_controller(self, super().resolve, leaders, nodes, controller)

    def target(self):
        return f"node {self.node} (active controller) | others, controller port"

    def start(self, run):
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules += run.net.cut_port(me, net.node_ns(other), CONTROLLER_PORT)
        self.started = time.time()
        self.baseline = None
        self.pending = None
        # When the majority first named another active controller: polled
        # every ELECTION_POLL_S during the cut (at the heal only, a short
        # cut's figure was its length).
        self.elected_at = None
        self.polls = None
        self.next_poll = self.started

    def tick(self, run):
        # The old controller's commit index once the cut is in place (1 s:
        # whatever a majority acknowledged before the cut has been applied).
        if self.baseline is None and self.pending is None and time.time() > self.started + 1.0:
            self.pending = controller_status(run, self.node)
        elif self.pending is not None and self.baseline is None:
            self.baseline = self.pending()
        if self.elected_at is not None:
            return
        if self.polls is None:
            if time.time() >= self.next_poll:
                self.polled_at = time.time()
                self.next_poll = self.polled_at + ELECTION_POLL_S
                self.polls = {i: controller_status(run, i) for i in run.nodes if i != self.node}
        elif all(w.done() for w in self.polls.values()):
            named = {v.get("leader") for v in (w() for w in self.polls.values()) if v.get("leader") is not None}
            self.polls = None
            if named and self.node not in named:
                self.elected_at = self.polled_at

    def heal(self, run):
        if self.pending is not None and self.baseline is None:
            self.baseline = self.pending()
        for w in (self.polls or {}).values():
            w()
        self.polls = None
        # Raft needs an election timeout (1-2 s) to notice that the old
        # controller is gone, and another round when the first vote is
        # refused (a voter still inside its leader lease) or split; on a
        # loaded machine ticks stretch too. A short cut can end before that:
        # the majority gets until ELECTION_BOUND_S after the cut to name a new
        # active controller, the cut kept meanwhile; only then is having none
        # an anomaly (seed 5002: elected 5.2 s after a 4.7 s cut).
        while True:
            waits = {i: controller_status(run, i) for i in run.nodes}
            views = {i: w() for i, w in waits.items()}
            others = [views[i] for i in run.nodes if i != self.node]
            named = {v.get("leader") for v in others if v.get("leader") is not None}
            if (named and self.node not in named) or time.time() >= self.started + ELECTION_BOUND_S:
                break
            time.sleep(0.25)
        self.views = views
        old = views[self.node]
        if named and self.node not in named:
            elected_at = self.elected_at if self.elected_at is not None else time.time()
            self.note += (f"majority elected node {','.join(map(str, sorted(named)))} "
                          f"within {elected_at - self.started:.1f}s of the cut; ")
        else:
            run.finding("controller_not_replaced", {"fault": self.name, "old": self.node, "views": views})
            self.note += f"!! the majority did not replace node {self.node}: {others}; "
        base = (self.baseline or {}).get("commit")
        if base is not None and old.get("commit") is not None and old["commit"] > base:
            run.finding("stale_controller_committed", {"fault": self.name, "old": self.node,
                                                       "commit_before": base, "commit_at_heal": old["commit"],
                                                       "views": views})
            self.note += f"!! node {self.node} committed {base}->{old['commit']} while cut off; "
        elif old.get("leader") == self.node:
            self.note += f"node {self.node} still names itself (term {old.get('term')}) but committed nothing; "
        super().heal(run)


# Below the replication traffic a leader sends here (two producers at 100
# writes/s: about 250 kbit/s to its followers), so a queue builds up.
SLOW_RATES_KBIT = (32, 64, 96, 128)


class _Shaped(_NetFault):
    """A fault that queues packets through htb classes (`net.shape`) at
    `rate_kbit`: samples the longest queue of any class every 0.1 s while
    it lasts (the longest delay) and sums the classes' counters at the
    heal."""

    def __init__(self, partition, duration, rates_kbit):
        super().__init__(partition, duration)
        self.rate_kbit = rates_kbit[int(round(duration * 100)) % len(rates_kbit)]
        self.classes = []
        self.peak_backlog = (0, 0)
        self.next_sample = 0.0

    def _shape(self, run, src, dsts, one_in=None):
        rules = run.net.shape(src, dsts, self.rate_kbit, one_in=one_in)
        self.rules += rules
        self.classes.append(rules[-1])

    def _stats(self, run):
        """Each class's stats that could be read."""
        return [st for st in (run.net.class_stats(c) for c in self.classes) if st]

    def tick(self, run):
        if time.time() < self.next_sample:
            return
        self.next_sample = time.time() + 0.1
        for st in self._stats(run):
            if st[3] > self.peak_backlog[0]:
                self.peak_backlog = (st[3], st[4])

    def heal(self, run):
        stats = self._stats(run)
        run.net.remove(self.rules)
        self.rules = []
        if stats:
            self.note += self._summary(tuple(map(sum, zip(*stats))))

    def _delay(self):
        peak_b, peak_p = self.peak_backlog
        return f"peak backlog {peak_b} B / {peak_p} pkts (~{peak_b * 8 / (self.rate_kbit * 1000):.1f}s of delay)"


class Slow(_Shaped):
    """What the leader sends to the other nodes goes through a low-rate htb
    class with a long pfifo: replication and controller traffic from it queue
    (hundreds of ms to seconds of delay once the rate is exceeded); clients
    are not slowed. The rate (32 to 128 kbit/s, below what the workload's
    replication needs) follows the seeded duration. In order and without
    loss: reorder and lossy take a share of the packets instead."""
    name = "slow"

    def __init__(self, partition, duration):
        super().__init__(partition, duration, SLOW_RATES_KBIT)

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) -> others at {self.rate_kbit} kbit"

    def start(self, run):
        self._shape(run, net.node_ns(self.node), [net.node_ns(o) for o in run.nodes if o != self.node])

    def _summary(self, st):
        return f"{st[0] // 1024} KiB queued through, {self._delay()}, {st[2]} dropped; "


# The slowed controller's rates: 32 kbit/s queued ~3 s of delay in seed 9101's
# cycle 423 (`slow` on a leader that was also the active controller).
SLOW_CONTROLLER_RATES_KBIT = (32, 64)


class SlowController(Slow):
    """`slow` aimed at the active controller: everything it sends to the other
    nodes (Raft messages, answers to their heartbeats and metadata polls,
    and replication from the partitions it leads) queues behind a low-rate
    htb class, while its messages keep arriving, seconds late. Raft alone
    keeps such a leader (check-quorum and the election timeout see it talk);
    the brokers' heartbeats time out on it, and before skiff's followers
    probed their leader's answers (`controller/src/lag.rs`) every broker's
    lease ran out and every partition stepped down (seed 9101 cycle 423).
    Expected: the other voters replace it and no partition led elsewhere
    stalls. Noted at the heal: whom the others name as active controller."""
    name = "slow-controller"

    def __init__(self, partition, duration):
        _Shaped.__init__(self, partition, duration, SLOW_CONTROLLER_RATES_KBIT)

    def resolve(self, leaders, nodes, controller=None):
        return _resolve_controller(self, super().resolve, leaders, nodes, controller)

    def target(self):
        return f"node {self.node} (active controller) -> others at {self.rate_kbit} kbit"

    def heal(self, run):
        waits = {i: controller_status(run, i) for i in run.nodes if i != self.node}
        named = {v.get("leader") for v in (w() for w in waits.values()) if v.get("leader") is not None}
        super().heal(run)
        if named:
            moved = named - {self.node}
            self.note += (f"others name node {','.join(map(str, sorted(named)))} as controller"
                          f"{' (replaced)' if moved and self.node not in named else ''}; ")


# The share of packets the lossy nemesis drops, by the seeded duration: one in
# 4, 8 or 16 (the IPv4 identification rule of net.py takes one in 2^k).
LOSS_ONE_IN = (4, 8, 16)


class Lossy(_NetFault):
    """A grey link: one packet in 4, 8 or 16 (by the seeded duration) dropped
    both ways between the leader and the other nodes; clients are not
    touched. TCP retransmits after its timeouts, so replication and the
    controller links stutter rather than stop: the leader may fall behind
    its lease or its followers out of the ISR, or neither."""
    name = "lossy"

    def __init__(self, partition, duration):
        super().__init__(partition, duration)
        self.one_in = LOSS_ONE_IN[int(round(duration * 100)) % len(LOSS_ONE_IN)]

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) <-> others, 1 in {self.one_in} packets dropped"

    def start(self, run):
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules.append(run.net.drop(me, net.node_ns(other), one_in=self.one_in))
                self.rules.append(run.net.drop(net.node_ns(other), me, one_in=self.one_in))


# The rate of the class the reorder nemesis delays its packets through.
REORDER_RATES_KBIT = (16, 32, 64)
# The share of packets it delays: one in REORDER_ONE_IN.
REORDER_ONE_IN = 4


class Reorder(_Shaped):
    """Reordering with jitter: one packet in 4, both ways between the leader
    and the other nodes, goes through a low-rate htb class (16 to 64 kbit/s
    by the seeded duration, below the quarter of the workload's replication
    traffic it gets) with a long queue, the others straight on. A delayed
    packet arrives after packets sent later, by what queues before it (from
    tens of ms to seconds, growing while the fault lasts); TCP puts the
    stream back in order, retransmitting what took too long (a retransmitted
    segment has a new IP identification, so it mostly goes straight on).
    Nothing is dropped while the fault lasts; the heal drops what is still
    queued (TCP sends it again)."""
    name = "reorder"

    def __init__(self, partition, duration):
        super().__init__(partition, duration, REORDER_RATES_KBIT)

    def target(self):
        return (f"node {self.node} (leader of p{self.partition}) <-> others, 1 in {REORDER_ONE_IN} packets "
                f"at {self.rate_kbit} kbit")

    def start(self, run):
        me = net.node_ns(self.node)
        others = [net.node_ns(o) for o in run.nodes if o != self.node]
        self._shape(run, me, others, one_in=REORDER_ONE_IN)
        for other in others:
            self._shape(run, other, [me], one_in=REORDER_ONE_IN)

    def _summary(self, st):
        return f"{st[1]} packets delayed ({st[0] // 1024} KiB), {self._delay()}; "


class DiskFull(Kill):
    """The leader's filesystem (its own loop-mounted ext4) filled to the last
    block: writes that need new blocks (a segment roll, a checkpoint, the
    metadata log) fail with ENOSPC, the partitions hit go offline, the node
    reports them and leadership moves. Heal: the filler removed, the node
    SIGKILLed and started again (a failed log directory needs a restart, as
    in Kafka)."""
    name = "disk-full"

    def start(self, run):
        disk = run.disks.get(self.node) if run.disks else None
        if disk is None:
            raise NodeError("disk-full needs loop-backed data directories (run.disks)")
        self.disk = disk
        taken, left = disk.fill()
        self.filled_at = time.time()
        self.offline_at = None
        self.log_from = os.path.getsize(run.nodes[self.node].log_path)
        self.note += f"filled {taken >> 20} MiB, {left} B left; "
        self.stop_filling = threading.Event()
        self.regrabbed = []
        self.filler = threading.Thread(target=lambda: self.regrabbed.append(disk.keep_full(self.stop_filling)),
                                       daemon=True)
        self.filler.start()

    def tick(self, run):
        if self.offline_at is not None:
            return
        node = run.nodes[self.node]
        with open(node.log_path, "rb") as f:
            f.seek(self.log_from)
            text = f.read().decode(errors="replace")
        if "No space left on device" in text:
            self.offline_at = time.time()

    def heal(self, run):
        self.stop_filling.set()
        self.filler.join(10)
        if self.regrabbed and self.regrabbed[0]:
            self.note += f"{self.regrabbed[0] >> 10} KiB freed by the node taken again; "
        self.disk.unfill()
        node = run.nodes[self.node]
        node.resume()
        node.kill()
        self.killed_at = time.time()
        self.listening_at = None
        self.failures = []
        node.launch()
        if self.offline_at is None:
            self.note += "no ENOSPC in the node log during the fault; "
        else:
            self.note += f"first ENOSPC {self.offline_at - self.filled_at:.1f}s after the fill; "


# How long a bitflip's settle waits for the node to find and repair the flip.
BITFLIP_SETTLE_S = 60.0


class Bitflip(Fault):
    """One byte flipped in a closed segment of the leader's replica of the
    drawn partition, while the node runs: the last byte of the last record's
    value of a batch (XOR 1 keeps a digit a digit, so a reader that does not
    check the CRC serves another plausible value). The batch CRC no longer
    matches. Written with a normal write + fsync (the node reads with
    O_DIRECT, so it sees the disk). Nothing to undo at the heal: the node
    is expected to find the bad batch (CRC) and repair its replica from the
    others; the run records where the flip is so the checker can say which
    anomalies it explains.

    The fault is over only once the node has found and repaired it: until
    then the partition has one sound replica fewer, and the next cycle's
    fault would take a second (with min.insync.replicas=2, an isolated
    follower of that partition then stops its writes, as it must). So the
    settle waits, at most BITFLIP_SETTLE_S, for the node's log to say it
    repaired that partition (its scrubber reads every closed segment at
    64 MiB/s), or for the segment to be gone (retention took it first)."""
    name = "bitflip"

    def target(self):
        return f"node {self.node} (leader of p{self.partition}), a closed segment"

    def start(self, run):
        self.done = None
        self.tries = 0
        self.tick(run)

    def tick(self, run):
        if self.done is not None or self.tries > 100:
            return
        self.tries += 1
        node = run.nodes[self.node]
        pdir = os.path.join(node.data_dir, f"{run.topic}-{self.partition}")
        segments = sorted(glob.glob(os.path.join(pdir, "*.log")))
        closed = segments[:-1]  # the newest is the active one
        if not closed:
            return
        seg = closed[int(round(self.duration * 100)) % len(closed)]
        batches = list(scan_batches(seg))
        if not batches:
            return
        pos, size, base, last = batches[int(round(self.duration * 1000)) % len(batches)]
        self.log_from = os.path.getsize(node.log_path) if os.path.exists(node.log_path) else 0
        self.segment = seg
        at = pos + size - 2  # the last value byte; the final byte is the record's header count
        with open(seg, "r+b") as f:
            f.seek(at)
            old = f.read(1)[0]
            f.seek(at)
            f.write(bytes([old ^ 1]))
            f.flush()
            os.fsync(f.fileno())
        self.done = {"node": self.node, "partition": self.partition, "segment": os.path.basename(seg),
                     "position": at, "batch": [base, last], "byte": [old, old ^ 1], "t": time.time()}
        run.corruptions.append(self.done)
        self.note += (f"{os.path.basename(seg)} @{at}: batch {base}-{last}, {old:#04x}->{old ^ 1:#04x}; ")

    def heal(self, run):
        if self.done is None:
            self.note += "no closed segment with a batch found: nothing flipped; "

    def settle(self, run):
        if self.done is None:
            return
        node = run.nodes[self.node]
        pdir = f"/{run.topic}-{self.partition}/"
        deadline = self.done["t"] + BITFLIP_SETTLE_S
        while True:
            if repaired_since(node.log_path, self.log_from, pdir):
                self.note += f"found and repaired {time.time() - self.done['t']:.1f}s after the flip; "
                return
            if not os.path.exists(self.segment):
                self.note += "the segment was deleted before the node read it; "
                return
            if time.time() > deadline:
                self.note += f"not repaired {BITFLIP_SETTLE_S:.0f}s after the flip; "
                return
            time.sleep(0.2)


def repaired_since(log_path, offset, partition_dir):
    """Whether the node log, from byte `offset` on, says the node repaired a
    corrupt log in `partition_dir` (a "/<topic>-<partition>/" path piece)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    return any("repaired the corrupt partition log" in line and partition_dir in line
               for line in text.splitlines())


def scan_batches(path):
    """(position, size, base offset, last offset) of each record batch in a
    segment file, up to the first that does not parse (a zero tail)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 61 <= len(data):
        base = int.from_bytes(data[pos:pos + 8], "big", signed=True)
        length = int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
        if length < 49 or pos + 12 + length > len(data) or data[pos + 16] != 2:
            return
        delta = int.from_bytes(data[pos + 23:pos + 27], "big", signed=True)
        yield pos, 12 + length, base, base + delta
        pos += 12 + length


KINDS = {k.name: k for k in (Kill, Pause, Isolate, PartitionLeader, OneWay, QuorumSplit, Slow, DiskFull, Bitflip,
                             Lossy, Reorder, SlowController)}
assert tuple(KINDS) == NAMES


class Schedule:
    """Which nemeses each cycle uses: every nemesis once per round, in an
    order shuffled by the seed (so a run of N cycles covers every nemesis as
    soon as N >= their number); `concurrent` > 1 puts that many different
    nemeses in one cycle."""

    def __init__(self, rng, names, concurrent=1, min_s=3.0, max_s=8.0, partitions=3):
        self.rng = rng
        self.names = list(names)
        self.concurrent = max(1, min(concurrent, len(self.names)))
        self.min_s, self.max_s = min_s, max_s
        self.partitions = partitions
        self.bag = []

    def _next_name(self, avoid):
        for _ in range(2 * len(self.names) + 2):
            if not self.bag:
                self.bag = self.names[:]
                self.rng.shuffle(self.bag)
            name = self.bag.pop(0)
            if name not in avoid:
                return name
            self.bag.append(name)
        return self.rng.choice([n for n in self.names if n not in avoid])

    def next_cycle(self):
        """(quiet seconds before the fault, [faults]) for the next cycle."""
        quiet = round(self.rng.uniform(1.0, 3.0), 2)
        duration = round(self.rng.uniform(self.min_s, self.max_s), 2)
        chosen = []
        for _ in range(self.concurrent):
            name = self._next_name(chosen)
            chosen.append(name)
        faults = [KINDS[n](self.rng.randrange(self.partitions), duration) for n in chosen]
        return quiet, faults

