#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shard runtime: two executors, partitions owned by each, calls routed across
//! cores, and a restart that recovers every partition on its owner.

mod common;

use common::{batch, mutable};
use skiff_engine::batch::BatchHeader;
use skiff_engine::{AppendMode, LogError, OffsetQuery, Runtime, ShardConfig, TopicPartition};

fn config(dir: &std::path::Path) -> ShardConfig {
    let mut c = ShardConfig::unpinned(dir, 2);
    c.log = common::small_config();
    c.io_memory_bytes = 8 << 20;
    c
}

#[test]
fn routes_calls_to_owning_cores_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(config(dir.path())).unwrap();
    assert_eq!(rt.shards(), 2);
    let tps: Vec<_> = (0..4).map(|p| TopicPartition::new("orders", p)).collect();
    let owners: Vec<_> = tps.iter().map(|tp| rt.table().shard_of(tp)).collect();
    assert!(owners.contains(&0) && owners.contains(&1));

    // Everything is driven from shard 0; half the partitions live on shard 1.
    let tps2 = tps.clone();
    let sent = rt
        .block_on(0, move |shard| async move {
            let mut sent = Vec::new();
            for tp in &tps2 {
                shard.create_partition(tp).await.unwrap();
                assert!(matches!(
                    shard.create_partition(tp).await,
                    Err(LogError::PartitionExists(_))
                ));
            }
            for round in 0..20u64 {
                for (i, tp) in tps2.iter().enumerate() {
                    let b = batch(round * 10 + i as u64, 3, 200, 1000 + round as i64);
                    let info = shard
                        .append(tp, mutable(&b), AppendMode::Leader { leader_epoch: 1 })
                        .await
                        .unwrap();
                    assert_eq!(info.base_offset, round as i64 * 3);
                    sent.push((tp.clone(), b));
                }
            }
            let missing = TopicPartition::new("nope", 0);
            assert!(matches!(
                shard.read(&missing, 0, 100, i64::MAX).await,
                Err(LogError::UnknownPartition(_))
            ));
            sent
        })
        .unwrap();
    let owned: Vec<usize> = (0..2)
        .map(|s| {
            rt.block_on(s, |shard| async move { shard.local_partitions().len() })
                .unwrap()
        })
        .collect();
    assert_eq!(owned.iter().sum::<usize>(), 4);
    assert!(
        owned.iter().all(|&n| n > 0),
        "each shard owns some partitions: {owned:?}"
    );
    rt.shutdown().unwrap();

    // Restart: each shard recovers its own partitions; read from the other shard.
    let rt = Runtime::start(config(dir.path())).unwrap();
    let tps2 = tps.clone();
    rt.block_on(1, move |shard| async move {
        for tp in &tps2 {
            assert_eq!(
                shard.list_offset(tp, OffsetQuery::Latest).await.unwrap(),
                Some((60, -1))
            );
            assert_eq!(
                shard.list_offset(tp, OffsetQuery::Earliest).await.unwrap(),
                Some((0, -1))
            );
            let r = shard.read(tp, 0, 1 << 20, i64::MAX).await.unwrap();
            let expected: Vec<_> = sent
                .iter()
                .filter(|(t, _)| t == tp)
                .map(|(_, b)| b.clone())
                .collect();
            assert_eq!(r.batches.len(), expected.len());
            for (g, e) in r.batches.iter().zip(&expected) {
                assert_eq!(&g[61..], &e[61..]);
            }
            assert_eq!(BatchHeader::parse(&r.batches[19]).unwrap().base_offset, 57);
        }
        shard.delete_partition(&tps2[0]).await.unwrap();
        assert!(matches!(
            shard.list_offset(&tps2[0], OffsetQuery::Latest).await,
            Err(LogError::UnknownPartition(_))
        ));
    })
    .unwrap();
    rt.shutdown().unwrap();
    assert!(!dir.path().join("orders-0").exists());
    let meta = std::fs::read_to_string(dir.path().join("meta.properties")).unwrap();
    assert!(
        meta.contains("node.id=1\n") && meta.contains("cluster.id="),
        "{meta}"
    );
    let mut wrong_node = config(dir.path());
    wrong_node.node_id = 2;
    assert!(matches!(
        Runtime::start(wrong_node),
        Err(LogError::DataDir(_))
    ));
}

/// With `Durability::Interval` the background flusher owns the flushes; a
/// stop right after a burst of appends (the flusher mid-flush, holding the
/// partition's lock) must still end, with every appended record on disk
/// after a restart. It hung when the stop cancelled the flusher instead of
/// letting it finish its step (found by `skiff-bench engine --durability
/// interval`, which hung at every run of 64 MiB per partition).
#[test]
fn interval_durability_stops_and_keeps_every_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = ShardConfig::unpinned(dir.path(), 2);
    c.log.durability = skiff_engine::Durability::Interval(std::time::Duration::from_millis(100));
    c.log.max_batch_bytes = 2 << 20;
    let big = batch(1, 1000, 1000, 1000); // about 1 MiB
    const PER_TASK: u64 = 16;
    const TASKS: u64 = 4;
    for round in 0..3 {
        let rt = Runtime::start(c.clone()).unwrap();
        let tps: Vec<_> = (0..2).map(|p| TopicPartition::new("interval", p)).collect();
        let mut pending = Vec::new();
        for tp in tps.clone() {
            let big = big.clone();
            let owner = rt.table().shard_of(&tp);
            pending.push(
                rt.submit(owner, move |shard| async move {
                    if round == 0 {
                        shard.create_partition(&tp).await.unwrap();
                    }
                    let mut tasks = Vec::new();
                    for _ in 0..TASKS {
                        let (shard, tp, big) = (shard.clone(), tp.clone(), big.clone());
                        tasks.push(glommio::spawn_local(async move {
                            for _ in 0..PER_TASK {
                                shard
                                    .append(
                                        &tp,
                                        mutable(&big),
                                        AppendMode::Leader { leader_epoch: 0 },
                                    )
                                    .await
                                    .unwrap();
                            }
                        }));
                    }
                    for t in tasks {
                        t.await;
                    }
                })
                .unwrap(),
            );
        }
        for p in pending {
            skiff_engine::shard::block_on(p).unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(rt.shutdown());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the runtime did not stop within 60 s")
            .unwrap();
        let rt = Runtime::start(c.clone()).unwrap();
        for tp in tps {
            let end = rt
                .block_on(0, move |shard| async move {
                    shard.list_offset(&tp, OffsetQuery::Latest).await
                })
                .unwrap()
                .unwrap();
            let records = 1000 * PER_TASK * TASKS * (round + 1);
            assert_eq!(end.map(|(offset, _)| offset), Some(records as i64));
        }
        rt.shutdown().unwrap();
    }
}

/// A partition created with its topic's id holds it in `partition.metadata`
/// (Kafka's format) from its creation on, with no temporary left beside it,
/// and keeps it across a restart; one created without an id has none.
#[test]
fn a_new_partition_records_its_topic_id() {
    let dir = tempfile::tempdir().unwrap();
    let id: [u8; 16] = *b"0123456789abcdef";
    let rt = Runtime::start(config(dir.path())).unwrap();
    rt.block_on(0, move |shard| async move {
        for p in 0..4 {
            let tp = TopicPartition::new("ids", p);
            shard
                .create_partition_with(&tp, common::small_config(), Some(id))
                .await
                .unwrap();
            // Created once: a second create is refused and changes nothing.
            assert!(matches!(
                shard
                    .create_partition_with(&tp, common::small_config(), Some([9; 16]))
                    .await,
                Err(LogError::PartitionExists(_))
            ));
        }
        shard
            .create_partition(&TopicPartition::new("plain", 0))
            .await
            .unwrap();
    })
    .unwrap();
    rt.shutdown().unwrap();
    let rt = Runtime::start(config(dir.path())).unwrap();
    let data = dir.path().to_path_buf();
    rt.block_on(1, move |_| async move {
        for p in 0..4 {
            let pdir = data.join(format!("ids-{p}"));
            assert_eq!(
                skiff_engine::partition_meta::read(&pdir).await.unwrap(),
                Some(id)
            );
            let names: Vec<String> = std::fs::read_dir(&pdir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                !names.iter().any(|n| n.ends_with(".tmp")),
                "no temporary left: {names:?}"
            );
        }
        assert_eq!(
            skiff_engine::partition_meta::read(&data.join("plain-0"))
                .await
                .unwrap(),
            None
        );
    })
    .unwrap();
    rt.shutdown().unwrap();
}

/// Calls across cores whose callers come and go: both shards call each
/// other at once, each call from a task of its own that ends as soon as the
/// answer is in, a third of them dropped by their caller after a short,
/// varying while (a connection gone, a fetch answered elsewhere). Every
/// answer is delivered on the caller's core (`Shard::run_on`), and every
/// call that was not dropped gets its own.
#[test]
fn calls_across_cores_deliver_their_results_on_the_callers_core() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(config(dir.path())).unwrap();
    const CALLS: u64 = 20_000;
    let calls: Vec<_> = (0..2usize)
        .map(|me| {
            rt.submit(me, move |shard| async move {
                let other = 1 - me;
                let mut answered = 0u64;
                let mut batch = Vec::new();
                for i in 0..CALLS {
                    let shard = shard.clone();
                    batch.push(glommio::spawn_local(async move {
                        let call = shard.invoke_on(other, move |callee| async move {
                            if i % 2 == 0 {
                                glommio::yield_if_needed().await;
                            }
                            (callee.id(), i * 31)
                        });
                        if i % 3 == 0 {
                            let wait = std::time::Duration::from_micros(i * 7 % 200);
                            let timer = glommio::timer::sleep(wait);
                            futures_util::pin_mut!(call);
                            futures_util::pin_mut!(timer);
                            match futures_util::future::select(call, timer).await {
                                futures_util::future::Either::Left((r, _)) => {
                                    assert_eq!(r.unwrap(), (other, i * 31));
                                    1
                                }
                                futures_util::future::Either::Right(_) => 0,
                            }
                        } else {
                            assert_eq!(call.await.unwrap(), (other, i * 31));
                            1
                        }
                    }));
                    if batch.len() == 64 {
                        for task in batch.drain(..) {
                            answered += task.await;
                        }
                    }
                }
                for task in batch {
                    answered += task.await;
                }
                answered
            })
            .unwrap()
        })
        .collect();
    for call in calls {
        let answered = skiff_engine::shard::block_on(call).unwrap();
        assert!(answered >= CALLS * 2 / 3, "{answered} calls answered");
    }
    rt.shutdown().unwrap();
}
