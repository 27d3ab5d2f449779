//! The listener, the acceptor thread and one thread per connection.
//!
//! A connection serves requests in order (pipelined bytes stay buffered for the next
//! request) with keep-alive for HTTP/1.1 (idle read timeout 75 s). A fast-path request is
//! queued and its thread waits for the batch's answer (or its deadline → 504); anything else
//! is relayed to the Python service and the connection is then closed.

use crate::batch_queue::{BatchQueue, Job, JobMeta};
use crate::config::Config;
use crate::fast_path::{check_body, check_head};
use crate::http::{self, find_head_end, Framing, Head, MAX_HEAD};
use crate::relay;
use crate::request_id;
use crate::stats::Stats;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Idle keep-alive timeout (and the read timeout while a request arrives).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// State shared by the acceptor, the connection threads and the FFI handle.
pub struct Shared {
    /// Settings.
    pub cfg: Arc<Config>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// The job queue.
    pub queue: BatchQueue,
    stopping: AtomicBool,
}

/// A running front end.
pub struct Server {
    /// Shared state (kept alive by connection threads too).
    pub shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl Server {
    /// Bind the listener and start the acceptor thread.
    pub fn start(cfg: Config) -> io::Result<Server> {
        let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))?;
        let addr = listener.local_addr()?;
        let cfg = Arc::new(cfg);
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            queue: BatchQueue::new(cfg.clone(), stats.clone()),
            cfg,
            stats,
            stopping: AtomicBool::new(false),
        });
        let acc = shared.clone();
        let handle = thread::Builder::new()
            .name("bgfront-accept".into())
            .spawn(move || accept_loop(acc, listener))?;
        Ok(Server {
            shared,
            addr,
            acceptor: Mutex::new(Some(handle)),
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stop accepting, answer queued jobs 503, make `next_batch` return nothing, join the
    /// acceptor. Idempotent.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let handle = self.acceptor.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            // wake the blocking accept() with a connection of our own
            let mut wake = self.addr;
            if wake.ip().is_unspecified() {
                wake.set_ip(match wake.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                });
            }
            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
            let _ = handle.join();
        }
        self.shared.queue.stop();
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        match conn {
            Ok(stream) => {
                shared.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                let spawned = thread::Builder::new()
                    .name("bgfront-conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || serve_connection(&s, stream));
                if spawned.is_err() {
                    thread::sleep(Duration::from_millis(10));
                }
            }
            Err(_) => thread::sleep(Duration::from_millis(10)), // e.g. out of descriptors
        }
    }
    // the listener closes here
}

/// Close after a final response: half-close, drain what the client still sends (briefly),
/// so unread pipelined bytes do not turn the close into a reset that loses the response.
fn close_gracefully(stream: &mut TcpStream) {
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < (1 << 20) {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Read more bytes into `buf` (at least `want` bytes of room); Ok(0) at EOF.
fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    let old = buf.len();
    buf.resize(old + want.clamp(16 * 1024, 1 << 20), 0);
    let r = loop {
        match stream.read(&mut buf[old..]) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    buf.truncate(old + *r.as_ref().unwrap_or(&0));
    r
}

/// Serve one connection until it closes.
pub fn serve_connection(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let cfg = &shared.cfg;
    let stats = &shared.stats;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        // 1. the head
        let mut scanned = 0;
        let end = loop {
            // tolerate empty lines before a request line (RFC 9112 §2.2)
            let blank = buf.chunks(2).take_while(|c| *c == b"\r\n").count() * 2;
            if blank > 0 {
                buf.drain(..blank);
                scanned = 0;
            }
            if let Some(end) = find_head_end(&buf, scanned) {
                break Some(end);
            }
            if buf.len() >= MAX_HEAD {
                break None;
            }
            scanned = buf.len();
            match read_more(&mut stream, &mut buf, 0) {
                Ok(0) | Err(_) => return, // EOF, idle timeout or error
                Ok(_) => {}
            }
        };
        let Some(end) = end.filter(|&e| e <= MAX_HEAD) else {
            stats.bad_requests_400_native.fetch_add(1, Ordering::Relaxed);
            let id = request_id::new_id();
            let _ = stream.write_all(&http::json_response(
                431,
                http::HEAD_TOO_LARGE_BODY.as_bytes(),
                &id,
                true,
            ));
            close_gracefully(&mut stream);
            return;
        };
        let arrival = Instant::now();
        let parsed = Head::parse(buf[..end].to_vec()).and_then(|h| h.framing().map(|f| (h, f)));
        let (head, framing) = match parsed {
            Ok(x) => x,
            Err(_) => {
                stats.bad_requests_400_native.fetch_add(1, Ordering::Relaxed);
                let id = request_id::new_id();
                let _ = stream.write_all(&http::json_response(400, http::BAD_REQUEST_BODY.as_bytes(), &id, true));
                close_gracefully(&mut stream);
                return;
            }
        };
        let request_id = request_id::for_request(head.values("x-request-id").next());

        // 2. fast path?
        let mut fast = None;
        if let Ok(h) = check_head(cfg, &head, framing) {
            let Framing::Length(len) = framing else {
                unreachable!("check_head wants a Content-Length")
            };
            let total = end + len as usize;
            while buf.len() < total {
                let want = total - buf.len();
                match read_more(&mut stream, &mut buf, want) {
                    Ok(0) | Err(_) => return, // the client went away mid-body
                    Ok(_) => {}
                }
            }
            if let Ok(req) = check_body(cfg, h, &buf[end..total]) {
                fast = Some((req, total));
            }
        }

        // 3a. relay
        let Some((req, total)) = fast else {
            stats.relayed_requests.fetch_add(1, Ordering::Relaxed);
            relay::relay(&cfg.upstream, &mut stream, &head, framing, &buf[end..], &request_id);
            close_gracefully(&mut stream);
            return;
        };

        // 3b. queue and wait
        let close = head.wants_close();
        let n = req.n;
        let (tx, rx) = sync_channel(1);
        let meta = Arc::new(JobMeta {
            n,
            k: req.k,
            seed: req.seed,
            outputs: req.outputs,
            request_id,
            close,
            deadline: arrival + cfg.request_timeout,
            abandoned: AtomicBool::new(false),
            reply: tx,
        });
        let bytes = match shared.queue.push(Job {
            meta: meta.clone(),
            images: req.images,
        }) {
            Err(_) => {
                stats.rejected_503.fetch_add(1, Ordering::Relaxed);
                http::json_response(503, cfg.queue_full_body.as_bytes(), &meta.request_id, close)
            }
            Ok(()) => {
                stats.fast_requests.fetch_add(1, Ordering::Relaxed);
                stats.fast_images.fetch_add(n as u64, Ordering::Relaxed);
                let wait = meta.deadline.saturating_duration_since(Instant::now());
                let reply = match rx.recv_timeout(wait) {
                    Ok(r) => Some(r),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                        meta.abandoned.store(true, Ordering::Release);
                        rx.try_recv().ok() // an answer that raced the deadline still wins
                    }
                };
                match reply {
                    Some(r) => {
                        match r.status {
                            503 => stats.rejected_503.fetch_add(1, Ordering::Relaxed),
                            504 => stats.timed_out_504.fetch_add(1, Ordering::Relaxed),
                            _ => 0,
                        };
                        r.bytes
                    }
                    None => {
                        stats.timed_out_504.fetch_add(1, Ordering::Relaxed);
                        http::json_response(504, cfg.timeout_body.as_bytes(), &meta.request_id, close)
                    }
                }
            }
        };
        buf.drain(..total);
        if stream.write_all(&bytes).is_err() {
            return;
        }
        if close {
            close_gracefully(&mut stream);
            return;
        }
    }
}
