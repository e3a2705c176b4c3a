#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The scrubber (`PartitionLog::scrub`): closed segments are verified in the
//! background, so a flipped byte in data nobody reads is found (issue 14's
//! bitflip nemesis: a follower's segments are read by no one).

mod common;

use common::{batch, mutable, open_uncached, run, segment_bases, small_config};
use skiff_engine::batch::BatchScanner;
use skiff_engine::{AppendMode, LogError};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 1 };

#[test]
fn a_pass_verifies_every_closed_segment_and_finds_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        for i in 0..300u64 {
            log.append(mutable(&batch(i, 2, 700, 1000 + i as i64)), LEADER)
                .await
                .unwrap();
        }
        log.flush().await.unwrap();
        let bases = segment_bases(&path);
        assert!(bases.len() > 3, "small segment.bytes must roll");
        let closed: u64 = bases[..bases.len() - 1]
            .iter()
            .map(|b| {
                std::fs::metadata(path.join(format!("{b:020}.log")))
                    .unwrap()
                    .len()
            })
            .sum();

        // A clean pass, in steps smaller than a segment: every byte of the
        // closed segments is verified once, the active one is left alone.
        let mut verified = 0;
        let mut steps = 0;
        loop {
            let step = log.scrub(8 * 1024).await.unwrap();
            verified += step.bytes;
            steps += 1;
            assert!(steps < 1_000, "the pass never ends");
            if step.pass_done {
                break;
            }
        }
        assert_eq!(verified, closed);
        assert!(log.offline_reason().is_none());

        // A byte flipped in a record of the second segment, which no read asks
        // for: the next pass finds it, at that batch.
        let second = path.join(format!("{:020}.log", bases[1]));
        let mut bytes = std::fs::read(&second).unwrap();
        let (position, header) = BatchScanner::new(&bytes).nth(3).unwrap();
        bytes[position + 61 + 9] ^= 0x01;
        std::fs::write(&second, &bytes).unwrap();
        let corruption = loop {
            match log.scrub(8 * 1024).await {
                Ok(_) => {}
                Err(LogError::Corrupt(c)) => break c,
                Err(e) => panic!("unexpected error {e}"),
            }
            steps += 1;
            assert!(steps < 2_000, "the flipped byte was never found");
        };
        assert_eq!(corruption.path, second);
        assert_eq!(corruption.position, position as u64);
        assert_eq!(corruption.base_offset, header.base_offset);
        // Offline for corruption, as a read that met it would leave it.
        assert!(log.offline_reason().is_some());
        assert!(matches!(
            log.read(0, 1024, i64::MAX).await,
            Err(LogError::Corrupt(_))
        ));
        // Repaired: cut before the bad batch; the next pass is clean.
        assert_eq!(
            log.repair_corruption().await.unwrap(),
            Some(header.base_offset)
        );
        loop {
            let step = log.scrub(1 << 20).await.unwrap();
            if step.pass_done {
                break;
            }
        }
        assert!(log.offline_reason().is_none());
    });
}
