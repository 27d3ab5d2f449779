//! Loopback round trips of the ABI-2 additions (ABI 3's drain steps: `drain_tests.rs`): connection limit, `bgf_configure` and
//! generations, client-gone jobs, drain / pending, the 16 counters, the latency histogram and
//! the access log (captured through the injectable sink).

use crate::access_log::tests::Captured;
use crate::config::tests::test_config_text;
use crate::ffi::*;
use crate::roundtrip_tests::{
    expected_body, fake_python, fake_upstream, infer_request, next_batch, python_outputs, read_response, start, Batch,
    Response, H, PREFIX_START,
};
use crate::server::Server;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = r#","parameters":{"binary_data_output":true}"#;

/// The test configuration with `(from, to)` replacements.
pub(crate) fn config(upstream: &str, edits: &[(&str, &str)]) -> String {
    let mut t = test_config_text(0, upstream);
    for (from, to) in edits {
        assert!(t.contains(from), "{from}");
        t = t.replacen(from, to, 1);
    }
    t
}

pub(crate) fn server(h: H) -> &'static Server {
    unsafe { &*(h.0 as *const Server) }
}

fn capture(h: H) -> Captured {
    let cap = Captured::default();
    server(h).shared.log.set_sink(Box::new(cap.clone()));
    cap
}

pub(crate) fn stats(h: H) -> Vec<u64> {
    let mut v = vec![0u64; 20];
    assert_eq!(unsafe { bgf_stats(h.0, v.as_mut_ptr(), v.len()) }, 16);
    v.truncate(16);
    v
}

pub(crate) fn pending(h: H) -> usize {
    unsafe { bgf_pending(h.0) }
}

pub(crate) fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn connect(port: u16) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

pub(crate) fn complete_ok(h: H, b: &Batch, images: &[f32]) {
    let (prefix, data) = python_outputs(images, b.n, b.k);
    let rc = unsafe { bgf_complete(h.0, b.id, 200, prefix.as_ptr(), prefix.len(), data.as_ptr(), data.len()) };
    assert_eq!(rc, 0);
}

pub(crate) fn finish(h: H) {
    unsafe {
        bgf_stop(h.0);
        bgf_free(h.0);
    }
}

#[test]
fn abi_version_and_counts() {
    assert_eq!(bgf_abi_version(), 3);
    let h = start(&config("127.0.0.1:9", &[]));
    assert_eq!(unsafe { bgf_stats(h.0, std::ptr::null_mut(), 0) }, 16);
    let mut two = [7u64; 2];
    assert_eq!(unsafe { bgf_stats(h.0, two.as_mut_ptr(), 2) }, 16);
    assert_eq!(two, [0, 0]);
    // 4 bounds + Inf
    assert_eq!(unsafe { bgf_latency_buckets(h.0, std::ptr::null_mut(), 0) }, 5);
    assert_eq!(pending(h), 0);
    unsafe {
        assert_eq!(bgf_stats(std::ptr::null_mut(), std::ptr::null_mut(), 0), 0);
        assert_eq!(bgf_latency_buckets(std::ptr::null_mut(), std::ptr::null_mut(), 0), 0);
        assert_eq!(bgf_pending(std::ptr::null_mut()), 0);
        bgf_drain(std::ptr::null_mut());
    }
    finish(h);
}

#[test]
fn connection_limit_answers_busy() {
    let h = start(&config(
        "127.0.0.1:9",
        &[
            ("\"max_connections\":64", "\"max_connections\":1"),
            ("\"access_log\":\"off\"", "\"access_log\":\"json\""),
        ],
    ));
    let log = capture(h);
    let port = unsafe { bgf_port(h.0) };
    let first = connect(port);
    wait_until("one open connection", || stats(h)[10] == 1);

    let mut second = connect(port);
    let mut got = Vec::new();
    second.read_to_end(&mut got).unwrap();
    let r = read_response(&mut BufReader::new(&got[..]));
    assert!(r.head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{}", r.head);
    assert_eq!(r.body, b"{\"error\":\"busy\"}");
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    let id = r.header("x-request-id").unwrap();
    assert_eq!(id.len(), 32);

    let s = stats(h);
    assert_eq!((s[6], s[9], s[10], s[3]), (1, 1, 1, 0)); // accepted, rejected conns, open, 503s
    wait_until("the busy line", || log.lines().len() == 1);
    let line = &log.lines()[0];
    assert!(line.contains(&format!("\"message\": \"- - 503\", \"pid\": 4242, \"request_id\": \"{id}\", \"method\": \"-\", \"path\": \"-\", \"route\": \"-\", \"status\": 503,")), "{line}");
    assert!(line.contains(&format!("\"bytes_sent\": {}, ", got.len())), "{line}");

    // the slot frees when the first connection closes
    drop(first);
    wait_until("no open connection", || stats(h)[10] == 0);
    let mut third = connect(port);
    third.write_all(b"GET /v2 HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut got = Vec::new();
    third.read_to_end(&mut got).unwrap();
    assert!(
        got.starts_with(b"HTTP/1.1 502 Bad Gateway\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let s = stats(h);
    assert_eq!((s[2], s[6], s[9], s[13]), (1, 2, 1, 1)); // relayed, accepted, rejected conns, 502s
    wait_until("the 502 line", || log.lines().len() == 2);
    let line = &log.lines()[1];
    assert!(line.contains("\"message\": \"GET /v2 502\""), "{line}");
    assert!(line.contains("\"route\": \"/v2\", \"status\": 502"), "{line}");
    finish(h);
}

/// The generation-1 configuration: model `m2`, input 1×3×2, outputs `label` then `score`.
fn gen1_config() -> String {
    let text = config(
        "ignored:1",
        &[
            ("\"model_name\":\"m\"", "\"model_name\":\"m2\""),
            ("[1,2,2]", "[1,3,2]"),
        ],
    );
    let start = text.find("\"outputs\":[").unwrap();
    let end = start + text[start..].find("}],").unwrap() + 3;
    format!(
        r#"{}"outputs":[{{"name":"label","datatype":"INT64","elements":1}},{{"name":"score","datatype":"FP64","elements":1}}],{}"#,
        &text[..start],
        &text[end..]
    )
}

#[test]
fn configure_switches_the_model_and_old_jobs_keep_their_table() {
    let (upstream, seen, up_thread) = fake_upstream(1);
    let h = start(&config(&upstream, &[]));
    let port = unsafe { bgf_port(h.0) };

    // generation 0: a job for model m waits in the queue
    let mut a = connect(port);
    a.write_all(&infer_request(1, 0.25, BIN, "")).unwrap();
    wait_until("the first job queued", || pending(h) == 1);

    // a bad configuration is refused and changes nothing
    let mut err = [0u8; 128];
    let bad = b"{\"model_name\":1}";
    let rc = unsafe { bgf_configure(h.0, bad.as_ptr().cast(), bad.len(), err.as_mut_ptr().cast(), err.len()) };
    assert_eq!(rc, -1);
    let msg = std::ffi::CStr::from_bytes_until_nul(&err).unwrap().to_str().unwrap();
    assert!(msg.starts_with("config:"), "{msg}");

    let text = gen1_config();
    let rc = unsafe {
        bgf_configure(
            h.0,
            text.as_ptr().cast(),
            text.len(),
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    assert_eq!(rc, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(server(h).shared.config().generation, 1);
    assert_eq!(server(h).shared.config().upstream, upstream); // start-only: kept

    // generation 1: model m2 takes the fast path (2 images of 6 floats)
    let header = format!(
        r#"{{"inputs":[{{"name":"input","datatype":"FP32","shape":[2,1,3,2],"parameters":{{"binary_data_size":48}}}}]{BIN}}}"#
    );
    let mut body = header.as_bytes().to_vec();
    for v in 0..12 {
        body.extend_from_slice(&(v as f32 / 12.0).to_le_bytes());
    }
    let mut b = connect(port);
    b.write_all(
        format!(
            "POST /v2/models/m2/infer HTTP/1.1\r\nHost: t\r\nInference-Header-Content-Length: {}\r\nContent-Length: {}\r\n\r\n",
            header.len(),
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    b.write_all(&body).unwrap();
    wait_until("the second job queued", || pending(h) == 2);

    // model m is no longer served natively: relayed
    let mut c = connect(port);
    c.write_all(&infer_request(1, 0.25, BIN, "")).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert!(got.starts_with(b"HTTP/1.1 418"), "{}", String::from_utf8_lossy(&got));
    up_thread.join().unwrap();
    assert!(seen.lock().unwrap()[0].starts_with(b"POST /v2/models/m/infer HTTP/1.1\r\n"));

    // Python: the generation-0 batch first (capacity counted in generation-1 images: 2 × 6
    // floats hold the 4-float image)
    let mut images = vec![0f32; 2 * 6];
    let b0 = next_batch(h, &mut images, 2, 1000);
    assert_eq!((b0.n, b0.generation, b0.requests), (1, 0, 1));
    complete_ok(h, &b0, &images);
    let ra = read_response(&mut BufReader::new(&mut a));
    assert_eq!(
        ra.body,
        expected_body(1, 0.25, 10, &["probabilities", "label", "score", "flagged"])
    );

    let b1 = next_batch(h, &mut images, 2, 1000);
    assert_eq!((b1.n, b1.generation, b1.requests), (2, 1, 1));
    assert_eq!(images[6], 0.5);
    let mut data = Vec::new();
    for v in [7i64, 8] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0.5f64, 1.5] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    let prefix = format!("{PREFIX_START}10}},\"outputs\":[");
    let rc = unsafe {
        bgf_complete(
            h.0,
            b1.id,
            200,
            prefix.as_ptr(),
            prefix.len(),
            data.as_ptr(),
            data.len(),
        )
    };
    assert_eq!(rc, 0);
    let rb = read_response(&mut BufReader::new(&mut b));
    let json = format!(
        "{prefix}{}{}]}}",
        r#"{"name":"label","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}},"#,
        r#"{"name":"score","datatype":"FP64","shape":[2],"parameters":{"binary_data_size":16}}"#
    );
    let mut expected = json.clone().into_bytes();
    expected.extend_from_slice(&data);
    assert_eq!(rb.body, expected);
    assert_eq!(
        rb.header("inference-header-content-length"),
        Some(json.len().to_string())
    );

    // a second configure is generation 2
    let rc = unsafe { bgf_configure(h.0, text.as_ptr().cast(), text.len(), std::ptr::null_mut(), 0) };
    assert_eq!(rc, 0);
    assert_eq!(server(h).shared.config().generation, 2);
    wait_until("nothing pending", || pending(h) == 0);
    finish(h);
}

#[test]
fn jobs_of_departed_clients_are_dropped() {
    let h = start(&config(
        "127.0.0.1:9",
        &[("\"access_log\":\"off\"", "\"access_log\":\"json\"")],
    ));
    let log = capture(h);
    let port = unsafe { bgf_port(h.0) };
    let mut gone = connect(port);
    gone.write_all(&infer_request(1, 0.25, BIN, "")).unwrap();
    let mut stays = connect(port);
    stays.write_all(&infer_request(2, 0.75, BIN, "")).unwrap();
    wait_until("both queued", || pending(h) == 2);
    gone.shutdown(Shutdown::Both).unwrap();
    drop(gone);
    thread::sleep(Duration::from_millis(50));

    let mut images = vec![0f32; 64 * 4];
    let b = next_batch(h, &mut images, 64, 1000);
    assert_eq!((b.n, b.requests, images[0]), (2, 1, 0.75));
    assert_eq!(stats(h)[8], 1); // client_gone
    complete_ok(h, &b, &images);
    let r = read_response(&mut BufReader::new(&mut stays));
    assert_eq!(
        r.body,
        expected_body(2, 0.75, 10, &["probabilities", "label", "score", "flagged"])
    );
    wait_until("nothing pending", || pending(h) == 0);
    // only the answered request is logged; the dropped one is not answered at all
    wait_until("one line", || !log.lines().is_empty());
    thread::sleep(Duration::from_millis(50));
    assert_eq!(log.lines().len(), 1);
    assert!(log.lines()[0].contains("\"status\": 200"));
    let s = stats(h);
    assert_eq!((s[0], s[11], s[14]), (2, 1, 1)); // fast requests, 200s, latency count
    finish(h);
}

/// A fake upstream answering one request once told to.
pub(crate) fn held_upstream() -> (String, mpsc::Sender<()>, thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            req.extend_from_slice(&buf[..n]);
        }
        rx.recv().unwrap();
        s.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
            .unwrap();
        req
    });
    (addr, tx, t)
}

#[test]
fn drain_closes_idle_connections_and_serves_the_rest() {
    let (upstream, release, up_thread) = held_upstream();
    let grace = (
        "\"latency_buckets\"",
        "\"first_request_grace_ms\":10000,\"latency_buckets\"",
    );
    let h = start(&config(&upstream, &[grace]));
    let port = unsafe { bgf_port(h.0) };
    let mut images = vec![0f32; 64 * 4];

    // keep-alive connection with one answered request, now idle
    let mut idle = connect(port);
    idle.write_all(&infer_request(1, 0.25, BIN, "")).unwrap();
    let b = next_batch(h, &mut images, 64, 5000);
    complete_ok(h, &b, &images);
    let r = read_response(&mut BufReader::new(&mut idle));
    assert!(r.header("connection").is_none());
    // a connection that never sent anything
    let mut fresh = connect(port);
    // a queued request
    let mut queued = connect(port);
    queued.write_all(&infer_request(1, 0.5, BIN, "")).unwrap();
    // a request head half read
    let mut partial = connect(port);
    let req = infer_request(1, 0.75, BIN, "");
    partial.write_all(&req[..20]).unwrap();
    // a relay in progress
    let mut relayed = connect(port);
    relayed.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    // the half-read request counts as pending too
    wait_until("queued + relay + partial pending", || pending(h) == 3);
    wait_until("five open connections", || stats(h)[10] == 5);
    thread::sleep(Duration::from_millis(50));

    let t0 = Instant::now();
    unsafe {
        bgf_drain(h.0);
        bgf_drain(h.0); // idempotent
    }
    // an idle keep-alive connection closes at once
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).unwrap(), 0);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // one that has not sent its first request yet is not idle: it waits for it (within the
    // grace), and counts
    wait_until("the fresh connection pending", || pending(h) == 4);
    fresh.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let e = fresh.read(&mut [0u8; 1]).unwrap_err();
    assert!(
        matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        "{e}"
    );
    fresh.write_all(&infer_request(1, 0.125, BIN, "")).unwrap();
    // no new connections
    assert!(TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(500)
    )
    .is_err());

    // the half-read request is served, with connection: close
    wait_until("the fresh connection's request queued", || stats(h)[0] == 3);
    partial.write_all(&req[20..]).unwrap();
    wait_until("the partial request queued", || stats(h)[0] == 4);
    assert_eq!(pending(h), 4);
    // next_batch keeps working while draining
    let b = next_batch(h, &mut images, 64, 5000);
    assert_eq!((b.n, b.requests), (3, 3));
    assert_eq!((images[0], images[4], images[8]), (0.5, 0.125, 0.75));
    complete_ok(h, &b, &images);
    for (c, v) in [(&mut queued, 0.5), (&mut fresh, 0.125), (&mut partial, 0.75)] {
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap(); // closed after the response
        let r: Response = read_response(&mut BufReader::new(&all[..]));
        assert_eq!(r.header("connection").as_deref(), Some("close"));
        assert_eq!(
            r.body,
            expected_body(1, v, 10, &["probabilities", "label", "score", "flagged"])
        );
    }
    wait_until("only the relay pending", || pending(h) == 1);
    release.send(()).unwrap();
    let mut got = Vec::new();
    relayed.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
    assert!(up_thread.join().unwrap().starts_with(b"GET /slow HTTP/1.1\r\n"));
    wait_until("nothing pending", || pending(h) == 0);
    wait_until("no open connection", || stats(h)[10] == 0);
    unsafe { bgf_stop(h.0) };
    assert_eq!(next_batch(h, &mut images, 64, 100).n, 0);
    unsafe { bgf_free(h.0) };
}

#[test]
fn latency_histogram_counts_native_answers() {
    let h = start(&config(
        "127.0.0.1:9",
        &[
            ("[0.005,0.05,0.5,5]", "[0.25,60]"),
            ("\"request_timeout_ms\":2000", "\"request_timeout_ms\":400"),
            ("\"access_log\":\"off\"", "\"access_log\":\"json\""),
        ],
    ));
    let log = capture(h);
    let port = unsafe { bgf_port(h.0) };
    let buckets = || {
        let mut b = vec![0u64; 3];
        assert_eq!(unsafe { bgf_latency_buckets(h.0, b.as_mut_ptr(), 3) }, 3);
        b
    };

    // a 504 (nobody takes batches): 0.4 s → the second bucket
    let mut c = connect(port);
    c.write_all(&infer_request(1, 0.5, BIN, "X-Request-ID: slow-1\r\n"))
        .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let a = read_response(&mut r);
    assert!(a.head.starts_with("HTTP/1.1 504"));
    wait_until("one observation", || stats(h)[14] == 1);
    assert_eq!(buckets(), vec![0, 1, 0]);
    assert!(stats(h)[15] >= 400_000);

    // 200s with a Python thread
    let stop = Arc::new(AtomicBool::new(false));
    let py = fake_python(h, stop.clone(), Arc::new(Mutex::new(Vec::new())));
    for _ in 0..3 {
        c.write_all(&infer_request(1, 0.5, BIN, "")).unwrap();
        assert!(read_response(&mut r).head.starts_with("HTTP/1.1 200"));
    }
    // a 400 (unframeable head)
    let mut bad = connect(port);
    bad.write_all(b"NOT HTTP\r\n\r\n").unwrap();
    bad.read_to_end(&mut Vec::new()).unwrap();
    wait_until("five observations", || stats(h)[14] == 5);
    wait_until("five lines", || log.lines().len() == 5);
    let b = buckets();
    assert_eq!(b.iter().sum::<u64>(), 5);
    assert!(b[1] >= 1 && b[2] == 0, "{b:?}");
    let s = stats(h);
    assert_eq!((s[4], s[7], s[11]), (1, 1, 3)); // 504s, 400s, 200s

    // the JSON line of the 504: exact shape around the time-dependent values
    let lines = log.lines();
    let line = lines.iter().find(|l| l.contains(" 504\"")).unwrap();
    let client = c.local_addr().unwrap().to_string();
    let (ts_part, rest) = line.split_at(8 + 29 + 1);
    assert!(
        ts_part.starts_with("{\"ts\": \"") && ts_part.ends_with("+00:00\""),
        "{line}"
    );
    let (mid, tail) = rest.split_once(", \"duration_ms\": ").unwrap();
    assert_eq!(
        mid,
        ", \"level\": \"info\", \"logger\": \"bayesgate.access\", \"message\": \"POST /v2/models/m/infer 504\", \"pid\": 4242, \"request_id\": \"slow-1\", \"method\": \"POST\", \"path\": \"/v2/models/m/infer\", \"route\": \"/v2/models/{name}/infer\", \"status\": 504"
    );
    let (ms, tail) = tail.split_once(", ").unwrap();
    let ms: f64 = ms.parse().unwrap();
    assert!((400.0..10_000.0).contains(&ms), "{ms}");
    let response_len = a.head.len() + a.body.len();
    assert_eq!(
        tail,
        format!("\"bytes_sent\": {response_len}, \"client\": \"{client}\", \"front\": \"native\"}}")
    );
    assert!(
        lines.iter().any(|l| l.contains("\"message\": \"- - 400\"")),
        "{lines:?}"
    );

    // the access log format follows bgf_configure
    let text = config("127.0.0.1:9", &[("\"access_log\":\"off\"", "\"access_log\":\"text\"")]);
    assert_eq!(
        unsafe { bgf_configure(h.0, text.as_ptr().cast(), text.len(), std::ptr::null_mut(), 0) },
        0
    );
    c.write_all(&infer_request(1, 0.5, BIN, "")).unwrap();
    assert!(read_response(&mut r).head.starts_with("HTTP/1.1 200"));
    wait_until("a sixth line", || log.lines().len() == 6);
    assert_eq!(log.lines()[5], "INFO:     POST /v2/models/m/infer 200");

    stop.store(true, Ordering::SeqCst);
    py.join().unwrap();
    finish(h);
}

#[test]
fn idle_and_read_timeouts_close_the_connection() {
    // keep-alive idle 300 ms, a request on its way 600 ms (the service's keep_alive_timeout_s and
    // body_read_timeout_s); the defaults (75 s) when the keys are absent
    let h = start(&config(
        "127.0.0.1:9",
        &[(
            "\"pid\":4242",
            "\"pid\":4242,\"idle_timeout_ms\":300,\"read_timeout_ms\":600",
        )],
    ));
    let cfg = server(h).shared.config();
    assert_eq!(
        (cfg.idle_timeout, cfg.read_timeout),
        (Duration::from_millis(300), Duration::from_millis(600))
    );
    let port = unsafe { bgf_port(h.0) };

    // an idle connection (nothing sent) is closed after the idle timeout, not before
    let (got, waited) = read_until_closed(connect(port));
    assert!(
        got.is_empty() && waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // half a head, then silence: closed after the read timeout (longer than the idle one)
    let mut slow = connect(port);
    slow.write_all(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    let (got, waited) = read_until_closed(slow);
    assert!(
        got.is_empty() && waited >= Duration::from_millis(550) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    wait_until("no open connection", || stats(h)[10] == 0);
    finish(h);

    let h = start(&config("127.0.0.1:9", &[]));
    let cfg = server(h).shared.config();
    assert_eq!(
        (cfg.idle_timeout, cfg.read_timeout),
        (Duration::from_secs(75), Duration::from_secs(75))
    );
    finish(h);
    let bad = config("127.0.0.1:9", &[("\"pid\":4242", "\"pid\":4242,\"idle_timeout_ms\":0")]);
    assert!(crate::config::Config::parse(bad.as_bytes())
        .unwrap_err()
        .contains("idle_timeout_ms"));
}

/// Everything the server sends until it closes `stream`, and how long that took.
fn read_until_closed(mut stream: TcpStream) -> (Vec<u8>, Duration) {
    let began = Instant::now();
    let mut got = Vec::new();
    stream.read_to_end(&mut got).unwrap();
    (got, began.elapsed())
}
