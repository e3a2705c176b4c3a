//! Gathered socket writes: a response's parts (header bytes and the batch cache's
//! record `Bytes`) go to the kernel in one `sendmsg` without being copied into a
//! contiguous buffer first. glommio's TcpStream has no vectored write, so this
//! calls `sendmsg(2)` on its fd with MSG_DONTWAIT: it never blocks the executor;
//! when the socket buffer is full the caller falls back to glommio's own async
//! write, which waits for room.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use bytes::Bytes;

/// Most iovecs one call passes (Linux's UIO_MAXIOV is 1024).
pub const MAX_IOVECS: usize = 1024;

/// Sends as much of `parts[first..]` (the first one from byte `offset`) as the
/// socket takes right now. Returns the bytes sent; `Ok(0)` means the socket
/// buffer is full (EAGAIN).
pub fn send_now(fd: RawFd, parts: &[Bytes], first: usize, offset: usize) -> io::Result<usize> {
    let mut iovecs: Vec<libc::iovec> = Vec::with_capacity((parts.len() - first).min(MAX_IOVECS));
    for (i, part) in parts[first..].iter().enumerate().take(MAX_IOVECS) {
        let slice = if i == 0 { &part[offset..] } else { &part[..] };
        if slice.is_empty() {
            continue;
        }
        iovecs.push(libc::iovec {
            iov_base: slice.as_ptr() as *mut libc::c_void,
            iov_len: slice.len(),
        });
    }
    if iovecs.is_empty() {
        return Ok(0);
    }
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iovecs.as_mut_ptr();
    msg.msg_iovlen = iovecs.len() as _;
    loop {
        // SAFETY: every iovec points into a `Bytes` in `parts`, alive and unchanged
        // for the duration of the call; `msg` points at `iovecs`, which outlives it.
        // MSG_DONTWAIT keeps the call from blocking whatever the fd's flags are;
        // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}
