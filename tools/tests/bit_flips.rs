//! Every single-bit flip in a segment's files is reported by `verify`: the fields
//! the CRC does not cover (base offset, length, leader epoch, magic, the CRC itself)
//! and the index files are caught by the offset, epoch and index checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Fixture;
use skiff_tools::verify::{verify, VerifyOptions};

/// Bits flipped in each byte: low, middle and sign bits.
const MASKS: [u8; 3] = [0x01, 0x10, 0x80];

#[test]
fn every_bit_flip_in_segment_files_is_reported() {
    let fx = Fixture::new();
    let mut clean = Vec::new();
    let outcome = verify(&fx.data_dir, VerifyOptions::default(), &mut clean).unwrap();
    assert!(outcome.is_clean(), "{}", String::from_utf8_lossy(&clean));

    let mut checked = 0;
    for base_offset in [0, 10] {
        for ext in ["log", "index", "timeindex"] {
            let path = fx.file(base_offset, ext);
            let original = std::fs::read(&path).unwrap();
            for position in 0..original.len() {
                for mask in MASKS {
                    let mut damaged = original.clone();
                    damaged[position] ^= mask;
                    std::fs::write(&path, &damaged).unwrap();
                    let mut out = Vec::new();
                    let outcome = verify(&fx.data_dir, VerifyOptions::default(), &mut out).unwrap();
                    assert!(
                        !outcome.is_clean(),
                        "flip {mask:#04x} at {} position {position} went unnoticed",
                        path.display()
                    );
                    checked += 1;
                }
            }
            std::fs::write(&path, &original).unwrap();
        }
    }
    assert!(checked > 2_000, "{checked}");
}

#[test]
fn damaged_files_never_stop_the_dumps() {
    use skiff_tools::dump_index::{dump_offset_index, dump_time_index};
    use skiff_tools::dump_log::{dump_log, DumpLogOptions};

    let fx = Fixture::new();
    let log = fx.file(0, "log");
    let original = std::fs::read(&log).unwrap();
    let deep_json = DumpLogOptions {
        deep: true,
        json: true,
    };
    let deep_text = DumpLogOptions {
        deep: true,
        json: false,
    };
    for position in 0..original.len() {
        for mask in [0x01, 0x80] {
            let mut damaged = original.clone();
            damaged[position] ^= mask;
            std::fs::write(&log, &damaged).unwrap();
            let mut out = Vec::new();
            let summary = dump_log(&log, deep_text, &mut out).unwrap();
            assert!(summary.batches > 0 || position < 61, "position {position}");
            dump_log(&log, deep_json, &mut out).unwrap();
            dump_offset_index(&fx.file(0, "index"), false, &mut out).unwrap();
            dump_time_index(&fx.file(0, "timeindex"), true, &mut out).unwrap();
        }
    }
    // Pseudo-random garbage of every small length.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for len in 0..300 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(&log, &bytes).unwrap();
        std::fs::write(fx.file(0, "index"), &bytes).unwrap();
        std::fs::write(fx.file(0, "timeindex"), &bytes).unwrap();
        let mut out = Vec::new();
        dump_log(&log, deep_json, &mut out).unwrap();
        dump_offset_index(&fx.file(0, "index"), true, &mut out).unwrap();
        dump_time_index(&fx.file(0, "timeindex"), false, &mut out).unwrap();
        let outcome = verify(&fx.data_dir, VerifyOptions::default(), &mut out).unwrap();
        assert!(
            !outcome.is_clean() || len == 0,
            "garbage of length {len} passed verify"
        );
    }
}
