//! The segment appender: turns appended bytes into aligned O_DIRECT writes.
//!
//! Appends are copied into a DMA buffer, the chunk (the one copy on the produce
//! path: O_DIRECT needs aligned memory). A full chunk is written whole by a
//! background task, up to `max_inflight_writes` at once, while the next chunk fills.
//! `write_out` (every flush) writes the partly filled chunk too, padded with
//! zeros to the next block, so everything appended is readable from the file; it
//! hands the chunk itself to the write and starts a one-block chunk holding the
//! partial last block, which the next write rewrites with more data; the chunk
//! after it is full size again and starts on a fresh block. Writes never overlap
//! while in flight: a write of a block an earlier write still in flight covers
//! is chained after it (`submit`: its task awaits that write, then writes), so
//! neither the append nor the partition's lock waits for the disk there.
//!
//! The one-block rewrite keeps every big write off the block the commit
//! before it wrote: on ext4 a direct write spanning a written block and
//! preallocated (unwritten) ones is not a pure overwrite, so it needs the
//! inode's exclusive lock, and io_uring hands it to a worker thread (one
//! such write per commit before this); the block alone is an overwrite and
//! the fresh blocks are all unwritten, so both go straight from the ring.
//!
//! A group commit does not hold the partition's lock while writes complete:
//! `start_write_out` only submits the partly filled chunk and hands back the
//! writes in flight ([`PendingWrite`]); the flusher awaits them and syncs
//! outside the lock while appends go on filling the next chunk.
//!
//! Disk space is reserved ahead of the write position (`fallocate` without
//! KEEP_SIZE), so the file is longer than its data while the segment is active
//! and the bytes after the data read as zeros. `finish` trims the file to its
//! data when the segment is rolled or closed. No reservation reaches past the
//! segment's size limit (`Sizing::reserve_limit`) unless a write does, so a
//! roll trims at most the last batch's slack, not a whole step.
//!
//! Both sizes follow the data ([`Growth`]): a chunk starts at `MIN_CHUNK_BYTES`
//! and doubles each time one fills, up to `append_chunk_bytes`; a reservation
//! starts at `MIN_RESERVE_BYTES` and doubles each time one is used up, up to
//! `preallocate_step_bytes`. So a partition that got one small record holds a
//! 64 KiB buffer and 64 KiB of disk, not 1 MiB and 32 MiB, while a busy one
//! reaches the full sizes within its first few MiB. Reserved space is at most
//! the data written since the last reservation plus one minimum step, so a
//! segment's allocation stays within twice its data plus 64 KiB. The sizes
//! reached carry over to the next segment at a roll.
//!
//! Any failed write or fdatasync poisons the appender: after a failed flush the
//! state of the file is unknown, so nothing more is written or acknowledged.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;

use futures_util::future::{FutureExt, LocalBoxFuture, Shared};
use glommio::io::{DmaBuffer, DmaFile};

use crate::error::{LogError, Result};

/// A chunk write's outcome: bytes written, or why it failed.
pub type WriteOutcome = std::result::Result<usize, Rc<str>>;

/// A chunk write in flight, awaitable by the appender and by a flusher alike.
#[derive(Clone)]
pub struct PendingWrite {
    /// File position the write ends at.
    pub end: u64,
    /// Bytes submitted.
    pub len: usize,
    pub done: Shared<LocalBoxFuture<'static, WriteOutcome>>,
}

impl PendingWrite {
    /// Waits for the write; an error unless all `len` bytes were written.
    pub async fn wait(self) -> std::result::Result<(), String> {
        match self.done.await {
            Ok(n) if n == self.len => Ok(()),
            Ok(n) => Err(format!("short write: {n} of {} bytes", self.len)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The first chunk of a segment that inherited no sizes.
pub const MIN_CHUNK_BYTES: usize = 64 * 1024;
/// The first reservation of a segment that inherited no sizes.
pub const MIN_RESERVE_BYTES: u64 = 64 * 1024;

/// The chunk and reservation sizes an appender has grown to (see the module
/// docs); a rolled segment's sizes start the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Growth {
    pub chunk_bytes: usize,
    pub reserve_bytes: u64,
}

impl Growth {
    pub const SMALL: Growth = Growth {
        chunk_bytes: MIN_CHUNK_BYTES,
        reserve_bytes: MIN_RESERVE_BYTES,
    };
}

/// An appender's limits and its starting sizes.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// The largest chunk (`append_chunk_bytes`).
    pub max_chunk_bytes: usize,
    pub max_inflight_writes: usize,
    /// The largest reservation (`preallocate_step_bytes`); 0: no fallocate.
    pub max_reserve_bytes: u64,
    /// No reservation reaches past this file size unless a write needs it:
    /// the segment's size limit (`segment.bytes`), which a segment rolls
    /// before. Reserved space past the data is trimmed at the roll: a step
    /// reserved past the limit (up to `max_reserve_bytes`) was freed there
    /// (a discard) and allocated again by the next segment.
    pub reserve_limit: u64,
    pub start: Growth,
}

pub struct Appender {
    file: Rc<DmaFile>,
    path: PathBuf,
    align: u64,
    /// The size of the next chunk allocated (grows to `max_chunk_bytes`).
    chunk_bytes: usize,
    max_chunk_bytes: usize,
    max_inflight_writes: usize,
    /// The size of the next reservation (grows to `max_reserve_bytes`).
    reserve_bytes: u64,
    max_reserve_bytes: u64,
    reserve_limit: u64,
    /// The chunk being filled; allocated on the first append after a dispatch.
    /// Its length is the chunk size when it was allocated.
    buf: Option<DmaBuffer>,
    /// File position of `buf[0]`; always aligned.
    buf_pos: u64,
    /// Bytes of data in `buf`.
    buf_len: usize,
    /// Prefix of `buf` already written to the file: at most the partial block
    /// a chunk starts with (every write_out starts a new chunk), which the
    /// chunk's next write rewrites with the same bytes.
    buf_written: usize,
    /// Chunk writes in flight (or done and not yet reaped), oldest first.
    inflight: VecDeque<PendingWrite>,
    /// Every byte below this position has been written (not necessarily synced).
    written: u64,
    /// File space is reserved up to here.
    preallocated: u64,
    failed: Option<String>,
}

impl Appender {
    /// An appender that continues the file at `end` (the end of its valid data).
    /// The partial block before `end` is read back so the first write keeps it.
    pub async fn open(
        file: Rc<DmaFile>,
        path: PathBuf,
        end: u64,
        sizing: Sizing,
    ) -> Result<Appender> {
        let max_chunk_bytes = sizing.max_chunk_bytes;
        let align = write_alignment(&file, max_chunk_bytes).await;
        assert!(
            max_chunk_bytes as u64 % align == 0 && max_chunk_bytes > 0,
            "append chunk must be a multiple of {align}"
        );
        // A multiple of the alignment, at most the (aligned) maximum.
        let chunk_bytes = sizing
            .start
            .chunk_bytes
            .clamp(align as usize, max_chunk_bytes);
        let chunk_bytes = (chunk_bytes as u64).div_ceil(align) * align;
        let reserve_bytes = sizing
            .start
            .reserve_bytes
            .clamp(align, sizing.max_reserve_bytes.max(align));
        let file_size = file
            .file_size()
            .await
            .map_err(|e| LogError::io("stat", &path, e))?;
        let mut appender = Appender {
            file,
            path,
            align,
            chunk_bytes: chunk_bytes as usize,
            max_chunk_bytes,
            max_inflight_writes: sizing.max_inflight_writes.max(1),
            reserve_bytes,
            max_reserve_bytes: sizing.max_reserve_bytes,
            reserve_limit: sizing.reserve_limit,
            buf: None,
            buf_pos: end - end % align,
            buf_len: 0,
            buf_written: 0,
            inflight: VecDeque::new(),
            written: end,
            preallocated: file_size,
            failed: None,
        };
        appender.load_tail(end).await?;
        Ok(appender)
    }

    /// Logical end of the data: the position the next append lands at.
    pub fn end(&self) -> u64 {
        self.buf_pos + self.buf_len as u64
    }

    /// The sizes this appender grew to, for the segment after a roll.
    pub fn growth(&self) -> Growth {
        Growth {
            chunk_bytes: self.chunk_bytes,
            reserve_bytes: self.reserve_bytes,
        }
    }

    /// Every byte below this position can be read from the file.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn file(&self) -> &Rc<DmaFile> {
        &self.file
    }

    /// Why the appender failed (a failed write or fdatasync), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(LogError::Offline(reason.clone())),
            None => Ok(()),
        }
    }

    fn fail(&mut self, op: &'static str, e: impl std::fmt::Display) -> LogError {
        let reason = format!("{op} {}: {e}", self.path.display());
        // The owner (the partition log, the cleaner) reports it, once.
        tracing::debug!(%reason, "segment write failed; the appender is poisoned");
        self.failed = Some(reason.clone());
        LogError::Offline(reason)
    }

    /// Appends `data` at `end()` and returns the position it starts at. Waits only
    /// when `max_inflight_writes` chunk writes are already in flight.
    pub async fn append(&mut self, data: &[u8]) -> Result<u64> {
        self.check()?;
        let position = self.end();
        let mut src = data;
        while !src.is_empty() {
            let chunk_bytes = self.chunk_bytes;
            let file = &self.file;
            let buf = self
                .buf
                .get_or_insert_with(|| file.alloc_dma_buffer(chunk_bytes));
            let capacity = buf.len();
            let n = src.len().min(capacity - self.buf_len);
            buf.as_bytes_mut()[self.buf_len..self.buf_len + n].copy_from_slice(&src[..n]);
            self.buf_len += n;
            src = &src[n..];
            if self.buf_len == capacity {
                self.dispatch_full_chunk().await?;
            }
        }
        Ok(position)
    }

    async fn dispatch_full_chunk(&mut self) -> Result<()> {
        let Some(buf) = self.buf.take() else {
            return Ok(());
        };
        let capacity = buf.len();
        // Written whole: what an earlier write_out wrote of it is at most the
        // partial block it started with, rewritten with the same bytes.
        let pos = self.buf_pos;
        self.buf_pos += capacity as u64;
        self.buf_len = 0;
        self.buf_written = 0;
        // A chunk filled: the partition writes enough for a bigger one (not
        // the one-block chunk after a write_out).
        if capacity >= self.chunk_bytes {
            self.chunk_bytes = (self.chunk_bytes * 2).min(self.max_chunk_bytes);
        }
        self.submit(buf, pos).await
    }

    async fn submit(&mut self, buf: DmaBuffer, pos: u64) -> Result<()> {
        let len = buf.len();
        self.reserve(pos + len as u64).await?;
        while self.inflight.len() >= self.max_inflight_writes {
            self.complete_oldest().await?;
        }
        // Writes never overlap while in flight: a chunk that begins with the
        // partial block an earlier write_out wrote goes after that write (the
        // newest: positions only grow), without waiting for it here.
        let after = self
            .inflight
            .back()
            .filter(|w| w.end > pos)
            .map(|w| w.done.clone());
        let file = self.file.clone();
        let task = glommio::spawn_local(async move {
            if let Some(before) = after {
                if let Err(e) = before.await {
                    // The appender reports that write's failure when it reaps it.
                    return Err(Rc::from(format!(
                        "not written: an earlier write failed: {e}"
                    )));
                }
            }
            file.write_at(buf, pos)
                .await
                .map_err(|e| Rc::from(std::io::Error::from(e).to_string()))
        })
        .detach();
        let done = async move {
            task.await
                .unwrap_or_else(|| Err(Rc::from("write task cancelled")))
        }
        .boxed_local()
        .shared();
        self.inflight.push_back(PendingWrite {
            end: pos + len as u64,
            len,
            done,
        });
        Ok(())
    }

    async fn complete_oldest(&mut self) -> Result<()> {
        let Some(w) = self.inflight.pop_front() else {
            return Ok(());
        };
        let outcome = w.done.await;
        self.completed(w.end, w.len, outcome).await
    }

    /// Pops the writes at the front that completed whole, without waiting,
    /// so the count of writes in flight and `written` are current after a
    /// flusher awaited them. A failed or short one stays at the front for
    /// `complete_oldest` to explain.
    fn reap_written(&mut self) {
        while let Some(w) = self.inflight.front() {
            match w.done.peek() {
                Some(Ok(n)) if *n == w.len => {
                    let end = w.end;
                    self.inflight.pop_front();
                    self.note_written(end);
                }
                _ => break,
            }
        }
    }

    /// `reap_written`, then a failed write at the front (already done) is
    /// reaped too: the appender is poisoned with its explained reason.
    async fn reap_done(&mut self) -> Result<()> {
        self.reap_written();
        if self
            .inflight
            .front()
            .is_some_and(|w| w.done.peek().is_some())
        {
            self.complete_oldest().await?;
        }
        Ok(())
    }

    fn note_written(&mut self, end: u64) {
        self.written = self.written.max(end.min(self.end()));
    }

    async fn completed(&mut self, end: u64, len: usize, outcome: WriteOutcome) -> Result<()> {
        match outcome {
            Ok(n) if n == len => {
                self.note_written(end);
                Ok(())
            }
            Ok(n) => {
                let why = self.why_short(end - len as u64 + n as u64).await;
                Err(self.fail("short write", format!("{n} of {len} bytes: {why}")))
            }
            Err(e) => Err(self.fail("write", e)),
        }
    }

    /// Why a write stopped short at `at`: a write of one block there gets the
    /// error the short write did not report (ENOSPC, EFBIG), so the operator
    /// reads the cause, not a byte count. Past the data, so harmless.
    async fn why_short(&self, at: u64) -> String {
        if at % self.align != 0 {
            return "stopped inside a block".to_string();
        }
        let mut probe = self.file.alloc_dma_buffer(self.align as usize);
        probe.as_bytes_mut().fill(0);
        match self.file.write_at(probe, at).await {
            Err(e) => std::io::Error::from(e).to_string(),
            Ok(_) => "a retry of the rest went through".to_string(),
        }
    }

    /// Writes everything appended so far (the partial chunk padded with zeros to a
    /// block) and waits for it: afterwards `written() == end()`. Not durable until
    /// `sync`.
    pub async fn write_out(&mut self) -> Result<()> {
        self.start_write_out().await?;
        while !self.inflight.is_empty() {
            self.complete_oldest().await?;
        }
        self.written = self.end();
        Ok(())
    }

    /// Submits the partly filled chunk (as `write_out` does) without waiting
    /// for any write, and returns every write in flight: once they all
    /// succeed, everything below `end()` as of now is written. A group commit
    /// awaits them and syncs outside the partition's lock, so appends go on
    /// meanwhile. Waits only to keep writes from overlapping or above
    /// `max_inflight_writes`.
    pub async fn start_write_out(&mut self) -> Result<Vec<PendingWrite>> {
        self.check()?;
        self.reap_done().await?;
        if self.buf_len > self.buf_written {
            if let Some(buf) = self.buf.take() {
                self.write_out_chunk(buf).await?;
            }
        }
        if self.inflight.is_empty() {
            self.written = self.end();
        }
        Ok(self.inflight.iter().cloned().collect())
    }

    /// `write_out`'s write: the chunk itself goes to the file (its partial
    /// last block padded with zeros), not a copy of it, and a one-block chunk
    /// starts with that partial block, which the next write rewrites. So a
    /// flush copies at most one block, however much was appended since the
    /// last one (group commit flushes every partition after every produce).
    async fn write_out_chunk(&mut self, mut buf: DmaBuffer) -> Result<()> {
        let stop = self.align_up(self.buf_len as u64) as usize;
        let tail = self.align_down(self.buf_len as u64) as usize;
        // The next chunk: the partial last block (if any), still to be filled.
        let next = (tail < self.buf_len).then(|| {
            let mut next = self.file.alloc_dma_buffer(self.align as usize);
            next.as_bytes_mut()[..self.buf_len - tail]
                .copy_from_slice(&buf.as_bytes()[tail..self.buf_len]);
            next
        });
        buf.as_bytes_mut()[self.buf_len..stop].fill(0);
        buf.trim_to_size(stop);
        self.submit(buf, self.buf_pos).await?;
        self.buf = next;
        self.buf_pos += tail as u64;
        self.buf_len -= tail;
        self.buf_written = self.buf_len;
        Ok(())
    }

    /// `write_out` then `fdatasync`: everything appended so far is durable.
    pub async fn flush(&mut self) -> Result<()> {
        self.write_out().await?;
        self.sync().await
    }

    /// `fdatasync` of the file alone (callers that did `write_out` under a lock and
    /// sync outside it use `file()` instead).
    pub async fn sync(&mut self) -> Result<()> {
        self.check()?;
        if let Err(e) = self.file.fdatasync().await {
            return Err(self.fail("fdatasync", e));
        }
        Ok(())
    }

    /// Marks the appender failed after an fdatasync done elsewhere failed.
    pub fn poison(&mut self, reason: &str) {
        self.failed.get_or_insert_with(|| reason.to_string());
    }

    /// Flushes, trims the preallocated space and syncs: the file now holds exactly
    /// its data. Used when the segment is rolled or closed.
    pub async fn finish(&mut self) -> Result<()> {
        self.write_out().await?;
        let end = self.end();
        if let Err(e) = self.file.truncate(end).await {
            return Err(self.fail("truncate", e));
        }
        self.preallocated = end;
        self.sync().await
    }

    /// Bytes of DMA memory the appender holds for appends (its chunk): at
    /// most one block once everything appended is written out.
    pub fn buffered_bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, DmaBuffer::len)
    }

    /// Cuts the file at `end` (which must be at or below the current end) and
    /// continues appending from there.
    pub async fn truncate(&mut self, end: u64) -> Result<()> {
        self.check()?;
        assert!(
            end <= self.end(),
            "truncate forward: {end} > {}",
            self.end()
        );
        while !self.inflight.is_empty() {
            self.complete_oldest().await?;
        }
        if let Err(e) = self.file.truncate(end).await {
            return Err(self.fail("truncate", e));
        }
        self.preallocated = end;
        self.buf = None;
        self.buf_pos = self.align_down(end);
        self.buf_len = 0;
        self.buf_written = 0;
        self.written = end;
        self.load_tail(end).await
    }

    /// Reads the block holding `end` into a fresh chunk so appends continue it.
    async fn load_tail(&mut self, end: u64) -> Result<()> {
        let block = self.align_down(end);
        let head = (end - block) as usize;
        if head == 0 {
            return Ok(());
        }
        let read = match self.file.read_at_aligned(block, self.align as usize).await {
            Ok(r) => r,
            Err(e) => return Err(self.fail("read", e)),
        };
        if read.len() < head {
            let got = read.len();
            return Err(self.fail("read", format!("tail block short: {got} < {head} bytes")));
        }
        // A one-block chunk, as after a write_out: the big writes start on
        // blocks nothing wrote yet.
        let mut buf = self.file.alloc_dma_buffer(self.align as usize);
        buf.as_bytes_mut()[..head].copy_from_slice(&read[..head]);
        self.buf = Some(buf);
        self.buf_pos = block;
        self.buf_len = head;
        self.buf_written = head;
        Ok(())
    }

    /// Reserves file space through `upto` and one reservation step past the
    /// space already reserved (not past `reserve_limit`), whichever is
    /// further; the next step doubles.
    async fn reserve(&mut self, upto: u64) -> Result<()> {
        if self.max_reserve_bytes == 0 || upto <= self.preallocated {
            return Ok(());
        }
        // A write already past the limit (one batch larger than a segment)
        // reserves whole steps again, not a block at a time.
        let limit = if upto > self.reserve_limit {
            u64::MAX
        } else {
            self.reserve_limit
        };
        let step_end = (self.preallocated + self.reserve_bytes).min(limit);
        let target = self.align_up(upto.max(step_end));
        if let Err(e) = self.file.pre_allocate(target, false).await {
            // Not every filesystem supports fallocate; writes extend the file anyway.
            tracing::debug!(path = %self.path.display(), error = %e, "preallocation unavailable");
            self.max_reserve_bytes = 0;
            return Ok(());
        }
        self.preallocated = target;
        self.reserve_bytes = (self.reserve_bytes * 2).min(self.max_reserve_bytes);
        Ok(())
    }

    /// The unit writes are aligned to (a partial last block is padded to it
    /// and rewritten by the next write).
    pub fn alignment(&self) -> u64 {
        self.align
    }

    fn align_down(&self, v: u64) -> u64 {
        v - v % self.align
    }

    fn align_up(&self, v: u64) -> u64 {
        v.div_ceil(self.align) * self.align
    }
}

/// The unit an appender aligns its writes to: the filesystem's block
/// (`st_blksize`, 4 KiB on ext4 and XFS) when the chunk size is a multiple of
/// it, else the device's O_DIRECT alignment (512 B on most disks). A direct
/// write that starts or ends inside a filesystem block of a preallocated
/// (unwritten) extent makes ext4 take the inode's lock exclusively and wait
/// for every write in flight, and io_uring hands such a write to a worker
/// thread: aligned to the sector only, every write after the first flush was
/// serialised that way.
async fn write_alignment(file: &DmaFile, max_chunk_bytes: usize) -> u64 {
    const MAX_FS_BLOCK: u64 = 64 * 1024;
    let dma = file.alignment().max(512);
    let fs_block = file
        .stat()
        .await
        .map_or(0, |s| u64::from(s.fs_cluster_size));
    if fs_block > dma
        && fs_block <= MAX_FS_BLOCK
        && fs_block.is_power_of_two()
        && max_chunk_bytes as u64 % fs_block == 0
    {
        fs_block
    } else {
        dma
    }
}
