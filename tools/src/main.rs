//! `skiff-tools`: offline inspection of skiff data directories.
//!
//! Exit status: 0 clean, 1 problems found, 2 usage error or unreadable input.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use skiff_tools::dump_index::{dump_offset_index, dump_time_index, dump_txn_index};
use skiff_tools::dump_log::{dump_log, DumpLogOptions};
use skiff_tools::dump_metadata::dump_metadata;
use skiff_tools::verify::{verify, VerifyOptions};
use skiff_tools::ToolError;

#[derive(Debug, Parser)]
#[command(
    name = "skiff-tools",
    version,
    about = "Dump and verify skiff segments, indexes and partitions (offline)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the record batches of a .log segment, kafka-dump-log style.
    DumpLog {
        file: PathBuf,
        /// Also decode and print every record (key, value, header keys).
        #[arg(long)]
        deep: bool,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print an .index file's entries, checked against the sibling .log.
    DumpIndex {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print a .timeindex file's entries, checked against the sibling .log.
    DumpTimeindex {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print a .txnindex file's aborted transactions, checked against the
    /// sibling .log.
    DumpTxnindex {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the controller's metadata log: the snapshot's state, then every
    /// frame of raft.log with its decoded metadata records.
    DumpMetadata {
        /// A data directory, or its __cluster_metadata-0 directory.
        dir: PathBuf,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a partition directory, or every partition of a data directory.
    Verify {
        dir: PathBuf,
        /// The topic is compacted: allow offset gaps between batches and batches
        /// holding fewer records than their offset span.
        #[arg(long)]
        compacted: bool,
        /// Also decode every record (decompressing), not only headers and CRCs.
        #[arg(long)]
        deep: bool,
    },
}

const EXIT_PROBLEMS: u8 = 1;
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors by itself.
    let cli = Cli::parse();
    match run(cli) {
        Ok(clean) if clean => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_PROBLEMS),
        Err(e)
            if e.downcast_ref::<ToolError>()
                .is_some_and(ToolError::is_broken_pipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // ToolError messages already name their cause: the top level is enough.
            eprintln!("skiff-tools: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Runs one command; `Ok(false)` when it found problems.
fn run(cli: Cli) -> anyhow::Result<bool> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let clean = match cli.command {
        Command::DumpLog { file, deep, json } => {
            dump_log(&file, DumpLogOptions { deep, json }, &mut out)?.is_clean()
        }
        Command::DumpIndex { file, json } => dump_offset_index(&file, json, &mut out)?,
        Command::DumpTimeindex { file, json } => dump_time_index(&file, json, &mut out)?,
        Command::DumpTxnindex { file, json } => dump_txn_index(&file, json, &mut out)?,
        Command::DumpMetadata { dir, json } => {
            let summary = dump_metadata(&dir, json, &mut out)?;
            if !summary.is_clean() {
                out.flush().map_err(ToolError::Output)?;
                eprintln!("dump-metadata: {} problems", summary.problems);
            }
            summary.is_clean()
        }
        Command::Verify {
            dir,
            compacted,
            deep,
        } => {
            let outcome = verify(&dir, VerifyOptions { compacted, deep }, &mut out)?;
            if !outcome.is_clean() {
                out.flush().map_err(ToolError::Output)?;
                eprintln!(
                    "verify: {} problems ({} checked)",
                    outcome.problems, outcome.totals
                );
            }
            outcome.is_clean()
        }
    };
    out.flush().map_err(ToolError::Output)?;
    Ok(clean)
}
