#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;
use crate::records::tests::tid;

const CFG: ControllerConfig = ControllerConfig {
    heartbeat_interval_ms: 2000,
    session_timeout_ms: 9000,
    unclean_leader_election: false,
    auto_leader_rebalance: true,
    leader_imbalance_check_interval_ms: 300_000,
    leader_imbalance_percentage: 10,
};

/// A state machine plus a log offset: applies decisions as the quorum would.
struct Harness {
    state: ClusterState,
    offset: u64,
    sessions: Sessions,
}

impl Harness {
    fn new() -> Self {
        Self {
            state: ClusterState::new(),
            offset: 0,
            sessions: Sessions::new(),
        }
    }

    fn commit(&mut self, records: &[MetadataRecord]) {
        if records.is_empty() {
            return;
        }
        self.offset += 1;
        let refused = self.state.apply_batch(self.offset, records);
        assert!(refused.is_empty(), "decision records refused: {refused:?}");
    }

    fn register(&mut self, id: NodeId, rack: Option<&str>, incarnation: u8) -> i64 {
        let (records, epoch) = register(
            &self.state,
            &Registration {
                node_id: id,
                incarnation_id: [incarnation; 16],
                endpoints: vec![],
                rack: rack.map(str::to_string),
            },
            &CFG,
        )
        .unwrap();
        self.commit(&records);
        epoch
    }

    fn heartbeat(
        &mut self,
        id: NodeId,
        now: u64,
        shutdown: bool,
    ) -> Result<HeartbeatReply, ControllerError> {
        self.heartbeat_reporting(id, now, shutdown, Vec::new())
            .map(|(reply, _)| reply)
    }

    /// A heartbeat that reports `offline` partitions; also how many records
    /// it committed.
    fn heartbeat_reporting(
        &mut self,
        id: NodeId,
        now: u64,
        shutdown: bool,
        offline: Vec<(TopicId, u32)>,
    ) -> Result<(HeartbeatReply, usize), ControllerError> {
        let epoch = self.state.node(id).map_or(-1, |n| n.broker_epoch);
        let records = heartbeat(
            &self.state,
            &mut self.sessions,
            &Heartbeat {
                node_id: id,
                broker_epoch: epoch,
                metadata_offset: self.offset,
                want_fence: false,
                want_shutdown: shutdown,
                offline_partitions: offline,
            },
            now,
            &CFG,
        )?;
        self.commit(&records);
        Ok((heartbeat_reply(&self.state, id, shutdown), records.len()))
    }

    /// Registers and unfences nodes `1..=n` (racks when given).
    fn cluster(n: NodeId, racks: Option<&[&str]>) -> Self {
        let mut h = Self::new();
        for id in 1..=n {
            let rack = racks.map(|r| r[(id - 1) as usize % r.len()]);
            h.register(id, rack, id as u8);
            assert!(!h.heartbeat(id, 0, false).unwrap().is_fenced);
        }
        h
    }

    fn create(
        &mut self,
        name: &str,
        id: u8,
        partitions: i32,
        rf: i16,
    ) -> Result<(), ControllerError> {
        let records = create_topic(
            &self.state,
            &CreateTopic {
                name: name.into(),
                topic_id: tid(id),
                partitions,
                replication_factor: rf,
                configs: vec![],
                start_index: 0,
            },
        )?;
        self.commit(&records);
        Ok(())
    }

    fn part(&self, id: u8, index: u32) -> PartitionState {
        self.state.partition(tid(id), index).unwrap().clone()
    }
}

#[test]
fn registration_is_fenced_until_caught_up_and_retry_is_idempotent() {
    let mut h = Harness::new();
    let e1 = h.register(1, None, 9);
    assert_eq!(e1, 1);
    let registered = h.offset;
    // A retry by the same incarnation changes nothing.
    assert_eq!(h.register(1, None, 9), e1);
    assert_eq!(h.offset, registered);
    // Behind its registration: stays fenced.
    let records = heartbeat(
        &h.state,
        &mut h.sessions,
        &Heartbeat {
            node_id: 1,
            broker_epoch: e1,
            metadata_offset: registered - 1,
            want_fence: false,
            want_shutdown: false,
            offline_partitions: Vec::new(),
        },
        0,
        &CFG,
    )
    .unwrap();
    assert!(records.is_empty());
    // Caught up: unfenced.
    assert!(!h.heartbeat(1, 0, false).unwrap().is_fenced);
    // A stale epoch and an unknown node are refused with Kafka's errors.
    let stale = heartbeat(
        &h.state,
        &mut h.sessions,
        &Heartbeat {
            node_id: 1,
            broker_epoch: e1 - 1,
            metadata_offset: 0,
            want_fence: false,
            want_shutdown: false,
            offline_partitions: Vec::new(),
        },
        0,
        &CFG,
    )
    .unwrap_err();
    assert_eq!(stale.kafka_code(), 77);
    assert_eq!(h.heartbeat(7, 0, false).unwrap_err().kafka_code(), 102);
}

#[test]
fn session_timeout_fences_and_moves_leaderships_to_isr() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 3, 3).unwrap();
    let led_by_3: Vec<u32> = (0..3).filter(|i| h.part(1, *i).leader == 3).collect();
    assert_eq!(led_by_3.len(), 1);
    let before = h.part(1, led_by_3[0]);
    // Nodes 1 and 2 keep heartbeating; 3 goes silent.
    for now in (0..=9000).step_by(2000) {
        h.heartbeat(1, now, false).unwrap();
        h.heartbeat(2, now, false).unwrap();
    }
    let fence = fence_one_expired(&h.state, &mut h.sessions, 9000, &CFG);
    assert!(fence.is_empty(), "fenced at exactly the timeout");
    h.heartbeat(1, 9001, false).unwrap();
    h.heartbeat(2, 9001, false).unwrap();
    let fence = fence_one_expired(&h.state, &mut h.sessions, 9001, &CFG);
    assert!(!fence.is_empty());
    h.commit(&fence);
    assert!(h.state.node(3).unwrap().fenced);
    let after = h.part(1, led_by_3[0]);
    assert_ne!(after.leader, 3);
    assert_eq!(
        after.leader,
        before.replicas.iter().copied().find(|r| *r != 3).unwrap()
    );
    assert_eq!(after.leader_epoch, before.leader_epoch + 1);
    assert_eq!(after.partition_epoch, before.partition_epoch + 1);
    for i in 0..3 {
        let p = h.part(1, i);
        assert!(!p.isr.contains(&3), "fenced node left the ISR of {i}");
        assert_eq!(p.isr.len(), 2);
    }
    // Nothing more to fence.
    assert!(fence_one_expired(&h.state, &mut h.sessions, 9001, &CFG).is_empty());
}

#[test]
fn a_stall_of_the_controller_itself_fences_nobody() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 3, 3).unwrap();
    for node in 1..=3 {
        h.heartbeat(node, 1000, false).unwrap();
    }
    // The controller's thread stood still from 1,500 to 11,500 ms: every
    // session would have run out meanwhile; the stall is excused.
    h.sessions.excuse(10_000, 11_500);
    assert!(fence_one_expired(&h.state, &mut h.sessions, 11_500, &CFG).is_empty());
    // Time the controller was awake still counts: 1 and 2 heartbeat, 3
    // stays silent a whole session after the stall.
    for now in [12_000, 16_000, 20_000] {
        h.heartbeat(1, now, false).unwrap();
        h.heartbeat(2, now, false).unwrap();
    }
    assert!(fence_one_expired(&h.state, &mut h.sessions, 20_000, &CFG).is_empty());
    let fence = fence_one_expired(&h.state, &mut h.sessions, 20_001, &CFG);
    assert!(
        !fence.is_empty(),
        "3 was silent for a session of waking time"
    );
    h.commit(&fence);
    assert!(h.state.node(3).unwrap().fenced);
    // A stall never moves a session past now.
    h.heartbeat(1, 20_500, false).unwrap();
    h.sessions.excuse(60_000, 21_000);
    assert!(fence_one_expired(&h.state, &mut h.sessions, 30_000, &CFG).is_empty());
    assert!(!fence_one_expired(&h.state, &mut h.sessions, 30_001, &CFG).is_empty());
}

/// Issue 14, item 5: a node whose log for a partition went offline reports
/// it; the controller moves that partition's leadership and the node's ISR
/// place away, and nothing else of the node's.
#[test]
fn a_reported_offline_replica_loses_leadership_and_isr_place() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 3, 3).unwrap();
    let led_by_3 = (0..3).find(|i| h.part(1, *i).leader == 3).unwrap();
    let other = (0..3).find(|i| *i != led_by_3).unwrap();
    let before = h.part(1, led_by_3);
    let untouched = h.part(1, other);
    let report = |h: &mut Harness, offline: Vec<(TopicId, u32)>| {
        h.heartbeat_reporting(3, 10, false, offline).unwrap().1
    };
    assert_eq!(report(&mut h, vec![(tid(1), led_by_3)]), 1);
    let after = h.part(1, led_by_3);
    assert_ne!(after.leader, 3);
    assert!(!after.isr.contains(&3));
    assert_eq!(after.leader_epoch, before.leader_epoch + 1);
    assert_eq!(
        h.part(1, other),
        untouched,
        "only the reported partition moves"
    );
    assert!(!h.state.node(3).unwrap().fenced);
    // Reported again: nothing left to move.
    assert_eq!(report(&mut h, vec![(tid(1), led_by_3)]), 0);
    // An unknown partition in the report changes nothing.
    assert_eq!(report(&mut h, vec![(tid(9), 0)]), 0);
}

/// The only ISR member's offline replica stays where it is: nobody else
/// holds the data, and electing from the ISR would choose it again.
#[test]
fn a_sole_isr_member_reporting_offline_keeps_the_partition() {
    let mut h = Harness::cluster(2, None);
    h.create("t", 1, 2, 1).unwrap();
    let on_2 = (0..2).find(|i| h.part(1, *i).replicas == vec![2]).unwrap();
    let before = h.part(1, on_2);
    let (_, records) = h
        .heartbeat_reporting(2, 10, false, vec![(tid(1), on_2)])
        .unwrap();
    assert_eq!(records, 0);
    assert_eq!(h.part(1, on_2), before);
}

#[test]
fn last_isr_member_fenced_makes_partition_offline_and_unfence_restores_it() {
    let mut h = Harness::cluster(2, None);
    h.create("t", 1, 2, 1).unwrap();
    let on_2 = (0..2).find(|i| h.part(1, *i).replicas == vec![2]).unwrap();
    h.commit(&fence_node(&h.state, 2, &CFG));
    let p = h.part(1, on_2);
    assert_eq!(p.leader, NO_LEADER);
    assert_eq!(p.isr, vec![2], "the last ISR member stays in the ISR");
    assert_eq!(p.leader_epoch, 1);
    // Node 2 heartbeats again, caught up: unfenced and leads its partition again.
    let reply = h.heartbeat(2, 100, false).unwrap();
    assert!(!reply.is_fenced);
    let p = h.part(1, on_2);
    assert_eq!(p.leader, 2);
    assert_eq!(p.leader_epoch, 2);
}

#[test]
fn unclean_election_only_when_enabled() {
    let mut h = Harness::cluster(2, None);
    h.create("t", 1, 1, 2).unwrap();
    let p = h.part(1, 0);
    // Shrink the ISR to the leader, then fence the leader.
    let leader = p.leader;
    let other = p.replicas.iter().copied().find(|r| *r != leader).unwrap();
    let records = alter_partition(
        &h.state,
        &AlterPartition {
            node_id: leader,
            broker_epoch: h.state.node(leader).unwrap().broker_epoch,
            topic_id: tid(1),
            index: 0,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: vec![leader],
        },
    )
    .unwrap();
    h.commit(&records);
    let fenced = fence_node(&h.state, leader, &CFG);
    let mut clean = h.state.clone();
    clean.apply_batch(99, &fenced);
    assert_eq!(clean.partition(tid(1), 0).unwrap().leader, NO_LEADER);
    // With the topic override, the out-of-sync replica takes over alone.
    h.commit(&[MetadataRecord::Config(crate::records::Config {
        resource: ConfigResource::Cluster,
        name: UNCLEAN_LEADER_ELECTION.into(),
        value: Some("true".into()),
    })]);
    h.commit(&fence_node(&h.state, leader, &CFG));
    let p = h.part(1, 0);
    assert_eq!((p.leader, p.isr.clone()), (other, vec![other]));
}

#[test]
fn alter_topic_configs_sets_and_deletes_topic_overrides() {
    let mut h = Harness::cluster(2, None);
    h.create("t", 1, 1, 2).unwrap();
    assert_eq!(
        alter_topic_configs(&h.state, "nope", &[("a".into(), Some("1".into()))]),
        Err(ControllerError::UnknownTopicOrPartition)
    );
    assert!(matches!(
        alter_topic_configs(&h.state, "t", &[(String::new(), None)]),
        Err(ControllerError::InvalidRequest(_))
    ));
    assert_eq!(alter_topic_configs(&h.state, "t", &[]), Ok(vec![]));
    let records = alter_topic_configs(
        &h.state,
        "t",
        &[
            ("retention.ms".into(), Some("10".into())),
            (UNCLEAN_LEADER_ELECTION.into(), Some("true".into())),
        ],
    )
    .unwrap();
    assert_eq!(records.len(), 2);
    h.commit(&records);
    let topic = h.state.topic(tid(1)).unwrap();
    assert_eq!(topic.config("retention.ms"), Some("10"));
    // The override is what the election rules read.
    assert!(unclean_allowed(&h.state, tid(1), &CFG));
    h.commit(&alter_topic_configs(&h.state, "t", &[("retention.ms".into(), None)]).unwrap());
    let topic = h.state.topic(tid(1)).unwrap();
    assert_eq!(
        topic.configs,
        vec![(UNCLEAN_LEADER_ELECTION.to_string(), "true".to_string())]
    );
}

#[test]
fn controlled_shutdown_moves_leaderships_first() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 6, 2).unwrap();
    assert!(h.state.leader_count(1) > 0);
    let reply = h.heartbeat(1, 10, true).unwrap();
    assert!(reply.in_controlled_shutdown);
    assert!(reply.should_shut_down);
    assert_eq!(h.state.leader_count(1), 0);
    // Every leadership moved: fenced at once (Metadata no longer names it).
    assert!(reply.is_fenced && h.state.node(1).unwrap().fenced);
    for (_, _, p) in h.state.partitions() {
        assert!(!p.isr.contains(&1) || p.isr == vec![1]);
    }
    // Not eligible for new topics while shutting down.
    h.create("u", 2, 4, 2).unwrap();
    assert!(h
        .state
        .topic(tid(2))
        .unwrap()
        .partitions
        .values()
        .all(|p| !p.replicas.contains(&1)));
}

#[test]
fn a_controlled_shutdown_fences_the_node_and_its_return_brings_its_partitions_back() {
    let mut h = Harness::cluster(2, None);
    // Partition 0 of "solo" lives on one node alone: nobody can take it over.
    h.create("solo", 1, 1, 1).unwrap();
    let node = h.part(1, 0).leader;
    h.create("t", 2, 4, 2).unwrap();
    let reply = h.heartbeat(node, 10, true).unwrap();
    assert!(reply.is_fenced && reply.should_shut_down);
    // Offline while its only replica is away (Kafka's way), its ISR kept.
    assert_eq!(h.part(1, 0).leader, NO_LEADER);
    assert_eq!(h.part(1, 0).isr, vec![node]);
    assert_eq!(h.state.leader_count(node), 0);
    // A late ordinary heartbeat of the stopping process does not unfence it.
    assert!(h.heartbeat(node, 20, false).unwrap().is_fenced);
    // The node comes back (a new incarnation): leader of its partition again.
    h.register(node, None, 77);
    assert!(!h.heartbeat(node, 40, false).unwrap().is_fenced);
    assert_eq!(h.part(1, 0).leader, node);
}

#[test]
fn restart_with_new_incarnation_gets_new_epoch_and_loses_leaderships() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 3, 3).unwrap();
    let old = h.state.node(2).unwrap().broker_epoch;
    let new = h.register(2, None, 200);
    assert!(new > old);
    assert!(h.state.node(2).unwrap().fenced);
    assert_eq!(h.state.leader_count(2), 0);
    assert!(!h.heartbeat(2, 5, false).unwrap().is_fenced);
}

#[test]
fn create_topic_validates_and_spreads() {
    let mut h = Harness::cluster(3, None);
    assert_eq!(h.create("", 1, 1, 1).unwrap_err().kafka_code(), 17);
    assert_eq!(h.create("a/b", 1, 1, 1).unwrap_err().kafka_code(), 17);
    assert_eq!(h.create("t", 1, 0, 1).unwrap_err().kafka_code(), 37);
    assert_eq!(h.create("t", 1, 1, 4).unwrap_err().kafka_code(), 38);
    h.create("t", 1, 6, 3).unwrap();
    assert_eq!(h.create("t", 2, 1, 1).unwrap_err().kafka_code(), 36);
    let leaders: Vec<NodeId> = (0..6).map(|i| h.part(1, i).leader).collect();
    assert_eq!(leaders, vec![1, 2, 3, 1, 2, 3]);
    for i in 0..6 {
        let p = h.part(1, i);
        assert_eq!(p.isr, p.replicas);
        let mut r = p.replicas.clone();
        r.sort_unstable();
        assert_eq!(r, vec![1, 2, 3]);
    }
    assert_eq!(delete_topic(&h.state, "nope").unwrap_err().kafka_code(), 3);
    h.commit(&delete_topic(&h.state, "t").unwrap());
    assert!(h.state.topic_by_name("t").is_none());
}

#[test]
fn create_partitions_continues_the_spread_and_validates() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 2, 3).unwrap();
    let grow = |h: &Harness, count, sets: Option<&[Vec<NodeId>]>| {
        create_partitions(&h.state, "t", count, sets)
    };
    assert_eq!(
        create_partitions(&h.state, "nope", 3, None)
            .unwrap_err()
            .kafka_code(),
        3
    );
    for not_higher in [0, 1, 2] {
        let e = grow(&h, not_higher, None).unwrap_err();
        assert_eq!(e.kafka_code(), 37, "{e}");
        assert!(e.to_string().contains("has 2 partitions"), "{e}");
    }
    assert_eq!(
        grow(&h, 2 + TOPIC_PARTITIONS_MAX + 1, None)
            .unwrap_err()
            .kafka_code(),
        37
    );
    h.commit(&grow(&h, 6, None).unwrap());
    assert_eq!(h.state.topic_by_name("t").unwrap().partition_count, 6);
    // As if created with 6: leaders keep rotating, every partition on all 3.
    let leaders: Vec<NodeId> = (0..6).map(|i| h.part(1, i).leader).collect();
    assert_eq!(leaders, vec![1, 2, 3, 1, 2, 3]);
    for i in 2..6 {
        let p = h.part(1, i);
        assert_eq!(
            (p.isr.clone(), p.leader_epoch, p.partition_epoch),
            (p.replicas.clone(), 0, 0)
        );
        assert_eq!(p.replicas.iter().collect::<BTreeSet<_>>().len(), 3);
    }

    // Manual assignments: one list per new partition, RF of the topic, known
    // nodes, no node twice, someone to lead.
    let bad: [&[Vec<NodeId>]; 5] = [
        &[vec![1, 2, 3]],
        &[vec![1, 2], vec![1, 2, 3]],
        &[vec![1, 1, 2], vec![1, 2, 3]],
        &[vec![1, 2, 9], vec![1, 2, 3]],
        &[vec![1, 2, 3], vec![3, 2, 1], vec![2, 3, 1]],
    ];
    for sets in bad {
        assert_eq!(
            grow(&h, 8, Some(sets)).unwrap_err().kafka_code(),
            39,
            "{sets:?}"
        );
    }
    // A fenced replica stays out of the ISR and does not lead.
    h.commit(&fence_node(&h.state, 3, &CFG));
    h.commit(&grow(&h, 8, Some(&[vec![3, 1, 2], vec![2, 3, 1]])).unwrap());
    let p = h.part(1, 6);
    assert_eq!(
        (p.replicas, p.isr, p.leader),
        (vec![3, 1, 2], vec![1, 2], 1)
    );
    // Without assignments RF 3 needs three eligible nodes.
    assert_eq!(grow(&h, 9, None).unwrap_err().kafka_code(), 38);
}

#[test]
fn a_partition_record_past_the_next_index_is_refused() {
    let mut h = Harness::cluster(1, None);
    h.create("t", 1, 1, 1).unwrap();
    let record = |index| {
        MetadataRecord::Partition(Partition {
            topic_id: tid(1),
            index,
            leader: 1,
            isr: vec![1],
            replicas: vec![1],
            leader_epoch: 0,
            partition_epoch: 0,
        })
    };
    let refused = h.state.apply_batch(9, &[record(2)]);
    assert_eq!(refused.len(), 1);
    assert_eq!(h.state.topic_by_name("t").unwrap().partition_count, 1);
    assert!(h.state.apply_batch(10, &[record(1), record(2)]).is_empty());
    assert_eq!(h.state.topic_by_name("t").unwrap().partition_count, 3);
}

#[test]
fn assignment_matches_kafka_rack_unaware() {
    // Kafka's AdminUtils test: 5 brokers, 10 partitions, RF 3, start index 0.
    let nodes: Vec<(NodeId, Option<&str>)> = (0..5).map(|n| (n, None)).collect();
    let got = assign_replicas(&nodes, 10, 3, 0);
    let expected = vec![
        vec![0, 1, 2],
        vec![1, 2, 3],
        vec![2, 3, 4],
        vec![3, 4, 0],
        vec![4, 0, 1],
        vec![0, 2, 3],
        vec![1, 3, 4],
        vec![2, 4, 0],
        vec![3, 0, 1],
        vec![4, 1, 2],
    ];
    assert_eq!(got, expected);
}

#[test]
fn assignment_caps_replication_and_handles_no_nodes() {
    assert!(assign_replicas(&[], 3, 2, 0).is_empty());
    let racked = [(1, Some("a")), (2, Some("b"))];
    for replicas in assign_replicas(&racked, 3, 5, 1) {
        assert_eq!(replicas.len(), 2);
    }
    assert_eq!(
        assign_replicas(&[(7, None)], 2, 1, 9),
        vec![vec![7], vec![7]]
    );
}

#[test]
fn assignment_is_rack_aware() {
    // Six nodes over three racks: every partition's replicas sit in three racks,
    // and leaders spread evenly.
    let racks = ["a", "b", "c", "a", "b", "c"];
    let nodes: Vec<(NodeId, Option<&str>)> =
        (0..6).map(|n| (n as NodeId, Some(racks[n]))).collect();
    let got = assign_replicas(&nodes, 12, 3, 2);
    let mut leader_counts = BTreeMap::new();
    for replicas in &got {
        let used: BTreeSet<&str> = replicas.iter().map(|r| racks[*r as usize]).collect();
        assert_eq!(used.len(), 3, "{replicas:?}");
        *leader_counts.entry(replicas[0]).or_insert(0) += 1;
    }
    assert!(leader_counts.values().all(|c| *c == 2), "{leader_counts:?}");
    // Fewer racks than replicas: racks are reused only once all are used.
    let nodes: Vec<(NodeId, Option<&str>)> = vec![(1, Some("x")), (2, Some("x")), (3, Some("y"))];
    for replicas in assign_replicas(&nodes, 4, 3, 0) {
        let mut r = replicas.clone();
        r.sort_unstable();
        assert_eq!(r, vec![1, 2, 3]);
    }
}

#[test]
fn alter_partition_checks_epochs_and_eligibility() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 1, 3).unwrap();
    let p = h.part(1, 0);
    let leader = p.leader;
    let epoch = h.state.node(leader).unwrap().broker_epoch;
    let request = |le, pe, isr: Vec<NodeId>| AlterPartition {
        node_id: leader,
        broker_epoch: epoch,
        topic_id: tid(1),
        index: 0,
        leader_epoch: le,
        partition_epoch: pe,
        new_isr: isr,
    };
    let shrunk = vec![leader];
    fn code_in(state: &ClusterState, r: &AlterPartition) -> i16 {
        alter_partition(state, r).unwrap_err().kafka_code()
    }
    assert_eq!(
        code_in(
            &h.state,
            &request(p.leader_epoch - 1, p.partition_epoch, shrunk.clone())
        ),
        74
    );
    assert_eq!(
        code_in(
            &h.state,
            &request(p.leader_epoch, p.partition_epoch + 1, shrunk.clone())
        ),
        95
    );
    assert_eq!(
        code_in(
            &h.state,
            &request(p.leader_epoch, p.partition_epoch, vec![leader, 9])
        ),
        107
    );
    assert_eq!(
        code_in(
            &h.state,
            &request(p.leader_epoch, p.partition_epoch, vec![])
        ),
        42
    );
    let mut not_leader = request(p.leader_epoch, p.partition_epoch, shrunk.clone());
    not_leader.node_id = p.replicas.iter().copied().find(|r| *r != leader).unwrap();
    not_leader.broker_epoch = h.state.node(not_leader.node_id).unwrap().broker_epoch;
    assert_eq!(code_in(&h.state, &not_leader), 42);
    let mut stale = request(p.leader_epoch, p.partition_epoch, shrunk.clone());
    stale.broker_epoch -= 1;
    assert_eq!(code_in(&h.state, &stale), 77);
    // Valid shrink.
    h.commit(
        &alter_partition(
            &h.state,
            &request(p.leader_epoch, p.partition_epoch, shrunk.clone()),
        )
        .unwrap(),
    );
    let q = h.part(1, 0);
    assert_eq!(
        (q.isr.clone(), q.partition_epoch, q.leader_epoch),
        (shrunk, 1, 0)
    );
    // The same request again carries a stale partition epoch.
    assert_eq!(code_in(&h.state, &request(0, 0, vec![leader])), 95);
    // Adding a fenced replica is refused.
    let other = p.replicas.iter().copied().find(|r| *r != leader).unwrap();
    h.commit(&fence_node(&h.state, other, &CFG));
    assert_eq!(code_in(&h.state, &request(0, 1, vec![leader, other])), 107);
}

#[test]
fn preferred_leader_election_returns_leadership() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 3, 2).unwrap();
    h.commit(&fence_node(&h.state, 1, &CFG));
    assert_eq!(h.state.leader_count(1), 0);
    // Back, unfenced, caught up. Node 1 was removed from ISRs, so re-add it.
    h.heartbeat(1, 1, false).unwrap();
    rejoin(&mut h, 1, 3);
    let records = elect_preferred_leaders(&h.state);
    assert!(!records.is_empty());
    h.commit(&records);
    for i in 0..3 {
        let p = h.part(1, i);
        assert_eq!(p.leader, p.replicas[0]);
    }
    assert!(elect_preferred_leaders(&h.state).is_empty());
}

/// Readds `node` to the ISR of every partition of topic 1 it replicates, as
/// its leader would once it caught up.
fn rejoin(h: &mut Harness, node: NodeId, partitions: u32) {
    for i in 0..partitions {
        let p = h.part(1, i);
        if p.replicas.contains(&node) && !p.isr.contains(&node) && p.leader != NO_LEADER {
            let mut isr = p.isr.clone();
            isr.push(node);
            let leader = p.leader;
            let records = alter_partition(
                &h.state,
                &AlterPartition {
                    node_id: leader,
                    broker_epoch: h.state.node(leader).unwrap().broker_epoch,
                    topic_id: tid(1),
                    index: i,
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    new_isr: isr,
                },
            )
            .unwrap();
            h.commit(&records);
        }
    }
}

#[test]
fn elect_leaders_preferred_and_unclean() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 6, 3).unwrap();
    h.commit(&fence_node(&h.state, 1, &CFG));
    assert!(h.heartbeat(1, 1, false).is_ok());
    // Node 1 is back but out of every ISR: no preferred election can pick it.
    assert!(elect_leaders(&h.state, ElectionType::Preferred, None).is_empty());
    rejoin(&mut h, 1, 6);
    // Only the partitions asked for move; unknown names are ignored.
    let asked = [("t".to_string(), 0), ("nope".to_string(), 0)];
    let records = elect_leaders(&h.state, ElectionType::Preferred, Some(&asked));
    assert_eq!(records.len(), 1);
    h.commit(&records);
    assert_eq!(h.part(1, 0).leader, 1);
    assert_ne!(h.part(1, 3).leader, 1);
    h.commit(&elect_leaders(&h.state, ElectionType::Preferred, None));
    assert_eq!(h.part(1, 3).leader, 1);
    // Unclean: only partitions without a leader, from any eligible replica.
    assert!(elect_leaders(&h.state, ElectionType::Unclean, None).is_empty());
    let mut h = Harness::cluster(2, None);
    h.create("t", 1, 1, 2).unwrap();
    let leader = h.part(1, 0).leader;
    let other = 3 - leader;
    // The follower leaves the ISR, then the leader is fenced: no clean leader.
    let p = h.part(1, 0);
    h.commit(
        &alter_partition(
            &h.state,
            &AlterPartition {
                node_id: leader,
                broker_epoch: h.state.node(leader).unwrap().broker_epoch,
                topic_id: tid(1),
                index: 0,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                new_isr: vec![leader],
            },
        )
        .unwrap(),
    );
    h.commit(&fence_node(&h.state, leader, &CFG));
    assert_eq!(h.part(1, 0).leader, NO_LEADER);
    assert!(elect_leaders(&h.state, ElectionType::Preferred, None).is_empty());
    let records = elect_leaders(&h.state, ElectionType::Unclean, None);
    assert_eq!(unclean_elections(&h.state, &records), 1);
    h.commit(&records);
    assert_eq!(
        unclean_elections(&h.state, &records),
        0,
        "judged against the state after"
    );
    let p = h.part(1, 0);
    assert_eq!((p.leader, p.isr), (other, vec![other]));
}

#[test]
fn rebalance_moves_leaders_back_past_the_imbalance_percentage() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 9, 3).unwrap();
    h.commit(&fence_node(&h.state, 1, &CFG));
    assert!(h.heartbeat(1, 1, false).is_ok());
    rejoin(&mut h, 1, 9);
    // Node 1 is preferred for 3 of 9 and leads none: 100% > 10%.
    assert_eq!(h.state.leader_count(1), 0);
    assert!(rebalance_leaders(&h.state, 100).is_empty());
    h.commit(&rebalance_leaders(&h.state, 10));
    assert_eq!(h.state.leader_count(1), 3);
    assert!(rebalance_leaders(&h.state, 10).is_empty());
    // One of node 1's three led elsewhere is 33%: under 50, over 10.
    let i = (0..9).find(|i| h.part(1, *i).leader == 1).unwrap();
    let p = h.part(1, i);
    h.commit(&[MetadataRecord::PartitionChange(PartitionChange {
        topic_id: tid(1),
        index: i,
        isr: None,
        leader: Some(p.replicas[1]),
        leader_epoch: p.leader_epoch + 1,
        partition_epoch: p.partition_epoch + 1,
        replicas: None,
    })]);
    assert!(rebalance_leaders(&h.state, 50).is_empty());
    assert_eq!(rebalance_leaders(&h.state, 10).len(), 1);
}

#[derive(Debug, Clone)]
enum Op {
    Register {
        node: NodeId,
        restart: bool,
    },
    Heartbeats,
    Advance {
        ms: u64,
    },
    Kill {
        node: NodeId,
    },
    Revive {
        node: NodeId,
    },
    Create {
        partitions: i32,
        rf: i16,
        start: usize,
    },
    Delete {
        pick: usize,
    },
    Shrink {
        pick: usize,
    },
    Expand {
        pick: usize,
    },
    Shutdown {
        node: NodeId,
    },
    Preferred,
    Reassign {
        pick: usize,
        target: Vec<NodeId>,
    },
    Cancel {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1..=5i32, any::<bool>()).prop_map(|(node, restart)| Op::Register { node, restart }),
        3 => Just(Op::Heartbeats),
        2 => (0..6000u64).prop_map(|ms| Op::Advance { ms }),
        1 => (1..=5i32).prop_map(|node| Op::Kill { node }),
        1 => (1..=5i32).prop_map(|node| Op::Revive { node }),
        2 => (1..5i32, 1..4i16, 0..10usize)
            .prop_map(|(partitions, rf, start)| Op::Create { partitions, rf, start }),
        1 => (0..10usize).prop_map(|pick| Op::Delete { pick }),
        2 => (0..50usize).prop_map(|pick| Op::Shrink { pick }),
        2 => (0..50usize).prop_map(|pick| Op::Expand { pick }),
        1 => (1..=5i32).prop_map(|node| Op::Shutdown { node }),
        1 => Just(Op::Preferred),
        2 => (0..50usize, proptest::collection::vec(1..=5i32, 1..4))
            .prop_map(|(pick, target)| Op::Reassign { pick, target }),
        1 => (0..50usize).prop_map(|pick| Op::Cancel { pick }),
    ]
}

/// Invariants every reachable state keeps, plus growth of epochs since `before`.
fn check_invariants(before: &ClusterState, after: &ClusterState) {
    for (t, i, p) in after.partitions() {
        p.check().unwrap();
        if p.leader != NO_LEADER {
            let n = after.node(p.leader).unwrap();
            assert!(!n.fenced, "fenced node {} leads {t}-{i}", p.leader);
        }
        if let Some(old) = before.partition(t, i) {
            assert!(p.leader_epoch >= old.leader_epoch);
            assert!(p.partition_epoch >= old.partition_epoch);
            if p.leader != old.leader || old.replicas.iter().any(|r| !p.replicas.contains(r)) {
                assert!(p.leader_epoch > old.leader_epoch);
            }

            if p != old {
                assert!(p.partition_epoch > old.partition_epoch);
            }
        }
    }
    for n in before.nodes() {
        assert!(after.node(n.node_id).unwrap().broker_epoch >= n.broker_epoch);
    }
}

/// Reassigns `topic`'s partition `index` to `target` (`None`: cancel) and
/// commits it; the entry's own result.
fn reassign(
    h: &mut Harness,
    index: u32,
    target: Option<Vec<NodeId>>,
) -> Result<(), ControllerError> {
    let (records, mut results) = alter_reassignments(
        &h.state,
        &[Reassignment {
            topic: "t".into(),
            index,
            target,
        }],
    );
    h.commit(&records);
    results.remove(0)
}

/// The partition's leader asks for `isr` at the current epochs.
fn alter_isr(h: &mut Harness, index: u32, isr: Vec<NodeId>) {
    let p = h.part(1, index);
    let request = AlterPartition {
        node_id: p.leader,
        broker_epoch: h.state.node(p.leader).unwrap().broker_epoch,
        topic_id: tid(1),
        index,
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        new_isr: isr,
    };
    let records = alter_partition(&h.state, &request).unwrap();
    h.commit(&records);
}

#[test]
fn a_reassignment_adds_first_and_completes_when_the_target_is_in_sync() {
    let mut h = Harness::cluster(4, None);
    h.create("t", 1, 1, 3).unwrap();
    let before = h.part(1, 0);
    assert_eq!(
        (before.replicas.as_slice(), before.leader),
        (&[1, 2, 3][..], 1)
    );
    reassign(&mut h, 0, Some(vec![2, 3, 4])).unwrap();
    let p = h.part(1, 0);
    assert_eq!(
        p.replicas,
        vec![2, 3, 4, 1],
        "target first, then the replicas it drops"
    );
    assert_eq!(
        (p.adding.as_slice(), p.removing.as_slice()),
        (&[4][..], &[1][..])
    );
    assert_eq!(p.isr, vec![1, 2, 3]);
    assert_eq!(p.leader, 1, "the leader stays until the move completes");
    assert_eq!(
        p.leader_epoch, before.leader_epoch,
        "adding a replica fences nobody"
    );
    assert_eq!(p.original_replicas(), vec![2, 3, 1]);
    assert_eq!(p.target_replicas(), vec![2, 3, 4]);
    // Node 4 caught up: the leader adds it to the ISR, which completes the move.
    alter_isr(&mut h, 0, vec![1, 2, 3, 4]);
    let done = h.part(1, 0);
    assert_eq!(done.replicas, vec![2, 3, 4]);
    assert_eq!(done.isr, vec![2, 3, 4]);
    assert!(!done.is_reassigning());
    assert_eq!(
        done.leader, 2,
        "the removed leader hands over to the first target replica"
    );
    assert_eq!(done.leader_epoch, p.leader_epoch + 1);
    assert_eq!(done.partition_epoch, p.partition_epoch + 1);
}

#[test]
fn reordering_or_shrinking_in_sync_replicas_completes_at_once() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 2, 3).unwrap();
    let p = h.part(1, 0);
    reassign(&mut h, 0, Some(vec![3, 2, 1])).unwrap();
    let reordered = h.part(1, 0);
    assert_eq!(reordered.replicas, vec![3, 2, 1]);
    assert!(!reordered.is_reassigning());
    assert_eq!(reordered.leader, p.leader);
    assert_eq!(reordered.leader_epoch, p.leader_epoch, "no replica left");
    let q = h.part(1, 1);
    let dropped = *q.replicas.last().unwrap();
    let target: Vec<NodeId> = q
        .replicas
        .iter()
        .copied()
        .filter(|r| *r != dropped)
        .collect();
    reassign(&mut h, 1, Some(target.clone())).unwrap();
    let shrunk = h.part(1, 1);
    assert_eq!(shrunk.replicas, target);
    assert!(!shrunk.isr.contains(&dropped));
    assert_eq!(
        shrunk.leader_epoch,
        q.leader_epoch + 1,
        "a replica left: fenced"
    );
}

#[test]
fn a_reassignment_is_cancelled_or_replaced_from_the_original_replicas() {
    let mut h = Harness::cluster(5, None);
    h.create("t", 1, 1, 3).unwrap();
    assert_eq!(
        reassign(&mut h, 0, None),
        Err(ControllerError::NoReassignmentInProgress)
    );
    reassign(&mut h, 0, Some(vec![2, 3, 4])).unwrap();
    let moving = h.part(1, 0);
    // A new target replaces it: 4, still being added, leaves; 5 is added.
    reassign(&mut h, 0, Some(vec![2, 3, 5])).unwrap();
    let p = h.part(1, 0);
    assert_eq!(p.replicas, vec![2, 3, 5, 1]);
    assert_eq!(
        (p.adding.as_slice(), p.removing.as_slice()),
        (&[5][..], &[1][..])
    );
    assert_eq!(p.leader_epoch, moving.leader_epoch + 1, "node 4 left");
    // Cancelling goes back to the original replicas.
    reassign(&mut h, 0, None).unwrap();
    let back = h.part(1, 0);
    assert_eq!(back.replicas, vec![2, 3, 1]);
    assert!(!back.is_reassigning());
    assert_eq!(back.isr, vec![1, 2, 3]);
    assert_eq!(back.leader, 1);
}

#[test]
fn bad_reassignments_are_refused_with_kafkas_codes() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 1, 3).unwrap();
    let before = h.state.clone();
    let code = |r: Result<(), ControllerError>| r.unwrap_err().kafka_code();
    assert_eq!(code(reassign(&mut h, 0, Some(vec![]))), 39);
    assert_eq!(code(reassign(&mut h, 0, Some(vec![1, 1]))), 39);
    assert_eq!(
        code(reassign(&mut h, 0, Some(vec![1, 9]))),
        39,
        "node 9 is not registered"
    );
    assert_eq!(code(reassign(&mut h, 7, Some(vec![1]))), 3);
    assert_eq!(code(reassign(&mut h, 0, None)), 85);
    let (records, results) = alter_reassignments(
        &h.state,
        &[Reassignment {
            topic: "nope".into(),
            index: 0,
            target: Some(vec![1]),
        }],
    );
    assert!(records.is_empty());
    assert_eq!(results[0].clone().unwrap_err().kafka_code(), 3);
    assert_eq!(h.state, before);
}

#[test]
fn a_change_that_drops_a_replica_without_a_new_leader_epoch_is_refused() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 1, 3).unwrap();
    let p = h.part(1, 0);
    let change = |leader_epoch| {
        MetadataRecord::PartitionChange(PartitionChange {
            topic_id: tid(1),
            index: 0,
            isr: Some(vec![1, 2]),
            leader: None,
            leader_epoch,
            partition_epoch: p.partition_epoch + 1,
            replicas: Some(ReplicaSet {
                replicas: vec![1, 2],
                adding: vec![],
                removing: vec![],
            }),
        })
    };
    assert!(h.state.apply(99, &change(p.leader_epoch)).is_err());
    assert!(h.state.apply(99, &change(p.leader_epoch + 1)).is_ok());
}

#[test]
fn a_node_is_unregistered_only_when_stopped_and_holding_no_replica() {
    let mut h = Harness::cluster(3, None);
    h.create("t", 1, 1, 2).unwrap();
    let replicas = h.part(1, 0).replicas;
    let free = (1..=3).find(|n| !replicas.contains(n)).unwrap();
    let running = unregister_node(&h.state, free).unwrap_err();
    assert!(running.to_string().contains("stop it"), "{running}");
    let records = fence_node(&h.state, free, &CFG);
    h.commit(&records);
    let records = unregister_node(&h.state, free).unwrap();
    h.commit(&records);
    assert!(h.state.node(free).is_none());
    assert_eq!(
        unregister_node(&h.state, free).unwrap_err().kafka_code(),
        102
    );
    let holder = replicas[1];
    let records = fence_node(&h.state, holder, &CFG);
    h.commit(&records);
    let holding = unregister_node(&h.state, holder).unwrap_err();
    assert!(holding.to_string().contains("t-0"), "{holding}");
}

#[test]
fn an_unclean_election_prefers_a_replica_that_was_there_before_the_move() {
    let mut h = Harness::cluster(4, None);
    h.create("t", 1, 1, 2).unwrap();
    let before = h.part(1, 0);
    let spare = (1..=4).find(|n| !before.replicas.contains(n)).unwrap();
    // Node `spare` is being added in front of the old replicas.
    let mut target = vec![spare];
    target.extend(before.replicas.iter().copied());
    reassign(&mut h, 0, Some(target)).unwrap();
    assert_eq!(h.part(1, 0).adding, vec![spare]);
    // Every in-sync replica is fenced: the partition goes offline.
    for r in before.replicas.clone() {
        let records = fence_node(&h.state, r, &CFG);
        h.commit(&records);
    }
    assert_eq!(h.part(1, 0).leader, NO_LEADER);
    // The old replica outside the ISR (fenced first) comes back unfenced,
    // beside the new one: only an unclean election can pick a leader.
    let old = before.replicas[0];
    assert!(!h.part(1, 0).isr.contains(&old));
    h.heartbeat(old, 0, false).unwrap();
    let records = elect_leaders(&h.state, ElectionType::Unclean, None);
    h.commit(&records);
    let after = h.part(1, 0);
    assert_eq!(
        after.leader, old,
        "the replica being added holds nothing yet: {after:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        let mut now = 0u64;
        let mut alive = BTreeSet::new();
        let mut incarnation = 0u8;
        let mut next_topic = 0u8;
        for op in ops {
            let before = h.state.clone();
            match op {
                Op::Register { node, restart } => {
                    if restart || h.state.node(node).is_none() {
                        incarnation = incarnation.wrapping_add(1);
                    }
                    let inc = h.state.node(node).filter(|_| !restart).map_or(incarnation, |n| n.incarnation_id[0]);
                    h.register(node, None, inc);
                    alive.insert(node);
                }
                Op::Heartbeats => {
                    for node in alive.clone() {
                        let _ = h.heartbeat(node, now, false);
                    }
                }
                Op::Advance { ms } => {
                    now += ms;
                    loop {
                        let records = fence_one_expired(&h.state, &mut h.sessions, now, &CFG);
                        if records.is_empty() {
                            break;
                        }
                        h.commit(&records);
                    }
                }
                Op::Kill { node } => {
                    alive.remove(&node);
                }
                Op::Revive { node } => {
                    if h.state.node(node).is_some() {
                        alive.insert(node);
                    }
                }
                Op::Create { partitions, rf, start } => {
                    next_topic = next_topic.wrapping_add(1);
                    let request = CreateTopic {
                        name: format!("t{next_topic}"),
                        topic_id: tid(next_topic),
                        partitions,
                        replication_factor: rf,
                        configs: vec![],
                        start_index: start,
                    };
                    if let Ok(records) = create_topic(&h.state, &request) {
                        h.commit(&records);
                    }
                }
                Op::Delete { pick } => {
                    let names: Vec<String> = h.state.topics().map(|t| t.name.clone()).collect();
                    if !names.is_empty() {
                        let records = delete_topic(&h.state, &names[pick % names.len()]).unwrap();
                        h.commit(&records);
                    }
                }
                Op::Shrink { pick } | Op::Expand { pick } => {
                    let parts: Vec<(TopicId, u32, PartitionState)> =
                        h.state.partitions().map(|(t, i, p)| (t, i, p.clone())).collect();
                    if parts.is_empty() {
                        continue;
                    }
                    let (t, i, p) = &parts[pick % parts.len()];
                    if p.leader == NO_LEADER {
                        continue;
                    }
                    let new_isr = if matches!(op, Op::Shrink { .. }) {
                        vec![p.leader]
                    } else {
                        p.replicas.clone()
                    };
                    let request = AlterPartition {
                        node_id: p.leader,
                        broker_epoch: h.state.node(p.leader).unwrap().broker_epoch,
                        topic_id: *t,
                        index: *i,
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        new_isr,
                    };
                    // Expansion with a fenced replica is refused; that is fine.
                    if let Ok(records) = alter_partition(&h.state, &request) {
                        h.commit(&records);
                    }
                }
                Op::Shutdown { node } => {
                    if alive.contains(&node) {
                        if let Ok(reply) = h.heartbeat(node, now, true) {
                            if reply.should_shut_down {
                                prop_assert_eq!(h.state.leader_count(node), 0);
                                alive.remove(&node);
                            }
                        }
                    }
                }
                Op::Preferred => {
                    let records = elect_preferred_leaders(&h.state);
                    h.commit(&records);
                }
                Op::Reassign { pick, .. } | Op::Cancel { pick } if h.state.partitions().next().is_some() => {
                    let parts: Vec<(String, u32)> = h
                        .state
                        .partitions()
                        .map(|(t, i, _)| (h.state.topic(t).unwrap().name.clone(), i))
                        .collect();
                    let (topic, index) = parts[pick % parts.len()].clone();
                    let target = match &op {
                        Op::Reassign { target, .. } => {
                            let mut t = target.clone();
                            t.dedup();
                            Some(t)
                        }
                        _ => None,
                    };
                    // Refusals (duplicates, unknown nodes, nothing to cancel) are fine.
                    let (records, _) =
                        alter_reassignments(&h.state, &[Reassignment { topic, index, target }]);
                    h.commit(&records);
                }
                Op::Reassign { .. } | Op::Cancel { .. } => {}
            }
            check_invariants(&before, &h.state);
        }
    }
}
