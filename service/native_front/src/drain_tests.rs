//! The drain's listener steps through the C ABI (ABI 3): `bgf_refuse_new` refuses new
//! connections while the queued ones are still accepted, and `bgf_drain` serves the accept
//! queue instead of resetting it when the listener closes.

use crate::ffi::*;
use crate::roundtrip_tests::{expected_body, fake_upstream, infer_request, next_batch, read_response, start};
use crate::roundtrip_v2_tests::{complete_ok, config, connect, finish, pending, server, stats, wait_until, BIN};
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

/// Index of `open_connections` in `bgf_stats`.
const OPEN: usize = 10;

fn read_all(c: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    c.read_to_end(&mut all).expect("answered and closed, not reset");
    all
}

/// The configuration edit that sets `first_request_grace_ms`.
fn grace_ms(ms: u64) -> (&'static str, String) {
    (
        "\"latency_buckets\"",
        format!("\"first_request_grace_ms\":{ms},\"latency_buckets\""),
    )
}

#[test]
fn the_drain_serves_the_connections_in_the_accept_queue() {
    let (upstream, seen, up_thread) = fake_upstream(1);
    let (from, to) = grace_ms(10_000);
    let h = start(&config(&upstream, &[(from, &to)]));
    let port = unsafe { bgf_port(h.0) };
    server(h).shared.hold_accepts.store(true, Ordering::SeqCst);
    // three handshakes the kernel completed, none accepted yet
    let mut fast = connect(port);
    fast.write_all(&infer_request(1, 0.5, BIN, "")).unwrap();
    let mut relayed = connect(port);
    relayed.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut late = connect(port); // sends its request only after the drain
    thread::sleep(Duration::from_millis(100));
    assert_eq!(stats(h)[OPEN], 0, "nothing accepted while held");

    let taken = unsafe { bgf_drain(h.0) };
    assert_eq!(taken, 3);
    assert_eq!(unsafe { bgf_drain(h.0) }, 0, "reported once");
    // the listener is closed: a new connection is refused, not queued
    let err = TcpStream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");

    wait_until("the fast request queued", || stats(h)[0] == 1);
    wait_until("the late connection waits for its request", || pending(h) == 2);
    late.write_all(&infer_request(1, 0.25, BIN, "")).unwrap();
    wait_until("the late request queued", || stats(h)[0] == 2);
    let mut images = vec![0f32; 64 * 4];
    let b = next_batch(h, &mut images, 64, 5000);
    assert_eq!((b.n, images[0], images[4]), (2, 0.5, 0.25));
    complete_ok(h, &b, &images);
    for (c, v) in [(&mut fast, 0.5), (&mut late, 0.25)] {
        let all = read_all(c);
        let r = read_response(&mut BufReader::new(&all[..]));
        assert_eq!(r.header("connection").as_deref(), Some("close"));
        assert_eq!(
            r.body,
            expected_body(1, v, 10, &["probabilities", "label", "score", "flagged"])
        );
    }
    let all = read_all(&mut relayed);
    assert!(
        all.starts_with(b"HTTP/1.1 418"),
        "relayed: {}",
        String::from_utf8_lossy(&all)
    );
    up_thread.join().unwrap();
    assert!(seen.lock().unwrap()[0].starts_with(b"GET /healthz HTTP/1.1\r\n"));
    wait_until("nothing pending", || pending(h) == 0);
    wait_until("no open connection", || stats(h)[OPEN] == 0);
    assert_eq!(stats(h)[6], 3, "three connections accepted");
    finish(h);
}

#[test]
fn a_connection_without_a_request_gets_the_grace_then_is_closed_as_idle() {
    let (from, to) = grace_ms(600);
    let h = start(&config("127.0.0.1:9", &[(from, &to)]));
    let port = unsafe { bgf_port(h.0) };
    let mut silent = connect(port);
    wait_until("accepted and waiting", || {
        server(h).shared.stats.awaiting_first.load(Ordering::SeqCst) == 1
    });
    assert_eq!(pending(h), 0, "not pending before the drain");
    let t0 = Instant::now();
    unsafe { bgf_drain(h.0) };
    assert_eq!(pending(h), 1);
    // not closed at once as an idle keep-alive connection is
    silent.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let e = silent.read(&mut [0u8; 1]).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{e}");
    assert_eq!(pending(h), 1);
    // … but once the grace is over
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(read_all(&mut silent), b"");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(590) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    wait_until("nothing pending", || pending(h) == 0);
    // a connection made after the grace would not wait either (none can be: the port is shut)
    assert!(server(h).shared.stats.awaiting_first.load(Ordering::SeqCst) == 0);
    finish(h);
}

#[cfg(target_os = "linux")]
#[test]
fn refusing_new_connections_keeps_accepting_the_queued_ones() {
    let (upstream, _seen, up_thread) = fake_upstream(1);
    let h = start(&config(&upstream, &[]));
    let port = unsafe { bgf_port(h.0) };
    server(h).shared.hold_accepts.store(true, Ordering::SeqCst);
    let mut queued = connect(port);
    queued
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(unsafe { bgf_refuse_new(h.0) }, 1);
    assert_eq!(unsafe { bgf_refuse_new(h.0) }, 1, "idempotent");
    // a new connection's SYN is dropped: it is neither accepted nor refused
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let err = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    server(h).shared.hold_accepts.store(false, Ordering::SeqCst);
    let all = read_all(&mut queued);
    assert!(
        all.starts_with(b"HTTP/1.1 418"),
        "relayed: {}",
        String::from_utf8_lossy(&all)
    );
    up_thread.join().unwrap();
    assert_eq!(unsafe { bgf_drain(h.0) }, 0, "the queue was already taken");
    assert_eq!(unsafe { bgf_refuse_new(h.0) }, 0, "the listener is closed");
    assert_eq!(unsafe { bgf_refuse_new(std::ptr::null_mut()) }, 0);
    finish(h);
}

#[cfg(target_os = "linux")]
#[test]
fn the_closing_acceptor_refuses_new_connections_before_its_last_accept() {
    // without bgf_refuse_new first (SIGINT, no drain delay): the acceptor attaches the filter
    // itself, so a client connecting between its last accept and the close is never accepted
    // (dropped SYN, then refused), not queued to be reset
    let h = start(&config("127.0.0.1:9", &[]));
    let port = unsafe { bgf_port(h.0) };
    *server(h).shared.pause_before_last_accept.lock().unwrap() = Duration::from_millis(600);
    let drain = thread::spawn(move || {
        let h = h; // the whole handle (Send), not its raw field
        unsafe { bgf_drain(h.0) }
    });
    thread::sleep(Duration::from_millis(150)); // the acceptor is in its pause
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let err = TcpStream::connect_timeout(&addr, Duration::from_millis(250)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert_eq!(drain.join().unwrap(), 0, "nothing was queued");
    finish(h);
}

#[test]
fn the_last_pass_over_the_queue_retries_an_accept_failing_for_want_of_descriptors() {
    // what the last pass leaves is reset with the listener: out of descriptors for a moment
    // (three failed accepts, 10 ms apart) must not cost the queue
    let (from, to) = grace_ms(10_000);
    let h = start(&config("127.0.0.1:9", &[(from, &to)]));
    let port = unsafe { bgf_port(h.0) };
    server(h).shared.hold_accepts.store(true, Ordering::SeqCst);
    let mut queued: Vec<TcpStream> = (0..2).map(|_| connect(port)).collect();
    for c in &mut queued {
        c.write_all(&infer_request(1, 0.5, BIN, "")).unwrap();
    }
    thread::sleep(Duration::from_millis(50));
    server(h).shared.fail_accepts.store(3, Ordering::SeqCst);
    assert_eq!(unsafe { bgf_drain(h.0) }, 2);
    assert_eq!(
        server(h).shared.fail_accepts.load(Ordering::SeqCst),
        0,
        "the failures came"
    );
    wait_until("both queued", || stats(h)[0] == 2);
    let mut images = vec![0f32; 64 * 4];
    let b = next_batch(h, &mut images, 64, 5000);
    assert_eq!(b.n, 2);
    complete_ok(h, &b, &images);
    for c in &mut queued {
        let all = read_all(c);
        assert!(all.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&all));
    }
    finish(h);
}
