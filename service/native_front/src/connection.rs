//! One connection's thread: requests in order (pipelined bytes stay buffered for the next
//! request), keep-alive for HTTP/1.1 (idle read timeout `idle_timeout_ms`). A fast-path request
//! is queued and its thread waits for the batch's answer (or its deadline → 504); anything else
//! is relayed to the Python service and the connection is then closed. Each request is handled
//! start to end with one configuration snapshot ([`Shared::config`]).
//!
//! The connection's [`ConnSlot`] tells the drain whether its thread waits for a request with
//! nothing buffered (idle: shut down at once), for its first request (left until the drain's
//! `first_request_grace` is over), or is busy (answered, with `connection: close`).

use crate::access_log::{self, INFER_ROUTE};
use crate::batch_queue::{Job, JobMeta, CLIENT_GONE};
use crate::config::Config;
use crate::fast_path::{check_body, check_head};
use crate::http::{self, check_request_start, find_head_end, Framing, Head, HeadError, MAX_HEAD};
use crate::peer::{self, Fd, Peek};
use crate::relay;
use crate::request_id;
use crate::server::{Answered, Shared};
use crate::stats::{Gauge, InFlight};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The socket's read timeout, set only when it changes (idle between requests: the keep-alive
/// timeout; a request on its way: the read timeout).
struct ReadTimeout(Option<Duration>);

impl ReadTimeout {
    fn set(&mut self, stream: &TcpStream, timeout: Duration) {
        if self.0 != Some(timeout) {
            let _ = stream.set_read_timeout(Some(timeout));
            self.0 = Some(timeout);
        }
    }
}

pub(crate) const BUSY: u8 = 0;
pub(crate) const IDLE: u8 = 1;
pub(crate) const SHUT: u8 = 2;
/// Waiting for the connection's first request: the drain leaves it be.
pub(crate) const FIRST: u8 = 3;

/// A connection as the drain sees it: its descriptor and whether its thread waits for a new
/// request with nothing buffered.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    pub(crate) fd: Fd,
    pub(crate) state: AtomicU8,
}

/// Close after a final response: half-close, then read and drop what the client still sends
/// until it closes its side, at most `cfg.linger_idle` between two reads and `cfg.linger` in all
/// (the service's `BAYESGATE_LINGER_IDLE_S` / `BAYESGATE_LINGER_S`). Bytes still arriving at a
/// closed socket turn the close into a reset, which can take the response with it: a client
/// that writes its whole body before reading (Python's urllib) then saw "broken pipe" instead of
/// a relayed 413 (with the 1 MiB this read at most before, for any body over about 2 MiB).
pub(crate) fn close_gracefully(stream: &mut TcpStream, cfg: &Config) {
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Write);
    let start = Instant::now();
    let mut sink = [0u8; 16 * 1024];
    loop {
        let left = cfg.linger.saturating_sub(start.elapsed());
        if left.is_zero() || stream.set_read_timeout(Some(left.min(cfg.linger_idle))).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(0) | Err(_) => break, // the client's end of stream, a timeout or an error
            Ok(_) => {}
        }
    }
}

/// Why a head is refused before it is complete.
enum Refused {
    /// Over [`MAX_HEAD`], or still arriving past the main port's `max_header_bytes` → 431.
    TooLarge,
    /// Bytes that cannot begin a request line → 400.
    Malformed(HeadError),
}

/// Most bytes of a head still arriving: the main port's `max_header_bytes` (past it, the main
/// port answers 431 without waiting for the rest), at most [`MAX_HEAD`].
fn head_limit(cfg: &Config) -> usize {
    cfg.max_header_bytes.min(MAX_HEAD as u64) as usize
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

/// Wait idle (nothing buffered) for the next request: false when the drain began and nothing
/// is waiting (close now). The drain shuts down idle connections, which ends the read. The wait
/// for a connection's `first` request is not idle: its client has just connected (perhaps taken
/// from the accept queue by the drain itself) and is sending it, so it may until the drain's
/// `first_request_grace` is over.
fn enter_idle(shared: &Shared, slot: &ConnSlot, first: bool) -> bool {
    // SeqCst pairs with the grace's end (flag, then scan for FIRST): either this thread sees
    // the flag, or the scan sees this slot (or both)
    if first && !shared.first_grace_over.load(Ordering::SeqCst) {
        slot.state.store(FIRST, Ordering::SeqCst);
        if !shared.first_grace_over.load(Ordering::SeqCst) {
            return true;
        }
    }
    slot.state.store(IDLE, Ordering::SeqCst);
    // SeqCst pairs with the drain's store + compare_exchange: either this thread sees the
    // drain, or the drain sees this slot idle (or both).
    !(shared.draining() && peer::peek(slot.fd) != Peek::Data)
}

/// Serve one connection until it closes.
pub(crate) fn serve_connection(shared: &Shared, stream: &mut TcpStream, slot: &ConnSlot, client: &str) {
    let _ = stream.set_nodelay(true);
    let (idle_timeout, read_timeout) = {
        let cfg = shared.config(); // start values: the same in every generation
        (cfg.idle_timeout, cfg.read_timeout)
    };
    let mut timeout = ReadTimeout(None);
    let stats = &shared.stats;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut first = true; // no request head read yet
    loop {
        // 1. the head
        let mut scanned = 0;
        // held from a request's first bytes until it is queued or relayed (`bgf_pending`)
        let mut reading: Option<Gauge<'_>> = None;
        let end = loop {
            // tolerate empty lines before a request line (RFC 9112 §2.2)
            let blank = buf.chunks(2).take_while(|c| *c == b"\r\n").count() * 2;
            if blank > 0 {
                buf.drain(..blank);
                scanned = 0;
            }
            if !buf.is_empty() && reading.is_none() {
                reading = Some(Gauge::up(&stats.requests_reading));
            }
            if let Some(end) = find_head_end(&buf, scanned) {
                break Ok(end);
            }
            if let Err(e) = check_request_start(&buf) {
                break Err(Refused::Malformed(e));
            }
            if !buf.is_empty() && buf.len() > head_limit(&shared.config()) {
                break Err(Refused::TooLarge);
            }
            scanned = buf.len();
            let idle = buf.is_empty();
            if idle && !enter_idle(shared, slot, first) {
                return;
            }
            timeout.set(stream, if idle { idle_timeout } else { read_timeout });
            let awaited = (idle && first).then(|| Gauge::up(&stats.awaiting_first));
            let r = read_more(stream, &mut buf, 0);
            drop(awaited);
            if idle {
                slot.state.store(BUSY, Ordering::SeqCst);
            }
            match r {
                Ok(0) | Err(_) => return, // EOF, idle timeout, error or drained
                Ok(_) => {}
            }
        };
        first = false;
        let arrival = Instant::now();
        timeout.set(stream, read_timeout); // the body, or the relayed rest of the request
        let cfg = shared.config();
        let unframeable = |stream: &mut TcpStream, status: u16, body: &str| {
            let id = request_id::new_id();
            let a = Answered {
                request_id: &id,
                method: "-",
                path: "-",
                route: "-",
                status,
                arrival,
                client,
            };
            shared.answer(
                &cfg,
                stream,
                &http::json_response(status, body.as_bytes(), &id, true),
                &a,
                false,
            );
            close_gracefully(stream, &cfg);
        };
        let end = match end {
            Ok(end) if end <= MAX_HEAD => end,
            Ok(_) | Err(Refused::TooLarge) => {
                unframeable(stream, 431, http::HEAD_TOO_LARGE_BODY);
                return;
            }
            Err(Refused::Malformed(e)) => {
                unframeable(stream, 400, &e.body());
                return;
            }
        };
        let parsed = Head::parse(buf[..end].to_vec()).and_then(|h| h.framing().map(|f| (h, f)));
        let (head, framing) = match parsed {
            Ok(x) => x,
            Err(e) => {
                unframeable(stream, 400, &e.body());
                return;
            }
        };
        let request_id = request_id::for_request(head.values("x-request-id").next());
        let method = String::from_utf8_lossy(head.method()).into_owned();
        let path = access_log::path_of(head.target());

        // 2. fast path?
        let mut fast = None;
        if let Ok(h) = check_head(&cfg, &head, framing) {
            let Framing::Length(len) = framing else {
                unreachable!("check_head wants a Content-Length")
            };
            let total = end + len as usize;
            while buf.len() < total {
                let want = total - buf.len();
                match read_more(stream, &mut buf, want) {
                    Ok(0) | Err(_) => return, // the client went away mid-body
                    Ok(_) => {}
                }
            }
            if let Ok(req) = check_body(&cfg, h, &buf[end..total]) {
                fast = Some((req, total));
            }
        }

        // 3a. relay
        let Some((req, total)) = fast else {
            stats.relayed_requests.fetch_add(1, Ordering::Relaxed);
            let outcome = {
                let _in_flight = Gauge::up(&stats.relays_in_flight);
                drop(reading);
                relay::relay(&cfg.upstream, stream, client, &head, framing, &buf[end..])
            };
            if let Some((status, bytes)) = outcome.native_answer(&request_id) {
                let a = Answered {
                    request_id: &request_id,
                    method: &method,
                    path: &path,
                    route: &path,
                    status,
                    arrival,
                    client,
                };
                shared.answer(&cfg, stream, &bytes, &a, false); // counted before it is written
            }
            close_gracefully(stream, &cfg);
            return;
        };

        // 3b. queue and wait
        let mut close = head.wants_close() || shared.draining();
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
            cfg: cfg.clone(),
            fd: peer::fd_of(stream),
            in_flight: InFlight::new(stats.clone()),
        });
        drop(reading); // counted in flight from here
        let (status, bytes) = match shared.queue.push(Job {
            meta: meta.clone(),
            images: req.images,
        }) {
            Err(_) => (
                503,
                http::json_response(503, cfg.queue_full_body.as_bytes(), &meta.request_id, close),
            ),
            Ok(()) => {
                stats.fast_requests.fetch_add(1, Ordering::Relaxed);
                stats.fast_images.fetch_add(n as u64, Ordering::Relaxed);
                let wait = meta.deadline.saturating_duration_since(Instant::now());
                let reply = match rx.recv_timeout(wait) {
                    Ok(r) => Some(r),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                        shared.queue.abandon(&meta);
                        rx.try_recv().ok() // an answer that raced the deadline still wins
                    }
                };
                match reply {
                    Some(r) => (r.status, r.bytes),
                    None => (
                        504,
                        http::json_response(504, cfg.timeout_body.as_bytes(), &meta.request_id, close),
                    ),
                }
            }
        };
        buf.drain(..total);
        if status == CLIENT_GONE {
            return; // the client closed the connection: nobody to answer
        }
        let mut bytes = bytes;
        if !close && shared.draining() {
            bytes = http::add_close(bytes);
            close = true;
        }
        let a = Answered {
            request_id: &meta.request_id,
            method: &method,
            path: &path,
            route: INFER_ROUTE,
            status,
            arrival,
            client,
        };
        let written = shared.answer(&cfg, stream, &bytes, &a, false);
        drop(meta); // answered: no longer pending (once the queue is done with it too)
        if !written {
            return;
        }
        if close {
            close_gracefully(stream, &cfg);
            return;
        }
    }
}
