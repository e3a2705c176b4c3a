"""The nemeses. Each is drawn with the run's seeded random.Random: the
partition whose leader it hits and how long it lasts are drawn before the
cluster is asked anything, so a seed always makes the same draws (the node
that leads that partition at that moment is the cluster's doing, and is
printed in the timeline).

A fault has start(run) and heal(run); faults compose (several in one cycle
start in order and heal in reverse order; network rules are removed one by
one, so healing one leaves the others)."""

import time

from . import net
from .nodes import NodeError

NAMES = ("kill", "pause", "isolate", "partition-leader", "one-way")


class Fault:
    name = "?"

    def __init__(self, partition, duration):
        self.partition = partition
        self.duration = duration
        self.node = None
        self.note = ""

    def resolve(self, leaders, nodes):
        """The leader of the drawn partition now (`leaders`: {partition:
        leader or None}), or, with none known, the node the partition
        number names."""
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
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules += run.net.cut(me, net.node_ns(other))
        self.rules += run.net.cut(me, net.CLIENT_NS)


class PartitionLeader(_NetFault):
    """Cut the leader from its followers; clients still reach it."""
    name = "partition-leader"

    def target(self):
        return f"node {self.node} (leader of p{self.partition}) | others"

    def start(self, run):
        self._count_drops(run)
        me = net.node_ns(self.node)
        for other in run.nodes:
            if other != self.node:
                self.rules += run.net.cut(me, net.node_ns(other))


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


KINDS = {k.name: k for k in (Kill, Pause, Isolate, PartitionLeader, OneWay)}
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

