//! Whether a TCP connection is stuck behind backed-off retransmissions.
//!
//! After a network cut heals, a connection that carried data during the cut
//! stays silent until its retransmission timer, doubled at every timeout of
//! the cut, runs out: seconds, while a new connection would work at once. A
//! sender of small one-way messages (Raft's) never notices by itself: its
//! writes land in the socket buffer and succeed. It asks the kernel instead:
//! data unacknowledged through `STALL_BACKOFFS` retransmission timeouts (the
//! minimum timeout is 200 ms: at least 1.4 s) means give the connection up.

#![allow(unsafe_code)]

use std::os::fd::RawFd;

/// Retransmission timeouts in a row without an acknowledgement.
pub const STALL_BACKOFFS: u8 = 3;

/// True when the kernel reports data on `fd` unacknowledged through at least
/// `STALL_BACKOFFS` backed-off retransmission timeouts. False when it cannot
/// tell (not a TCP socket, an error): the caller's other timeouts still apply.
pub fn stalled(fd: RawFd) -> bool {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes, the size of `info`, into
    // it; a zeroed tcp_info (plain integers) is a valid value to start from.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return false;
    }
    // SAFETY: zero-initialised above and possibly filled by the kernel.
    let info = unsafe { info.assume_init() };
    info.tcpi_backoff >= STALL_BACKOFFS && info.tcpi_unacked > 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_healthy_connection_is_not_stalled_and_a_non_socket_cannot_tell() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_s, _) = listener.accept().unwrap();
        c.write_all(b"hello").unwrap();
        assert!(!stalled(c.as_raw_fd()));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(!stalled(file.as_raw_fd()));
    }
}
