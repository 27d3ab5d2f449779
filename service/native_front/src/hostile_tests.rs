//! Loopback tests of requests the main port answers at once, which the native port must not
//! hold for its read timeout: a relayed request whose body never comes once the service has
//! answered it, bytes that cannot begin an HTTP request, a head still arriving past the main
//! port's head limit; and a fast-path request with a repeated `Content-Length`, which the main
//! port refuses. The read timeout is long here (20 s): a test that waits for it fails its
//! time bound.

use crate::roundtrip_tests::{fake_upstream, infer_request, start};
use crate::roundtrip_v2_tests::{config, finish};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// The test configuration with a 20 s read timeout and `extra` keys; returns (handle, port).
fn start_front(upstream: &str, extra: &str) -> (crate::roundtrip_tests::H, u16) {
    let keys = format!("\"pid\":4242,\"read_timeout_ms\":20000{extra}");
    let h = start(&config(upstream, &[("\"pid\":4242", &keys)]));
    let port = unsafe { crate::ffi::bgf_port(h.0) };
    (h, port)
}

/// Write `bytes` on a new connection, then read until the front end closes it: what came
/// back, and how long the close took.
fn exchange(port: u16, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let began = Instant::now();
    c.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got); // a reset after the answer still leaves the answer read
    (got, began.elapsed())
}

/// An upstream that reads one request's head, answers 413 with `connection: close` at once
/// without reading a body, then half-closes and keeps reading until its peer closes (uvicorn's
/// lingering close). Returns its address and the thread (yielding what it read).
fn early_answering_upstream() -> (String, thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let t = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            req.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 413 Request Entity Too Large\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
        req
    });
    (addr, t)
}

#[test]
fn a_relay_ends_when_the_service_has_answered_and_closed() {
    // The service answers a 9 MB body's head with 413 before the body (which never comes) and
    // closes its side. The relay used to keep waiting for that body until the read timeout,
    // holding the answered connection open (and a request pipelined behind it unanswered);
    // now it stops uploading, and the client gets the 413 and the end of the stream at once.
    let (upstream, up_thread) = early_answering_upstream();
    let (h, port) = start_front(&upstream, "");
    let head = b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Length: 9000000\r\n\r\n";
    let mut request = head.to_vec();
    request.extend_from_slice(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n"); // body bytes, in fact
    let (got, took) = exchange(port, &request);
    assert_eq!(
        got,
        b"HTTP/1.1 413 Request Entity Too Large\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    let seen = up_thread.join().unwrap();
    assert!(seen.starts_with(b"POST /v1/predict HTTP/1.1\r\n"));
    finish(h);
}

#[test]
fn bytes_that_cannot_begin_a_request_are_answered_400_at_once() {
    // The main port (httptools) answers each of these 400 as soon as it reads them; the native
    // port used to wait for a whole head (CRLF CRLF) and close after the read timeout unanswered.
    let (h, port) = start_front("127.0.0.1:9", "");
    let client_hello: &[u8] = &[0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03];
    for bytes in [
        client_hello,               // TLS: a handshake record
        b"GARBAGE-NO-NEWLINE",      // a "method" longer than any method there is
        b"SSH-2.0-OpenSSH_9.6\r\n", // an SSH banner
        b"GET\t/ HTTP/1.1",         // not a token and a space
        b" GET / HTTP/1.1",
        b"\x00\x00\x00\x00",
        b"\r\x00",
    ] {
        let (got, took) = exchange(port, bytes);
        assert!(
            got.starts_with(b"HTTP/1.1 400 Bad Request\r\n"),
            "{bytes:?}: {}",
            String::from_utf8_lossy(&got)
        );
        assert!(took < Duration::from_secs(5), "{bytes:?}: closed after {took:?}");
    }
    // what may still become a request is waited for: a method of the longest registered length
    // (UPDATEREDIRECTREF), a blank line's CR, a request line under way
    for bytes in [&b"UPDATEREDIRECTREF"[..], b"\r", b"POST /v2/models/m/infer HTT"] {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(bytes).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut got = [0u8; 16];
        let e = c.read(&mut got).unwrap_err();
        assert!(
            matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "{bytes:?}"
        );
    }
    finish(h);
}

#[test]
fn a_head_still_arriving_past_the_main_port_s_limit_is_431_at_once() {
    // max_header_bytes (the main port's BAYESGATE_MAX_HEADER_BYTES) bounds a head still on its
    // way, as the main port bounds it; it used to be bounded only by the native 64 KiB.
    let (h, port) = start_front("127.0.0.1:9", ",\"max_header_bytes\":4096");
    let mut line = b"GET /".to_vec();
    line.extend(vec![b'a'; 5000]);
    let (got, took) = exchange(port, &line);
    assert!(
        got.starts_with(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    finish(h);
}

#[test]
fn a_repeated_content_length_is_the_service_s_to_judge() {
    // httptools answers 400 "Duplicate Content-Length" even for equal values (h11 takes them):
    // such a request is relayed, never answered 200 natively.
    let (upstream, seen, up_thread) = fake_upstream(1);
    let (h, port) = start_front(&upstream, "");
    let request = infer_request(1, 0.5, r#","parameters":{"binary_data_output":true}"#, "");
    let text = String::from_utf8_lossy(&request).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("Content-Length:"))
        .unwrap()
        .to_string();
    let at = text.find(&format!("\r\n{line}\r\n")).unwrap() + line.len() + 4;
    let mut twice = request[..at].to_vec();
    twice.extend_from_slice(format!("{line}\r\n").as_bytes());
    twice.extend_from_slice(&request[at..]);
    let (got, _) = exchange(port, &twice);
    assert!(
        got.starts_with(b"HTTP/1.1 418 I'm a teapot\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    up_thread.join().unwrap();
    let forwarded = String::from_utf8_lossy(&seen.lock().unwrap()[0]).into_owned();
    assert_eq!(forwarded.matches(&format!("\n{line}\r")).count(), 2, "{forwarded}");
    finish(h);
}
