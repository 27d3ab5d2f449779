//! Socket checks that std does not offer: has the client closed its side, has it sent bytes not
//! read yet, and a wait for a client's bytes that ends when another connection's peer closes.
//! Linux only (`recv` with `MSG_PEEK | MSG_DONTWAIT`, `poll` with `POLLRDHUP`, declared here —
//! std links libc); elsewhere a client is taken as present and as having sent nothing, and the
//! wait is left to the blocking read.

use std::time::Duration;

/// A connection's raw descriptor (-1 where there is none).
pub type Fd = i32;

/// The raw descriptor of a stream.
pub fn fd_of(stream: &std::net::TcpStream) -> Fd {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        stream.as_raw_fd()
    }
    #[cfg(not(unix))]
    {
        let _ = stream;
        -1
    }
}

/// What a non-blocking one-byte peek says about a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// The client closed its side (or reset the connection).
    Closed,
    /// Bytes are waiting (pipelined data).
    Data,
    /// Open, nothing waiting (or unknown).
    Quiet,
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::{c_int, c_void};

    pub const MSG_PEEK: c_int = 2;
    pub const MSG_DONTWAIT: c_int = 0x40;
    pub const ECONNRESET: i32 = 104;

    extern "C" {
        pub fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    }
}

#[cfg(unix)]
pub(crate) mod poll_sys {
    use std::ffi::{c_int, c_short};

    /// `nfds_t`: unsigned long on Linux, unsigned int on the BSDs and macOS.
    #[cfg(target_os = "linux")]
    pub type Nfds = std::ffi::c_ulong;
    #[cfg(not(target_os = "linux"))]
    pub type Nfds = std::ffi::c_uint;

    pub const POLLIN: c_short = 0x001;
    /// The peer closed its sending side (Linux).
    #[cfg(target_os = "linux")]
    pub const POLLRDHUP: c_short = 0x2000;

    #[repr(C)]
    pub struct PollFd {
        pub fd: c_int,
        pub events: c_short,
        pub revents: c_short,
    }

    extern "C" {
        pub fn poll(fds: *mut PollFd, nfds: Nfds, timeout: c_int) -> c_int;
    }
}

/// Peek at `fd` without blocking or consuming anything.
#[cfg(target_os = "linux")]
pub fn peek(fd: Fd) -> Peek {
    if fd < 0 {
        return Peek::Quiet;
    }
    let mut byte = 0u8;
    // SAFETY: one writable byte; the descriptor is owned by a live connection thread (see the
    // callers); MSG_PEEK leaves the data in place.
    let r = unsafe { sys::recv(fd, (&mut byte as *mut u8).cast(), 1, sys::MSG_PEEK | sys::MSG_DONTWAIT) };
    match r {
        0 => Peek::Closed,
        n if n > 0 => Peek::Data,
        _ => match std::io::Error::last_os_error().raw_os_error() {
            Some(sys::ECONNRESET) => Peek::Closed,
            _ => Peek::Quiet, // EAGAIN / EWOULDBLOCK: open and quiet
        },
    }
}

/// Peek at `fd` (not Linux: always [`Peek::Quiet`]).
#[cfg(not(target_os = "linux"))]
pub fn peek(_fd: Fd) -> Peek {
    Peek::Quiet
}

/// True when the client has closed its side of the connection.
pub fn client_gone(fd: Fd) -> bool {
    peek(fd) == Peek::Closed
}

/// What [`wait_readable`] saw first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The descriptor waited on can be read without blocking (bytes, its end, or an error).
    Readable,
    /// The watched connection's peer closed its side (or reset it).
    WatchedClosed,
    /// Neither within the timeout.
    TimedOut,
}

/// Wait until `fd` can be read without blocking, or until the peer of the connection `watched`
/// has closed its sending side (`POLLRDHUP`) or reset it, at most `timeout` (None: no bound).
/// The watched side wins when both are so. A relay waits so for its client's body beside its
/// upstream connection. Off Linux: [`Ready::Readable`] at once (the caller's blocking read
/// waits, under the socket's own timeout; `watched` is not watched).
#[cfg(target_os = "linux")]
pub fn wait_readable(fd: Fd, watched: Fd, timeout: Option<Duration>) -> Ready {
    use poll_sys::{poll, PollFd, POLLIN, POLLRDHUP};
    use std::time::Instant;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        // milliseconds rounded up: a wait cut short by rounding would spin
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
            }
        };
        let mut fds = [
            PollFd {
                fd,
                events: POLLIN,
                revents: 0,
            },
            PollFd {
                fd: watched,
                events: POLLRDHUP,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd structs; the caller keeps both descriptors open for the call
        // (a negative one is ignored by poll).
        let r = unsafe { poll(fds.as_mut_ptr(), 2, ms) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Ready::Readable; // let the read report what is wrong
        }
        // POLLRDHUP, or what poll always reports: POLLHUP / POLLERR (a reset), POLLNVAL
        if fds[1].revents != 0 {
            return Ready::WatchedClosed;
        }
        if fds[0].revents != 0 {
            return Ready::Readable;
        }
        if r == 0 {
            return Ready::TimedOut;
        }
    }
}

/// Not Linux: [`Ready::Readable`] at once.
#[cfg(not(target_os = "linux"))]
pub fn wait_readable(_fd: Fd, _watched: Fd, _timeout: Option<Duration>) -> Ready {
    Ready::Readable
}

/// `shutdown(fd, SHUT_RD)` without taking ownership of the descriptor: a thread blocked reading
/// it returns at once (0 bytes when nothing is waiting).
pub fn shutdown_read(fd: Fd) {
    #[cfg(unix)]
    if fd >= 0 {
        use std::mem::ManuallyDrop;
        use std::os::fd::FromRawFd;
        // SAFETY: the descriptor is open (the caller holds the registry entry that keeps it
        // so); ManuallyDrop never closes it.
        let s = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        let _ = s.shutdown(std::net::Shutdown::Read);
    }
    #[cfg(not(unix))]
    let _ = fd;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn wait_for(fd: Fd, want: Peek) {
        let until = Instant::now() + Duration::from_secs(5);
        while peek(fd) != want {
            assert!(Instant::now() < until, "never {want:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn peeks_tell_quiet_data_and_closed() {
        let (mut c, mut s) = pair();
        let fd = fd_of(&s);
        assert_eq!(peek(fd), Peek::Quiet);
        assert!(!client_gone(fd));
        c.write_all(b"x").unwrap();
        wait_for(fd, Peek::Data);
        assert!(!client_gone(fd));
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap(); // the peek left the byte in place
        assert_eq!(&b, b"x");
        c.shutdown(Shutdown::Write).unwrap();
        wait_for(fd, Peek::Closed);
        assert!(client_gone(fd));
        assert_eq!(peek(-1), Peek::Quiet);
    }

    #[test]
    fn a_wait_ends_on_bytes_on_the_watched_peer_s_close_or_the_timeout() {
        let (mut c, s) = pair();
        let (mut w_peer, w) = pair();
        let t0 = Instant::now();
        let wait = |ms| wait_readable(fd_of(&s), fd_of(&w), Some(Duration::from_millis(ms)));
        assert_eq!(wait(100), Ready::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        w_peer.write_all(b"answer").unwrap(); // bytes from the watched peer are not its close
        assert_eq!(wait(100), Ready::TimedOut);
        c.write_all(b"x").unwrap();
        assert_eq!(wait(5000), Ready::Readable);
        w_peer.shutdown(Shutdown::Write).unwrap();
        assert_eq!(wait(5000), Ready::WatchedClosed, "the watched side wins");
        let (_c2, s2) = pair();
        drop(w_peer);
        assert_eq!(
            wait_readable(fd_of(&s2), fd_of(&w), None),
            Ready::WatchedClosed,
            "unbounded: ends at the close"
        );
    }

    #[test]
    fn shutdown_read_wakes_a_blocked_reader() {
        let (_c, mut s) = pair();
        let fd = fd_of(&s);
        let t = std::thread::spawn(move || {
            let mut b = [0u8; 8];
            s.read(&mut b).unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        shutdown_read(fd);
        assert_eq!(t.join().unwrap(), 0);
    }
}
