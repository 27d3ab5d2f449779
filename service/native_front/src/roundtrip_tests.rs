//! Loopback round trips through the C ABI: a fake Python batch thread calls `bgf_next_batch`
//! / `bgf_complete`, a fake upstream thread plays the Python HTTP service.

use crate::config::tests::test_config_text;
use crate::fast_path::tests::header_json;
use crate::ffi::*;
use std::ffi::c_void;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A handle that may cross threads in tests.
#[derive(Clone, Copy)]
pub(crate) struct H(pub(crate) *mut c_void);
unsafe impl Send for H {}
unsafe impl Sync for H {}

pub(crate) fn start(config: &str) -> H {
    let mut err = [0u8; 256];
    let h = unsafe { bgf_start(config.as_ptr().cast(), config.len(), err.as_mut_ptr().cast(), err.len()) };
    assert!(!h.is_null(), "{}", String::from_utf8_lossy(&err));
    H(h)
}

/// What `bgf_next_batch` gave.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Batch {
    pub n: usize,
    pub id: u64,
    pub k: u32,
    pub seed: i64,
    pub generation: u64,
    pub requests: u32,
}

pub(crate) fn next_batch(h: H, images: &mut [f32], capacity: usize, timeout_ms: u32) -> Batch {
    let mut b = Batch::default();
    b.n = unsafe {
        bgf_next_batch(
            h.0,
            images.as_mut_ptr(),
            capacity,
            timeout_ms,
            &mut b.id,
            &mut b.k,
            &mut b.seed,
            &mut b.generation,
            &mut b.requests,
        )
    };
    b
}

pub(crate) const PREFIX_START: &str = r#"{"model_name":"m","parameters":{"mc_samples":"#;

/// Fake Python: each image's outputs derive from its first pixel v:
/// probabilities [v, v+1, v+2] (FP32), label (v*100) as INT64, score v*2 (FP64), flagged v > 0.5.
pub(crate) fn fake_python(
    h: H,
    stop: Arc<AtomicBool>,
    batches: Arc<Mutex<Vec<(usize, u32, i64)>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let h = h; // capture the whole Send wrapper, not its raw field
        let mut images = vec![0f32; 64 * 4];
        while !stop.load(Ordering::SeqCst) {
            let (mut id, mut k, mut seed, mut generation, mut requests) = (0u64, 0u32, 0i64, 0u64, 0u32);
            let n = unsafe {
                bgf_next_batch(
                    h.0,
                    images.as_mut_ptr(),
                    64,
                    50,
                    &mut id,
                    &mut k,
                    &mut seed,
                    &mut generation,
                    &mut requests,
                )
            };
            if n == 0 {
                continue;
            }
            batches.lock().unwrap().push((n, k, seed));
            let (prefix, data) = python_outputs(&images, n, k);
            let rc = unsafe { bgf_complete(h.0, id, 200, prefix.as_ptr(), prefix.len(), data.as_ptr(), data.len()) };
            assert_eq!(rc, 0);
        }
    })
}

/// The fake Python's answer for a batch of `n` images of 4 floats (generation 0's table).
pub(crate) fn python_outputs(images: &[f32], n: usize, k: u32) -> (String, Vec<u8>) {
    let firsts: Vec<f32> = (0..n).map(|i| images[i * 4]).collect();
    let mut data = Vec::new();
    for v in &firsts {
        for j in 0..3 {
            data.extend_from_slice(&(v + j as f32).to_le_bytes());
        }
    }
    for v in &firsts {
        data.extend_from_slice(&((v * 100.0) as i64).to_le_bytes());
    }
    for v in &firsts {
        data.extend_from_slice(&((*v as f64) * 2.0).to_le_bytes());
    }
    for v in &firsts {
        data.push((*v > 0.5) as u8);
    }
    (format!("{PREFIX_START}{k}}},\"outputs\":["), data)
}

pub(crate) fn infer_request(n: usize, value: f32, rest: &str, extra_head: &str) -> Vec<u8> {
    let header = header_json(n, rest);
    let mut body = header.as_bytes().to_vec();
    for _ in 0..n * 4 {
        body.extend_from_slice(&value.to_le_bytes());
    }
    let mut req = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: {}\r\nContent-Length: {}\r\n{extra_head}\r\n",
        header.len(),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    req
}

pub(crate) struct Response {
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

pub(crate) fn read_response<R: BufRead>(r: &mut R) -> Response {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "EOF in head");
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut resp = Response { head, body: Vec::new() };
    let len: usize = resp.header("content-length").unwrap().parse().unwrap();
    resp.body = vec![0; len];
    r.read_exact(&mut resp.body).unwrap();
    resp
}

pub(crate) fn expected_body(n: usize, v: f32, k: u32, outputs: &[&str]) -> Vec<u8> {
    let mut header = format!("{PREFIX_START}{k}}},\"outputs\":[");
    let mut bin = Vec::new();
    for (i, name) in outputs.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        let (entry, bytes): (String, Vec<u8>) = match *name {
            "probabilities" => (
                format!(
                    r#"{{"name":"probabilities","datatype":"FP32","shape":[{n},3],"parameters":{{"binary_data_size":{}}}}}"#,
                    n * 12
                ),
                (0..n)
                    .flat_map(|_| (0..3).flat_map(move |j| (v + j as f32).to_le_bytes()))
                    .collect(),
            ),
            "label" => (
                format!(
                    r#"{{"name":"label","datatype":"INT64","shape":[{n}],"parameters":{{"binary_data_size":{}}}}}"#,
                    n * 8
                ),
                (0..n).flat_map(|_| ((v * 100.0) as i64).to_le_bytes()).collect(),
            ),
            "score" => (
                format!(
                    r#"{{"name":"score","datatype":"FP64","shape":[{n}],"parameters":{{"binary_data_size":{}}}}}"#,
                    n * 8
                ),
                (0..n).flat_map(|_| ((v as f64) * 2.0).to_le_bytes()).collect(),
            ),
            "flagged" => (
                format!(
                    r#"{{"name":"flagged","datatype":"BOOL","shape":[{n}],"parameters":{{"binary_data_size":{n}}}}}"#
                ),
                vec![(v > 0.5) as u8; n],
            ),
            _ => unreachable!(),
        };
        header.push_str(&entry);
        bin.extend(bytes);
    }
    header.push_str("]}");
    let mut body = header.into_bytes();
    body.extend(bin);
    body
}

/// A fake upstream answering `count` connections with a fixed response; records requests.
/// Requests the fake upstream saw, in order.
pub(crate) type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

pub(crate) fn fake_upstream(count: usize) -> (String, Seen, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let t = thread::spawn(move || {
        for _ in 0..count {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // read until the request is complete: head, then a Content-Length body or a chunked end
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let head = &text[..end].to_ascii_lowercase();
                    if head.contains("transfer-encoding: chunked") {
                        if text[end + 4..].contains("0\r\n\r\n") {
                            break;
                        }
                    } else {
                        let cl = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse::<usize>().unwrap())
                            .unwrap_or(0);
                        if req.len() >= end + 4 + cl {
                            break;
                        }
                    }
                }
                if n == 0 {
                    break;
                }
            }
            seen2.lock().unwrap().push(req);
            s.write_all(b"HTTP/1.1 418 I'm a teapot\r\ncontent-type: application/json\r\ncontent-length: 17\r\nx-up: 1\r\n\r\n{\"error\":\"tea!\"}\n").unwrap();
        }
    });
    (addr, seen, t)
}

#[test]
fn fast_path_pipelined_and_relay() {
    let (upstream, seen, up_thread) = fake_upstream(3);
    let h = start(&test_config_text(0, &upstream));
    let port = unsafe { bgf_port(h.0) };
    assert_ne!(port, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(Mutex::new(Vec::new()));
    let py = fake_python(h, stop.clone(), batches.clone());

    // two pipelined fast requests in one write
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut both = infer_request(
        1,
        0.25,
        r#","parameters":{"binary_data_output":true}"#,
        "X-Request-ID: my-id.1\r\n",
    );
    both.extend(infer_request(
        3,
        0.75,
        r#","outputs":[{"name":"flagged"},{"name":"probabilities","parameters":{"binary_data":true}}],"parameters":{"binary_data_output":true,"mc_samples":7}"#,
        "",
    ));
    c.write_all(&both).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let a = read_response(&mut r);
    let b = read_response(&mut r);
    assert!(a.head.starts_with("HTTP/1.1 200 OK\r\n"), "{}", a.head);
    assert_eq!(a.header("content-type").unwrap(), "application/octet-stream");
    assert_eq!(a.header("x-request-id").unwrap(), "my-id.1");
    let exp_a = expected_body(1, 0.25, 10, &["probabilities", "label", "score", "flagged"]);
    assert_eq!(a.body, exp_a);
    let hl: usize = a.header("inference-header-content-length").unwrap().parse().unwrap();
    assert_eq!(hl, exp_a.len() - (12 + 8 + 8 + 1));
    assert!(b.head.starts_with("HTTP/1.1 200 OK\r\n"));
    let id = b.header("x-request-id").unwrap();
    assert!(id.len() == 32 && id.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(b.body, expected_body(3, 0.75, 7, &["flagged", "probabilities"]));
    assert!(a.header("connection").is_none());

    // the same connection stays usable; Connection: close is honoured
    c.write_all(&infer_request(
        2,
        1.0,
        r#","parameters":{"binary_data_output":true,"seed":42}"#,
        "Connection: close\r\n",
    ))
    .unwrap();
    let d = read_response(&mut r);
    assert_eq!(d.header("connection").as_deref(), Some("close"));
    assert_eq!(
        d.body,
        expected_body(2, 1.0, 10, &["probabilities", "label", "score", "flagged"])
    );
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(batches.lock().unwrap().contains(&(2, 10, 42)));

    // relayed: another route, on a keep-alive connection with a pipelined request behind it
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let peer0 = c.local_addr().unwrap().to_string();
    c.write_all(
        b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: keep-alive\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
    )
    .unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"HTTP/1.1 418 I'm a teapot\r\ncontent-type: application/json\r\ncontent-length: 17\r\nx-up: 1\r\n\r\n{\"error\":\"tea!\"}\n");

    // relayed: an infer that wants a JSON answer (rule 8), body forwarded unchanged
    let req = infer_request(1, 0.5, "", "");
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let peer1 = c.local_addr().unwrap().to_string();
    c.write_all(&req).unwrap();
    let mut got2 = Vec::new();
    c.read_to_end(&mut got2).unwrap();
    assert_eq!(got2, got);

    // relayed: a chunked body, read to its end and forwarded raw
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let peer2 = c.local_addr().unwrap().to_string();
    c.write_all(b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .unwrap();
    let mut got3 = Vec::new();
    c.read_to_end(&mut got3).unwrap();
    assert_eq!(got3, got);

    up_thread.join().unwrap();
    let seen = seen.lock().unwrap();
    // the client's own X-Forwarded-For is dropped: the upstream is told the peer's address
    assert_eq!(
        String::from_utf8_lossy(&seen[0]),
        format!("GET /v2/health/ready HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: {peer0}\r\nConnection: close\r\n\r\n")
    );
    let (head1, body1) = req.split_at(req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4);
    let mut fwd = head1[..head1.len() - 2].to_vec();
    fwd.extend_from_slice(format!("X-Forwarded-For: {peer1}\r\nConnection: close\r\n\r\n").as_bytes());
    fwd.extend_from_slice(body1);
    assert_eq!(seen[1], fwd);
    assert_eq!(
        String::from_utf8_lossy(&seen[2]),
        format!("POST /v1/predict HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: {peer2}\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    );

    // malformed and oversized heads are answered natively
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"NOT HTTP\r\n\r\n").unwrap();
    let mut got4 = Vec::new();
    c.read_to_end(&mut got4).unwrap();
    assert!(got4.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    big.extend(vec![b'a'; 70 * 1024]);
    let _ = c.write_all(&big);
    let mut got5 = Vec::new();
    let _ = c.read_to_end(&mut got5);
    assert!(
        got5.starts_with(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{}",
        String::from_utf8_lossy(&got5)
    );
    assert!(got5.ends_with(b"{\"error\":\"request head too large\"}"));

    let mut stats = [0u64; 8];
    unsafe { bgf_stats(h.0, stats.as_mut_ptr(), 8) };
    // fast_requests, fast_images, relayed, 503, 504, batches, connections, 400s
    assert_eq!(stats[0], 3);
    assert_eq!(stats[1], 6);
    assert_eq!(stats[2], 3);
    assert_eq!(&stats[3..5], &[0, 0]);
    assert!(stats[5] >= 2);
    assert_eq!(stats[6], 6);
    assert_eq!(stats[7], 2);

    stop.store(true, Ordering::SeqCst);
    py.join().unwrap();
    unsafe {
        bgf_stop(h.0);
        bgf_stop(h.0); // twice is fine
        bgf_free(h.0);
    }
}

#[test]
fn timeout_queue_full_and_stop() {
    let cfg = test_config_text(0, "127.0.0.1:9").replace("\"request_timeout_ms\":2000", "\"request_timeout_ms\":1000");
    let h = start(&cfg);
    let port = unsafe { bgf_port(h.0) };
    let bin = r#","parameters":{"binary_data_output":true}"#;

    // nobody takes batches: 504 after the deadline, connection kept
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    c.write_all(&infer_request(1, 0.5, bin, "")).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let a = read_response(&mut r);
    assert!(t0.elapsed() >= Duration::from_millis(990));
    assert!(a.head.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"), "{}", a.head);
    assert_eq!(a.header("content-type").unwrap(), "application/json");
    assert_eq!(a.body, b"{\"error\":\"timed out\"}");

    // the abandoned job is dropped by next_batch, not handed to Python
    let mut images = vec![0f32; 64 * 4];
    let n = next_batch(h, &mut images, 64, 10).n;
    assert_eq!(n, 0);

    // queue limit 20 images, max_instances 8: fill with 8+8, then 8 more → 503
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let mut w = TcpStream::connect(("127.0.0.1", port)).unwrap();
        w.write_all(&infer_request(8, 0.5, bin, "")).unwrap();
        waiting.push(w);
        thread::sleep(Duration::from_millis(50)); // queue order = waiting order
    }
    thread::sleep(Duration::from_millis(100));
    c.write_all(&infer_request(8, 0.5, bin, "")).unwrap();
    let full = read_response(&mut r);
    assert!(full.head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    assert_eq!(full.header("retry-after").as_deref(), Some("1"));
    assert_eq!(full.body, b"{\"error\":\"queue full\"}");

    // a batch in flight when the completion carries an error status
    let b = next_batch(h, &mut images, 64, 100);
    assert_eq!(b.n, 8);
    assert_eq!((b.generation, b.requests), (0, 1));
    let id = b.id;
    let err = b"{\"error\":\"model exploded\"}";
    assert_eq!(
        unsafe { bgf_complete(h.0, id, 500, err.as_ptr(), err.len(), std::ptr::null(), 0) },
        0
    );
    let mut r0 = BufReader::new(waiting.remove(0));
    let e = read_response(&mut r0);
    assert!(e.head.starts_with("HTTP/1.1 500 Internal Server Error\r\n"));
    assert_eq!(e.body, err);

    // upstream unreachable: a relayed request is answered 502 natively
    let mut u = TcpStream::connect(("127.0.0.1", port)).unwrap();
    u.write_all(b"GET /v2 HTTP/1.1\r\n\r\n").unwrap();
    let mut got = Vec::new();
    u.read_to_end(&mut got).unwrap();
    assert!(
        got.starts_with(b"HTTP/1.1 502 Bad Gateway\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // stop: the queued job gets 503, next_batch returns 0
    unsafe { bgf_stop(h.0) };
    let mut r1 = BufReader::new(waiting.remove(0));
    let s = read_response(&mut r1);
    assert!(s.head.starts_with("HTTP/1.1 503"));
    let n = next_batch(h, &mut images, 64, 1000).n;
    assert_eq!(n, 0);
    assert!(TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(500)
    )
    .is_err());
    let mut stats = [0u64; 8];
    unsafe { bgf_stats(h.0, stats.as_mut_ptr(), 8) };
    assert_eq!(stats[3], 2); // queue full + stop
    assert_eq!(stats[4], 1);
    unsafe { bgf_free(h.0) };
}

#[test]
fn start_reports_errors() {
    let mut err = [0u8; 64];
    let bad = b"{\"host\":1}";
    let h = unsafe { bgf_start(bad.as_ptr().cast(), bad.len(), err.as_mut_ptr().cast(), err.len()) };
    assert!(h.is_null());
    let msg = std::ffi::CStr::from_bytes_until_nul(&err).unwrap().to_str().unwrap();
    assert!(msg.starts_with("config:"), "{msg}");
}

/// Start the front end with `extra` config keys and no upstream; returns (handle, port).
fn start_with(extra: &str) -> (H, u16) {
    let text = test_config_text(0, "127.0.0.1:9").replace("\"pid\":4242", &format!("\"pid\":4242,{extra}"));
    let h = start(&text);
    let port = unsafe { bgf_port(h.0) };
    (h, port as u16)
}

fn stop(h: H) {
    unsafe {
        bgf_stop(h.0);
        bgf_free(h.0);
    }
}

#[test]
fn a_refused_request_is_answered_while_the_client_still_sends() {
    // The client writes a malformed head and 8 MiB more before it reads (as Python's urllib
    // writes a whole body): the front end half-closes after its 400 and drops what follows, so
    // every write succeeds and the 400 is read. Closing at once (or after 1 MiB, as before)
    // reset the connection: the writes failed with a broken pipe.
    let (h, port) = start_with("\"linger_ms\":10000,\"linger_idle_ms\":2000");
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"NOT HTTP\r\n\r\n").unwrap();
    let junk = vec![b'x'; 64 * 1024];
    for _ in 0..128 {
        c.write_all(&junk).expect("the front end lingers: no reset while the client sends");
    }
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert!(got.starts_with(b"HTTP/1.1 400 Bad Request\r\n"), "{}", String::from_utf8_lossy(&got));
    stop(h);
}

/// Seconds from the 400 until a write of the client fails (the front end closed for good),
/// writing `piece` bytes every `every`; None if no write failed within 10 s.
fn seconds_until_closed(port: u16, piece: usize, every: Duration) -> Option<f64> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"NOT HTTP\r\n\r\n").unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        thread::sleep(every);
        if c.write_all(&vec![b'x'; piece]).is_err() {
            return Some(t.elapsed().as_secs_f64());
        }
    }
    None
}

#[test]
fn lingering_ends_after_the_idle_and_total_bounds() {
    let (h, port) = start_with("\"linger_ms\":600,\"linger_idle_ms\":200");
    // a client that sends a byte every 50 ms is never idle for 200 ms: closed after 600 ms in
    // all (a write fails at the reset that follows, within a few more pieces)
    let total = seconds_until_closed(port, 1, Duration::from_millis(50)).expect("closed");
    assert!((0.55..3.0).contains(&total), "{total}");
    // a client that waits 400 ms between pieces is closed after 200 ms idle: its first piece
    // is answered by a reset, the second fails
    let idle = seconds_until_closed(port, 1, Duration::from_millis(400)).expect("closed");
    assert!((0.35..1.5).contains(&idle), "{idle}");
    stop(h);
    // with linger_ms 0 the close is at once: no piece gets through
    let (h, port) = start_with("\"linger_ms\":0");
    let now = seconds_until_closed(port, 1, Duration::from_millis(50)).expect("closed");
    assert!(now < 0.5, "{now}");
    stop(h);
}
