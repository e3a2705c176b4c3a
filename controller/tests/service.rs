//! The networked controller over real TCP on 127.0.0.1 and real files.
//!
//! Listeners are bound (port 0) before any controller starts, so every voter's
//! address is known up front. Every test runs its client side on a glommio
//! executor under a deadline (`TEST_DEADLINE`), and every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use skiff_controller::client::{status_blocking, ClientError, ControllerClient};
use skiff_controller::decisions::{ControllerConfig, Heartbeat, Registration};
use skiff_controller::node::QuorumConfig;
use skiff_controller::records::{Endpoint, NO_LEADER};
use skiff_controller::rpc::{CreateTopicRequest, MetadataFetch};
use skiff_controller::service::{ControllerHandle, ServiceConfig};
use skiff_controller::state::ClusterState;

const TEST_DEADLINE: Duration = Duration::from_secs(90);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

/// Runs `f` on a fresh glommio executor on this thread, failing the test if it
/// takes longer than `TEST_DEADLINE`.
fn run<T>(f: impl Future<Output = T>) -> T {
    let ex = LocalExecutorBuilder::new(Placement::Unbound)
        .make()
        .expect("test executor");
    ex.run(async move {
        futures_lite::future::or(f, async {
            glommio::timer::sleep(TEST_DEADLINE).await;
            panic!("test deadline passed");
        })
        .await
    })
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

fn config(
    dir: &std::path::Path,
    id: u64,
    peers: &[(u64, SocketAddr)],
    listener: TcpListener,
) -> ServiceConfig {
    let voters = peers.iter().map(|(id, _)| *id).collect();
    ServiceConfig::new(
        dir.to_path_buf(),
        QuorumConfig::new(id, voters),
        peers.to_vec(),
        listener,
        "skiff-controller-tests".to_string(),
    )
}

/// One voter, started; the handle, its address and its directory.
fn single(
    tune: impl FnOnce(&mut ServiceConfig),
) -> (ControllerHandle, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let listener = bind();
    let addr = listener.local_addr().unwrap();
    let mut c = config(dir.path(), 1, &[(1, addr)], listener);
    tune(&mut c);
    (ControllerHandle::start(c).unwrap(), addr, dir)
}

fn registration(node_id: i32) -> Registration {
    Registration {
        node_id,
        incarnation_id: [node_id as u8; 16],
        endpoints: vec![Endpoint {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port: 9000 + node_id as u16,
        }],
        rack: None,
    }
}

fn heartbeat(node_id: i32, broker_epoch: i64, metadata_offset: u64) -> Heartbeat {
    Heartbeat {
        node_id,
        broker_epoch,
        metadata_offset,
        want_fence: false,
        want_shutdown: false,
        offline_partitions: Vec::new(),
    }
}

fn topic(name: &str, partitions: i32) -> CreateTopicRequest {
    CreateTopicRequest {
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs: vec![("retention.ms".into(), "1000".into())],
    }
}

/// Registers `node_id` and heartbeats until it is unfenced; its broker epoch.
async fn join(client: &ControllerClient, node_id: i32) -> i64 {
    let (epoch, offset) = client.register(registration(node_id)).await.unwrap();
    let reply = client
        .heartbeat(heartbeat(node_id, epoch, offset))
        .await
        .unwrap();
    assert!(!reply.is_fenced, "caught-up node still fenced");
    epoch
}

/// Follows the committed log from offset 1 into a fresh state, as a broker
/// would, until it has applied `to` (or `to` is 0 and nothing more comes).
async fn follow(client: &ControllerClient, state: &mut ClusterState, from: &mut u64, to: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client
            .fetch_metadata(*from, Duration::from_millis(200))
            .await
            .unwrap()
        {
            MetadataFetch::Batches(batches) => {
                if batches.is_empty() && (to == 0 || *from > to) {
                    return;
                }
                for b in batches {
                    assert!(b.offset >= *from, "batch {} before {from}", b.offset);
                    assert!(state.apply_batch(b.offset, &b.records).is_empty());
                    *from = b.offset + 1;
                }
            }
            MetadataFetch::Snapshot { offset, image } => {
                *state = ClusterState::from_snapshot(&image).unwrap();
                *from = offset + 1;
            }
        }
        if to > 0 && *from > to {
            return;
        }
        assert!(Instant::now() < deadline, "metadata did not reach {to}");
    }
}

#[test]
fn one_voter_registers_unfences_creates_and_serves_metadata() {
    let started = Instant::now();
    let (handle, addr, _dir) = single(|_| {});
    run(async {
        wait_until(
            "the single voter to be active",
            Duration::from_secs(1),
            || handle.status().active,
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(1));
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        let (epoch, reg_offset) = client.register(registration(1)).await.unwrap();
        assert!(epoch > 0 && reg_offset > 0);
        // The same incarnation again is a retry: same epoch and offset.
        assert_eq!(
            client.register(registration(1)).await.unwrap(),
            (epoch, reg_offset)
        );
        // Behind its registration: still fenced.
        let reply = client
            .heartbeat(heartbeat(1, epoch, reg_offset - 1))
            .await
            .unwrap();
        assert!(reply.is_fenced);
        let reply = client
            .heartbeat(heartbeat(1, epoch, reg_offset))
            .await
            .unwrap();
        assert!(!reply.is_fenced);

        let created = client.create_topic(topic("orders", 3)).await.unwrap();
        assert!(created > reg_offset);

        // A long poll from past the end is answered by the next commit.
        let waiter = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        let poll = glommio::spawn_local(async move {
            let t = Instant::now();
            let fetch = waiter
                .fetch_metadata(created + 1, Duration::from_secs(5))
                .await
                .unwrap();
            (fetch, t.elapsed())
        })
        .detach();
        glommio::timer::sleep(Duration::from_millis(100)).await;
        let altered = client
            .alter_topic_configs(
                "orders",
                vec![
                    ("cleanup.policy".into(), Some("compact".into())),
                    ("retention.ms".into(), None),
                ],
            )
            .await
            .unwrap();
        let (fetch, waited) = poll.await.unwrap();
        assert!(waited < Duration::from_secs(4), "long poll not woken");
        match fetch {
            MetadataFetch::Batches(b) => assert_eq!(b[0].offset, altered),
            other => panic!("expected batches, got {other:?}"),
        }

        // Nothing newer: an empty answer after the wait.
        let t = Instant::now();
        let empty = client
            .fetch_metadata(altered + 1, Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(empty, MetadataFetch::Batches(vec![]));
        assert!(t.elapsed() >= Duration::from_millis(250));

        let mut state = ClusterState::new();
        let mut from = 1;
        follow(&client, &mut state, &mut from, altered).await;
        let t = state.topic_by_name("orders").expect("topic applied");
        assert_eq!(t.partitions.len(), 3);
        assert!(t.partitions.values().all(|p| p.leader == 1 && p.isr == [1]));
        assert_eq!(t.configs, vec![("cleanup.policy".into(), "compact".into())]);
        assert!(!state.node(1).unwrap().fenced);

        let status = client.status().await.unwrap();
        assert!(status.active);
        assert_eq!(status.leader_id, Some(1));
        assert_eq!((status.topics, status.partitions), (1, 3));
        assert_eq!(status.offline_partitions, 0);
        assert_eq!(status.nodes.len(), 1);
        assert!(!status.nodes[0].fenced);
        assert_eq!(
            status.nodes[0].endpoints,
            vec!["PLAINTEXT://127.0.0.1:9001"]
        );
        assert!(status.applied_offset >= altered);
        let blocking = status_blocking(addr, None, Duration::from_secs(2)).unwrap();
        assert_eq!(blocking.topics, 1);
        wait_until("the handle's status", Duration::from_secs(2), || {
            handle.status().applied_offset >= altered
        })
        .await;

        let deleted = client.delete_topic("orders").await.unwrap();
        assert!(deleted > altered);
        follow(&client, &mut state, &mut from, deleted).await;
        assert!(state.topic_by_name("orders").is_none());
    });
    handle.stop().unwrap();
}

#[test]
fn refusals_carry_kafka_codes() {
    let (handle, addr, _dir) = single(|_| {});
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        // No unfenced node: replication factor 1 cannot be met (38).
        let code = |r: Result<u64, ClientError>| match r {
            Err(ClientError::Refused { code, .. }) => code,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(code(client.create_topic(topic("t", 1)).await), 38);
        let epoch = join(&client, 1).await;
        client.create_topic(topic("t", 1)).await.unwrap();
        assert_eq!(code(client.create_topic(topic("t", 2)).await), 36);
        assert_eq!(code(client.delete_topic("nope").await), 3);
        assert_eq!(code(client.create_topic(topic("bad/name", 1)).await), 17);
        // A new incarnation gets a new epoch; the old one is stale (77).
        let mut again = registration(1);
        again.incarnation_id = [99; 16];
        let (new_epoch, _) = client.register(again).await.unwrap();
        assert!(new_epoch > epoch);
        match client.heartbeat(heartbeat(1, epoch, u64::MAX)).await {
            Err(ClientError::Refused { code: 77, .. }) => {}
            other => panic!("expected STALE_BROKER_EPOCH, got {other:?}"),
        }
        match client.heartbeat(heartbeat(5, 1, 0)).await {
            Err(ClientError::Refused { code: 102, .. }) => {}
            other => panic!("expected BROKER_ID_NOT_REGISTERED, got {other:?}"),
        }
    });
    handle.stop().unwrap();
}

#[test]
fn silent_node_is_fenced_after_its_session_timeout() {
    let (handle, addr, _dir) = single(|c| {
        c.controller = ControllerConfig {
            heartbeat_interval_ms: 200,
            session_timeout_ms: 600,
            ..ControllerConfig::default()
        };
    });
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        join(&client, 1).await;
        let created = client.create_topic(topic("t", 2)).await.unwrap();
        let t = Instant::now();
        // No more heartbeats.
        wait_until("node 1 to be fenced", Duration::from_secs(5), || {
            let s = handle.status();
            s.nodes.first().is_some_and(|n| n.fenced) && s.offline_partitions == 2
        })
        .await;
        assert!(
            t.elapsed() >= Duration::from_millis(500),
            "fenced too early"
        );
        let mut state = ClusterState::new();
        let mut from = 1;
        follow(&client, &mut state, &mut from, 0).await;
        assert!(from > created);
        assert!(state.node(1).unwrap().fenced);
        let t = state.topic_by_name("t").unwrap();
        assert!(t.partitions.values().all(|p| p.leader == NO_LEADER));
    });
    handle.stop().unwrap();
}

/// Writes `bytes` and expects the controller to close the connection.
/// A heartbeat whose first attempt goes to a voter that accepts and never
/// answers is answered by the next one: the time it reports (where a
/// broker's lease starts) is that attempt's send, not the call's start.
#[test]
fn a_heartbeat_answered_on_a_retry_reports_the_retry_send_time() {
    let (handle, addr, _dir) = single(|_| {});
    let silent = bind();
    let silent_addr = silent.local_addr().unwrap();
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        let epoch = join(&client, 1).await;
        let attempt = Duration::from_millis(300);
        // The silent voter first in the list: the first attempt waits out
        // its attempt timeout there (the kernel accepts the connection).
        let retrying = ControllerClient::new(vec![(9, silent_addr), (1, addr)], REQUEST_TIMEOUT)
            .with_attempt_timeout(attempt);
        let started = Instant::now();
        let (_, _, sent) = retrying
            .heartbeat_timed(heartbeat(1, epoch, 0))
            .await
            .unwrap();
        assert!(
            sent >= started + attempt,
            "lease counted from {:?} after the call began, before the answered attempt",
            sent.duration_since(started)
        );
        // One answered at once reports its own send.
        let started = Instant::now();
        let (_, _, sent) = client
            .heartbeat_timed(heartbeat(1, epoch, 0))
            .await
            .unwrap();
        assert!(sent >= started && sent.duration_since(started) < attempt);
    });
    drop(silent);
    handle.stop().unwrap();
}

fn expect_closed(addr: SocketAddr, bytes: &[u8]) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection not closed after {bytes:?}: {other:?}"),
    }
}

#[test]
fn garbage_and_oversize_frames_close_the_connection_only() {
    let (handle, addr, _dir) = single(|_| {});
    // Text: its "length" is over the limit.
    expect_closed(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    // Oversize length, refused before allocating it.
    expect_closed(addr, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    let mut just_over = ((16u32 << 20) + 1).to_be_bytes().to_vec();
    just_over.extend_from_slice(&[0; 4]);
    expect_closed(addr, &just_over);
    // A small frame with a bad checksum.
    let mut bad_crc = 8u32.to_be_bytes().to_vec();
    bad_crc.extend_from_slice(&[1, 2, 3, 4, 1, 9, 9, 9, 9, 9, 9, 9]);
    expect_closed(addr, &bad_crc);
    // A valid checksum over a body that is not an archive.
    let body = [
        1u8, 0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
    ];
    let mut forged = (body.len() as u32).to_be_bytes().to_vec();
    forged.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    forged.extend_from_slice(&body);
    expect_closed(addr, &forged);
    // A Raft frame whose protobuf does not decode.
    let raft = skiff_controller::rpc::encode_frame(&skiff_controller::rpc::RpcMessage::Raft(vec![
            0xff;
            7
        ]))
    .unwrap();
    expect_closed(addr, &raft);
    // Still serving.
    let status = status_blocking(addr, None, Duration::from_secs(2)).unwrap();
    assert_eq!(status.node_id, 1);
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        join(&client, 1).await;
        client
            .create_topic(topic("after-garbage", 1))
            .await
            .unwrap();
    });
    handle.stop().unwrap();
}

#[test]
fn fetch_behind_the_snapshot_returns_the_snapshot() {
    let (handle, addr, _dir) = single(|c| c.quorum.snapshot_interval_entries = 3);
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        join(&client, 1).await;
        let mut last = 0;
        for i in 0..6 {
            last = client
                .create_topic(topic(&format!("t{i}"), 1))
                .await
                .unwrap();
        }
        match client
            .fetch_metadata(1, Duration::from_millis(100))
            .await
            .unwrap()
        {
            MetadataFetch::Snapshot { offset, image } => {
                assert!(offset >= last);
                let state = ClusterState::from_snapshot(&image).unwrap();
                assert_eq!(state.topics().count(), 6);
                assert!(!state.node(1).unwrap().fenced);
            }
            other => panic!("expected a snapshot, got {other:?}"),
        }
        // A follower catching up through it ends in the same state.
        let mut state = ClusterState::new();
        let mut from = 1;
        follow(&client, &mut state, &mut from, last).await;
        assert_eq!(state.topics().count(), 6);
    });
    handle.stop().unwrap();
}

/// Directories, bound listeners and the peer list of a three-voter quorum.
#[allow(clippy::type_complexity)]
fn three_voters() -> (
    Vec<tempfile::TempDir>,
    Vec<TcpListener>,
    Vec<(u64, SocketAddr)>,
) {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let listeners: Vec<TcpListener> = (0..3).map(|_| bind()).collect();
    let peers: Vec<(u64, SocketAddr)> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap()))
        .collect();
    (dirs, listeners, peers)
}

#[test]
fn three_voters_fail_over_and_a_restarted_voter_catches_up() {
    let (dirs, listeners, peers) = three_voters();
    let start = |i: usize, listener: TcpListener| {
        let mut c = config(dirs[i].path(), i as u64 + 1, &peers, listener);
        c.tick = Duration::from_millis(50);
        ControllerHandle::start(c).unwrap()
    };
    let mut handles: Vec<Option<ControllerHandle>> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| Some(start(i, l)))
        .collect();
    let active = |handles: &[Option<ControllerHandle>]| -> Vec<usize> {
        handles
            .iter()
            .enumerate()
            .filter(|(_, h)| h.as_ref().is_some_and(|h| h.status().active))
            .map(|(i, _)| i)
            .collect()
    };
    let (old_leader, first_offset) = run(async {
        wait_until("a leader", Duration::from_secs(10), || {
            active(&handles).len() == 1
        })
        .await;
        let client = ControllerClient::new(peers.clone(), REQUEST_TIMEOUT);
        join(&client, 1).await;
        let offset = client.create_topic(topic("before", 2)).await.unwrap();
        (active(&handles)[0], offset)
    });
    // Stop the leader.
    handles[old_leader].take().unwrap().stop().unwrap();
    let new_leader = run(async {
        let t = Instant::now();
        wait_until("a new leader", Duration::from_secs(10), || {
            active(&handles).len() == 1
        })
        .await;
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "election took {:?}",
            t.elapsed()
        );
        let client = ControllerClient::new(peers.clone(), REQUEST_TIMEOUT);
        let mut state = ClusterState::new();
        let mut from = 1;
        follow(&client, &mut state, &mut from, first_offset).await;
        assert_eq!(state.topic_by_name("before").unwrap().partitions.len(), 2);
        client.create_topic(topic("after", 1)).await.unwrap();
        active(&handles)[0]
    });
    assert_ne!(new_leader, old_leader);
    // Restart the old leader from its directory, on the same port.
    let listener = TcpListener::bind(peers[old_leader].1).unwrap();
    handles[old_leader] = Some(start(old_leader, listener));
    run(async {
        wait_until(
            "the restarted voter to catch up",
            Duration::from_secs(10),
            || {
                let target = handles[new_leader]
                    .as_ref()
                    .unwrap()
                    .status()
                    .applied_offset;
                let s = handles[old_leader].as_ref().unwrap().status();
                s.applied_offset >= target && s.topics == 2
            },
        )
        .await;
        let status = status_blocking(peers[old_leader].1, None, Duration::from_secs(2)).unwrap();
        assert!(!status.active);
        assert_eq!(status.leader_id, Some(new_leader as u64 + 1));
    });
    for h in handles.into_iter().flatten() {
        h.stop().unwrap();
    }
}

/// A node that was the active controller and goes silent with it (a pause,
/// a cut, a crash) is fenced one session after its last Raft message, not
/// one session after the election that replaced it: its partitions must not
/// wait an election timeout longer than any other node's. The other nodes,
/// heartbeating throughout, get a fresh session and stay unfenced.
#[test]
fn the_replaced_controllers_node_is_fenced_one_session_after_it_went_silent() {
    const SESSION_MS: u64 = 4000;
    let (dirs, listeners, peers) = three_voters();
    let mut handles: Vec<Option<ControllerHandle>> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = config(dirs[i].path(), i as u64 + 1, &peers, l);
            // Elections after 2-3 s of silence: without the rule the node
            // would be fenced 6-7 s after it went silent.
            c.tick = Duration::from_millis(50);
            c.quorum.election_tick_min = 40;
            c.quorum.election_tick_max = 60;
            c.controller = ControllerConfig {
                heartbeat_interval_ms: 200,
                session_timeout_ms: SESSION_MS,
                ..ControllerConfig::default()
            };
            Some(ControllerHandle::start(c).unwrap())
        })
        .collect();
    let active = |handles: &[Option<ControllerHandle>]| -> Option<usize> {
        handles
            .iter()
            .position(|h| h.as_ref().is_some_and(|h| h.status().active))
    };
    run(async {
        wait_until("a leader", Duration::from_secs(20), || {
            active(&handles).is_some()
        })
        .await;
        let leader = active(&handles).unwrap();
        let silent = leader as i32 + 1;
        let client = ControllerClient::new(peers.clone(), REQUEST_TIMEOUT);
        let stop = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut beaters = Vec::new();
        for node in 1..=3 {
            let (epoch, offset) = client.register(registration(node)).await.unwrap();
            let client = ControllerClient::new(peers.clone(), REQUEST_TIMEOUT);
            let stop = stop.clone();
            beaters.push(glommio::spawn_local(async move {
                // The silent node's broker stops with its controller.
                while !(node == silent && stop.get()) {
                    let _ = client.heartbeat(heartbeat(node, epoch, offset)).await;
                    glommio::timer::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
        let unfenced = |handles: &[Option<ControllerHandle>], node: i32| {
            active(handles).is_some_and(|a| {
                let s = handles[a].as_ref().unwrap().status();
                s.nodes.iter().any(|n| n.id == node && !n.fenced)
            })
        };
        wait_until("every node unfenced", Duration::from_secs(10), || {
            (1..=3).all(|n| unfenced(&handles, n))
        })
        .await;

        stop.set(true);
        handles[leader].take().unwrap().stop().unwrap();
        let silent_at = Instant::now();
        wait_until("the silent node fenced", Duration::from_secs(20), || {
            active(&handles).is_some_and(|a| {
                let s = handles[a].as_ref().unwrap().status();
                s.nodes.iter().any(|n| n.id == silent && n.fenced)
            })
        })
        .await;
        let took = silent_at.elapsed();
        assert!(
            took >= Duration::from_millis(SESSION_MS - 400),
            "fenced {took:?} after it went silent: before its session ran out"
        );
        assert!(
            took < Duration::from_millis(SESSION_MS + 1200),
            "fenced {took:?} after it went silent: its session ran from the election"
        );
        glommio::timer::sleep(Duration::from_secs(1)).await;
        for n in (1..=3).filter(|n| *n != silent) {
            assert!(
                unfenced(&handles, n),
                "node {n} fenced though it heartbeats"
            );
        }
        drop(beaters);
    });
    for h in handles.into_iter().flatten() {
        h.stop().unwrap();
    }
}

/// SCRAM credentials and ACLs go through the quorum into every follower's
/// state, and outlive a controller restart (its log and snapshot on disk).
#[test]
fn credentials_and_acls_commit_and_survive_a_restart() {
    use skiff_controller::access::{AclFilterRecord, ScramAlteration};
    use skiff_controller::records::AclRecord;
    use skiff_security::{AclBindingFilter, ScramCredential, ScramMechanism};

    let dir = tempfile::tempdir().unwrap();
    let acl = AclRecord {
        resource_type: 2,
        resource_name: "orders".into(),
        pattern_type: 3,
        principal: "User:alice".into(),
        host: "*".into(),
        operation: 3,
        permission: 3,
    };
    let salted = ScramMechanism::Sha512.salted_password(b"pw", b"salt", 4096);
    let first = {
        let listener = bind();
        let addr = listener.local_addr().unwrap();
        let handle =
            ControllerHandle::start(config(dir.path(), 1, &[(1, addr)], listener)).unwrap();
        let offset = run(async {
            let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
            let (_, refusals) = client
                .alter_scram_credentials(vec![
                    ScramAlteration::Upsert {
                        name: "alice".into(),
                        mechanism: 2,
                        iterations: 4096,
                        salt: b"salt".to_vec(),
                        salted_password: salted.clone(),
                    },
                    ScramAlteration::Delete {
                        name: "bob".into(),
                        mechanism: 1,
                    },
                ])
                .await
                .unwrap();
            assert_eq!(refusals[0], None);
            assert_eq!(
                refusals[1].as_ref().map(|r| r.0),
                Some(91),
                "bob has no credential"
            );
            let mut unknown = acl.clone();
            unknown.operation = 42;
            let (_, refusals) = client
                .create_acls(vec![acl.clone(), unknown])
                .await
                .unwrap();
            assert_eq!(refusals[0], None);
            assert_eq!(refusals[1].as_ref().map(|r| r.0), Some(42));
            let mut other = acl.clone();
            other.resource_name = "payments".into();
            let (offset, _) = client.create_acls(vec![other]).await.unwrap();
            let payments = AclFilterRecord::from_filter(&AclBindingFilter {
                name: Some("payments".into()),
                ..AclBindingFilter::any()
            });
            let (offset2, results) = client.delete_acls(vec![payments]).await.unwrap();
            assert!(offset2 > offset);
            assert_eq!(results[0].as_ref().unwrap().len(), 1);
            let mut state = ClusterState::new();
            let mut from = 1;
            follow(&client, &mut state, &mut from, offset2).await;
            assert_eq!(
                state.acls().iter().cloned().collect::<Vec<_>>(),
                vec![acl.clone()]
            );
            offset2
        });
        handle.stop().unwrap();
        offset
    };
    let listener = bind();
    let addr = listener.local_addr().unwrap();
    let handle = ControllerHandle::start(config(dir.path(), 1, &[(1, addr)], listener)).unwrap();
    run(async {
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        let mut state = ClusterState::new();
        let mut from = 1;
        follow(&client, &mut state, &mut from, first).await;
        let c = state
            .scram_credential("alice", 2)
            .expect("alice's credential");
        let cred = ScramCredential {
            mechanism: ScramMechanism::Sha512,
            salt: c.salt.clone(),
            stored_key: c.stored_key.clone(),
            server_key: c.server_key.clone(),
            iterations: c.iterations,
        };
        assert!(cred.verify_password("pw"));
        assert_eq!(state.acls().len(), 1);
    });
    handle.stop().unwrap();
}

/// A restarted controller's new term begins with an entry without records; a
/// heartbeat answer names the controller's applied offset, which includes it.
/// A broker following the log must be able to reach that offset (a node back
/// from a lapsed lease leads again only there), so a fetch that reads only such
/// entries answers with an empty batch at the last of them.
#[test]
fn a_broker_reaches_the_offset_a_heartbeat_names_after_a_controller_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, created) = {
        let listener = bind();
        let addr = listener.local_addr().unwrap();
        let handle =
            ControllerHandle::start(config(dir.path(), 1, &[(1, addr)], listener)).unwrap();
        let got = run(async {
            let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
            let epoch = join(&client, 1).await;
            let created = client.create_topic(topic("orders", 1)).await.unwrap();
            (epoch, created)
        });
        handle.stop().unwrap();
        got
    };
    let listener = bind();
    let addr = listener.local_addr().unwrap();
    let handle = ControllerHandle::start(config(dir.path(), 1, &[(1, addr)], listener)).unwrap();
    run(async {
        wait_until(
            "the restarted voter to be active",
            Duration::from_secs(5),
            || handle.status().active,
        )
        .await;
        let client = ControllerClient::new(vec![(1, addr)], REQUEST_TIMEOUT);
        // The new active controller gives every node a fresh session; the
        // node's registration of before still stands.
        let (_, named) = client
            .heartbeat_with_offset(heartbeat(1, epoch, created))
            .await
            .unwrap();
        assert!(named > created, "the new term's entry is applied: {named}");
        let mut state = ClusterState::new();
        let mut from = created + 1;
        match client
            .fetch_metadata(from, Duration::from_millis(300))
            .await
            .unwrap()
        {
            MetadataFetch::Batches(batches) => {
                let last = batches.last().map(|b| b.offset);
                assert_eq!(last, Some(named), "the fetch reaches the named offset");
                assert!(batches.iter().all(|b| b.offset >= from));
            }
            other => panic!("expected batches, got {other:?}"),
        }
        // And a follower from the start applies the same state through it.
        from = 1;
        follow(&client, &mut state, &mut from, named).await;
        assert!(state.topic_by_name("orders").is_some());
        // Nothing newer: the long poll waits and answers empty.
        let empty = client
            .fetch_metadata(named + 1, Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(empty, MetadataFetch::Batches(vec![]));
    });
    handle.stop().unwrap();
}

fn secret(s: &str) -> skiff_security::SharedSecret {
    skiff_security::SharedSecret::new(s.as_bytes()).unwrap()
}

/// With `controller.secret.file`, voters prove the secret to each other and
/// clients prove it to them before any frame is decoded: a voter with
/// another secret hears nobody, a client without it or with another gets a
/// named refusal, and a forged Raft frame from a process without it is
/// closed on unread.
#[test]
fn a_shared_secret_keeps_out_whoever_cannot_prove_it() {
    let (dirs, listeners, peers) = three_voters();
    let good = secret("the quorum's own secret, 32 bytes");
    let handles: Vec<ControllerHandle> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = config(dirs[i].path(), i as u64 + 1, &peers, l);
            c.tick = Duration::from_millis(50);
            c.secret = Some(if i == 2 {
                secret("a stranger's secret, also long enough")
            } else {
                good.clone()
            });
            ControllerHandle::start(c).unwrap()
        })
        .collect();
    let addr = peers[0].1;
    run(async {
        // Voters 1 and 2 (a majority) elect one of themselves.
        wait_until("an active controller", Duration::from_secs(20), || {
            handles[..2].iter().any(|h| h.status().active)
        })
        .await;
        let client =
            ControllerClient::new(peers.clone(), REQUEST_TIMEOUT).with_secret(Some(good.clone()));
        join(&client, 1).await;
        client.create_topic(topic("orders", 1)).await.unwrap();
        // Voter 3 refuses them and they refuse it: it never hears a leader.
        glommio::timer::sleep(Duration::from_secs(2)).await;
        assert_eq!(handles[2].status().leader_id, None);
        assert!(!handles[2].status().active);
    });
    let status = status_blocking(addr, Some(&good), Duration::from_secs(2)).unwrap();
    assert_eq!(status.topics, 1);
    // No secret: the voter reads our frame as a too-short hello... and closes.
    let none = status_blocking(addr, None, Duration::from_secs(2)).unwrap_err();
    assert!(
        matches!(none, ClientError::Protocol(_) | ClientError::Io(_)),
        "{none}"
    );
    // Another secret: the voter's proof fails at our end, named.
    let wrong = status_blocking(
        addr,
        Some(&secret("not the quorum's secret!")),
        Duration::from_secs(2),
    )
    .unwrap_err();
    assert!(
        wrong
            .to_string()
            .contains("does not know the shared secret"),
        "{wrong}"
    );
    // A forged Raft frame where the hello should be: closed unread.
    let raft = skiff_controller::rpc::encode_frame(&skiff_controller::rpc::RpcMessage::Raft(vec![
            0xff;
            64
        ]))
    .unwrap();
    expect_closed(addr, &raft);
    // A secret-less listener named as such to a client that has one.
    let (plain, plain_addr, _dir) = single(|_| {});
    let refused = status_blocking(plain_addr, Some(&good), Duration::from_secs(2)).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("no controller secret configured there"),
        "{refused}"
    );
    // And the authenticated voters still serve.
    let again = status_blocking(addr, Some(&good), Duration::from_secs(2)).unwrap();
    assert_eq!(again.topics, 1);
    plain.stop().unwrap();
    for h in handles {
        h.stop().unwrap();
    }
}
