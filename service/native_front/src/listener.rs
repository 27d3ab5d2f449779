//! What the acceptor needs of its listening socket that std does not offer: a wait for a
//! connection that another thread can end ([`Wake`]), and the socket filter that refuses new
//! connections before the listener closes ([`refuse_new_connections`]).
//!
//! Closing a listening socket resets every connection in its accept queue (handshake done, not
//! yet accepted). So the acceptor, once told to stop, first attaches the filter — the queue stops
//! growing — then accepts what is queued, and only then lets the socket close. A handshake under
//! way when the filter goes on still completes (only a SYN without ACK is dropped) and is taken
//! with the queue; a new client's SYN is dropped, and its retry (after about a second) finds the
//! port closed: *refused*, which a client or load balancer knows was never accepted. The Python
//! service attaches the filter some time before the drain ([`crate::ffi::bgf_refuse_new`]), so
//! such a handshake has time to complete; the same program guards its own port
//! (`REFUSE_SYN_FILTER` in `service/http_server.py`).
//!
//! Linux has the filter; other Unix systems wait with `poll` but have no filter; elsewhere the
//! wait is a 10 ms sleep (the acceptor checks its stop flag between waits).

use std::net::TcpListener;

/// One instruction of a classic BPF program (`struct sock_filter`).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// Run by the kernel on each segment the listening socket receives, the TCP header at offset 0;
/// returns how many bytes to keep (0 drops). Drops a SYN without ACK (a new connection), keeps
/// every other segment whole. Instruction for instruction `REFUSE_SYN_FILTER` of
/// `service/http_server.py` (`tests/service/test_native_front.py` compares the two).
#[cfg(target_os = "linux")]
const REFUSE_SYN_FILTER: [SockFilter; 5] = [
    op(0x30, 0, 0, 13),          // ldb [13]            A = the flags byte
    op(0x54, 0, 0, 0x12),        // and #0x12           A = its SYN and ACK bits
    op(0x15, 0, 1, 0x02),        // jeq #0x02, 0, 1     SYN without ACK: a new connection
    op(0x06, 0, 0, 0),           // ret #0              drop it
    op(0x06, 0, 0, 0xFFFF_FFFF), // ret #-1             keep anything else whole
];

/// One instruction, as `(code, jt, jf, k)`.
#[cfg(target_os = "linux")]
const fn op(code: u16, jt: u8, jf: u8, k: u32) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::{c_int, c_void};

    pub const SOL_SOCKET: c_int = 1;
    pub const SO_ATTACH_FILTER: c_int = 26;

    #[repr(C)]
    pub struct SockFprog {
        pub len: u16,
        pub filter: *const super::SockFilter,
    }

    extern "C" {
        pub fn setsockopt(fd: c_int, level: c_int, name: c_int, value: *const c_void, len: u32) -> c_int;
    }
}

/// Attach [`REFUSE_SYN_FILTER`] to `listener` (Linux): from now on a new connection's SYN is
/// dropped and nothing else is. False when it could not be attached (or not on Linux).
#[cfg(target_os = "linux")]
pub fn refuse_new_connections(listener: &TcpListener) -> bool {
    use std::os::fd::AsRawFd;
    let prog = sys::SockFprog {
        len: REFUSE_SYN_FILTER.len() as u16,
        filter: REFUSE_SYN_FILTER.as_ptr(),
    };
    // SAFETY: `prog` and the static program it points to outlive the call, which copies them;
    // the descriptor is the live listener's.
    let r = unsafe {
        sys::setsockopt(
            listener.as_raw_fd(),
            sys::SOL_SOCKET,
            sys::SO_ATTACH_FILTER,
            (&prog as *const sys::SockFprog).cast(),
            std::mem::size_of::<sys::SockFprog>() as u32,
        )
    };
    r == 0
}

/// No socket filter off Linux: false.
#[cfg(not(target_os = "linux"))]
pub fn refuse_new_connections(_listener: &TcpListener) -> bool {
    false
}

/// Ends the acceptor's wait from another thread: one end of a socket pair is written, the
/// acceptor polls the other beside its listener.
#[derive(Debug)]
pub struct Wake {
    #[cfg(unix)]
    rx: std::os::unix::net::UnixStream,
    #[cfg(unix)]
    tx: std::os::unix::net::UnixStream,
}

impl Wake {
    /// A new, unwoken pair.
    pub fn new() -> std::io::Result<Wake> {
        #[cfg(unix)]
        {
            let (rx, tx) = std::os::unix::net::UnixStream::pair()?;
            Ok(Wake { rx, tx })
        }
        #[cfg(not(unix))]
        Ok(Wake {})
    }

    /// End [`Wake::wait`]'s current and every later wait.
    pub fn wake(&self) {
        #[cfg(unix)]
        {
            use std::io::Write;
            let _ = (&self.tx).write(&[1]);
        }
    }

    /// Wait until `listener` may have a connection to accept (true) or [`Wake::wake`] was
    /// called (false). Off Unix: sleep 10 ms, true.
    pub fn wait(&self, listener: &TcpListener) -> bool {
        #[cfg(unix)]
        {
            use crate::peer::poll_sys::{poll, PollFd, POLLIN};
            use std::os::fd::AsRawFd;
            loop {
                let mut fds = [
                    PollFd {
                        fd: listener.as_raw_fd(),
                        events: POLLIN,
                        revents: 0,
                    },
                    PollFd {
                        fd: self.rx.as_raw_fd(),
                        events: POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfd structs; both descriptors are open for the call.
                let r = unsafe { poll(fds.as_mut_ptr(), 2, -1) };
                if r < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    return true; // let accept() report what is wrong
                }
                return fds[1].revents == 0;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = listener;
            std::thread::sleep(std::time::Duration::from_millis(10));
            true
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    fn accept_within(listener: &TcpListener, limit: Duration) -> Option<TcpStream> {
        listener.set_nonblocking(true).unwrap();
        let until = Instant::now() + limit;
        while Instant::now() < until {
            match listener.accept() {
                Ok((s, _)) => return Some(s),
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("{e}"),
            }
        }
        None
    }

    #[test]
    fn the_filter_drops_new_connections_and_keeps_the_queue() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut queued = TcpStream::connect(addr).unwrap();
        queued.write_all(b"queued").unwrap();
        assert!(refuse_new_connections(&l));
        assert!(refuse_new_connections(&l), "attaching again replaces the program");
        // a new connection's SYN is dropped: no answer at all (not refused, not accepted)
        let err = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        // the one queued before is accepted whole, and its later segments get through
        let mut s = accept_within(&l, Duration::from_secs(2)).expect("the queued connection");
        queued.write_all(b" and more").unwrap();
        let mut got = [0u8; 15];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"queued and more");
        s.write_all(b"ok").unwrap();
        let mut back = [0u8; 2];
        queued.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ok");
        assert!(accept_within(&l, Duration::from_millis(100)).is_none());
    }

    #[test]
    fn a_handshake_under_way_when_the_filter_goes_on_completes() {
        // TCP_DEFER_ACCEPT holds the handshake half-open (the client's final ACK is ignored)
        // until data arrives: the filter goes on in between. The client's data segment (ACK
        // set) must get through, complete the connection and queue it.
        extern "C" {
            fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
        }
        use std::os::fd::AsRawFd;
        const IPPROTO_TCP: i32 = 6;
        const TCP_DEFER_ACCEPT: i32 = 9;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let secs: i32 = 5;
        // SAFETY: a valid int option on the live listener.
        let r = unsafe {
            setsockopt(
                l.as_raw_fd(),
                IPPROTO_TCP,
                TCP_DEFER_ACCEPT,
                (&secs as *const i32).cast(),
                4,
            )
        };
        assert_eq!(r, 0);
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(
            accept_within(&l, Duration::from_millis(200)).is_none(),
            "held half-open"
        );
        assert!(refuse_new_connections(&l));
        client.write_all(b"hello").unwrap();
        let mut s = accept_within(&l, Duration::from_secs(3)).expect("completed and queued");
        let mut got = [0u8; 5];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
    }

    #[test]
    fn a_wait_ends_on_a_connection_or_a_wake() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let wake = Wake::new().unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(wake.wait(&l), "a connection is waiting");
        let (_s, _) = l.accept().unwrap();
        let w = std::sync::Arc::new(wake);
        let w2 = w.clone();
        let t0 = Instant::now();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            w2.wake();
        });
        assert!(!w.wait(&l), "woken, no connection");
        assert!(t0.elapsed() >= Duration::from_millis(90));
        waker.join().unwrap();
        assert!(!w.wait(&l), "stays woken");
    }
}
