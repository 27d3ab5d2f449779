//! The listener, the acceptor thread and one thread per connection.
//!
//! A connection serves requests in order (pipelined bytes stay buffered for the next
//! request) with keep-alive for HTTP/1.1 (idle read timeout 75 s). A fast-path request is
//! queued and its thread waits for the batch's answer (or its deadline → 504); anything else
//! is relayed to the Python service and the connection is then closed. Each request is handled
//! start to end with one configuration snapshot ([`Shared::config`]).
//!
//! Over `max_connections` open connections a new one is answered 503 `busy_body` and closed.
//! While draining ([`Server::drain`]) the listener is closed — its accept queue taken and served
//! first ([`crate::listener`]) — connections idle between requests are closed (a registry of
//! connection slots: idle ones are shut down for reading) and every response carries
//! `connection: close`. A connection that has not sent its first request yet is not idle: it
//! gets the idle timeout to send one, as before the drain.

use crate::access_log::{self, AccessLog, Entry, INFER_ROUTE};
use crate::batch_queue::{BatchQueue, Job, JobMeta, CLIENT_GONE};
use crate::config::Config;
use crate::fast_path::{check_body, check_head};
use crate::histogram::Histogram;
use crate::http::{self, find_head_end, Framing, Head, MAX_HEAD};
use crate::listener::{self, Wake};
use crate::peer::{self, Fd, Peek};
use crate::relay;
use crate::request_id;
use crate::stats::{Gauge, InFlight, Stats};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::{self, JoinHandle};
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

/// Most threads answering connections over the limit at once; past it the 503 is written by
/// the acceptor itself, without the graceful drain.
const MAX_BUSY_THREADS: u64 = 64;

const BUSY: u8 = 0;
const IDLE: u8 = 1;
const SHUT: u8 = 2;
/// Waiting for the connection's first request: the drain leaves it be.
const FIRST: u8 = 3;

/// A connection as the drain sees it: its descriptor and whether its thread waits for a new
/// request with nothing buffered.
#[derive(Debug)]
struct ConnSlot {
    fd: Fd,
    state: AtomicU8,
}

/// State shared by the acceptor, the connection threads and the FFI handle.
pub struct Shared {
    config: RwLock<Arc<Config>>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// The job queue.
    pub queue: BatchQueue,
    /// Access-log lines.
    pub log: AccessLog,
    /// Latency histogram of natively answered requests.
    pub latency: Histogram,
    max_connections: u64,
    /// The listener is closing (drain or stop).
    closing: AtomicBool,
    draining: AtomicBool,
    conns: Mutex<HashMap<u64, Arc<ConnSlot>>>,
    next_conn: AtomicU64,
    busy_threads: AtomicU64,
    /// The drain's `first_request_grace` is over: a connection waiting for its first request
    /// is idle from now on.
    first_grace_over: AtomicBool,
    /// Tests: leave connections in the accept queue until the listener closes.
    #[cfg(test)]
    pub(crate) hold_accepts: AtomicBool,
    /// Tests: pause this long between the closing acceptor's filter and its last accept.
    #[cfg(test)]
    pub(crate) pause_before_last_accept: Mutex<Duration>,
}

/// What the access log and the histogram get about a native answer (the duration and bytes
/// are added once it is written).
struct Answered<'a> {
    request_id: &'a str,
    method: &'a str,
    path: &'a str,
    route: &'a str,
    status: u16,
    arrival: Instant,
    client: &'a str,
}

impl Shared {
    /// The configuration for a request classified now.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `bgf_configure`: parse `text` against the running configuration and make it current.
    /// Returns the new generation.
    pub fn configure(&self, text: &[u8]) -> Result<u64, String> {
        let mut current = self.config.write().unwrap_or_else(|p| p.into_inner());
        let next = Config::parse_update(text, &current)?;
        let generation = next.generation;
        *current = Arc::new(next);
        Ok(generation)
    }

    /// True once the drain began.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// `bgf_pending`: [`Stats::pending`], the requests being read, and once the drain began,
    /// the connections still waiting for their first request (for at most
    /// `first_request_grace` from the drain's start).
    pub fn pending(&self) -> u64 {
        let first = if self.draining() {
            self.stats.awaiting_first.load(Ordering::SeqCst)
        } else {
            0
        };
        self.stats.pending() + self.stats.requests_reading.load(Ordering::SeqCst) + first
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<ConnSlot>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count a native answer by its status (before it is written, so a client that read it
    /// sees the counter). `busy`: the 503 of the connection limit.
    fn count_status(&self, status: u16, busy: bool) {
        let s = &self.stats;
        let counter = match status {
            200 => &s.answered_200,
            400 | 431 => &s.bad_requests_400_native,
            500 => &s.errors_500,
            502 => &s.upstream_502,
            503 if busy => &s.rejected_connections,
            503 => &s.rejected_503,
            504 => &s.timed_out_504,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// After a native answer was written (`sent` bytes; 0 when the write failed): the latency
    /// histogram and the access log.
    fn observe(&self, cfg: &Config, a: &Answered<'_>, sent: usize) {
        let duration = a.arrival.elapsed();
        self.latency.observe(duration);
        self.stats.latency_count.fetch_add(1, Ordering::Relaxed);
        self.stats
            .latency_sum_us
            .fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
        let entry = Entry {
            request_id: a.request_id,
            method: a.method,
            path: a.path,
            route: a.route,
            status: a.status,
            duration,
            bytes_sent: sent as u64,
            client: Some(a.client),
        };
        self.log.log(cfg.access_log, cfg.pid, &entry);
    }

    /// Count, write and log a native answer. True when the write succeeded.
    fn answer(&self, cfg: &Config, stream: &mut TcpStream, bytes: &[u8], a: &Answered<'_>, busy: bool) -> bool {
        self.count_status(a.status, busy);
        let ok = stream.write_all(bytes).is_ok();
        self.observe(cfg, a, if ok { bytes.len() } else { 0 });
        ok
    }

    /// Drain: shut down (for reading) every connection whose thread waits idle (`state`: IDLE,
    /// or FIRST once the first request's grace is over) for a request, which wakes it to close.
    /// A connection with bytes already waiting is left to read them.
    fn shut_waiting_connections(&self, state: u8) {
        for slot in self.conns().values() {
            if peer::peek(slot.fd) == Peek::Data {
                continue;
            }
            if slot
                .state
                .compare_exchange(state, SHUT, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                peer::shutdown_read(slot.fd);
            }
        }
    }
}

/// A served connection's place in the registry and in `open_connections`; dropped (by
/// [`Conn`]) before the stream closes, so a registered descriptor is always open.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
    slot: Arc<ConnSlot>,
}

impl Registration {
    fn new(shared: &Arc<Shared>, stream: &TcpStream) -> Registration {
        shared.stats.open_connections.fetch_add(1, Ordering::SeqCst);
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(ConnSlot {
            fd: peer::fd_of(stream),
            state: AtomicU8::new(BUSY),
        });
        shared.conns().insert(id, slot.clone());
        Registration {
            shared: shared.clone(),
            id,
            slot,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.id);
        self.shared.stats.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A served connection (field order = drop order: the registration goes before the stream).
struct Conn {
    reg: Registration,
    stream: TcpStream,
}

/// A running front end.
pub struct Server {
    /// Shared state (kept alive by connection threads too).
    pub shared: Arc<Shared>,
    addr: SocketAddr,
    /// The listener, while it is open (the acceptor holds it too).
    listener: Mutex<Option<Arc<TcpListener>>>,
    wake: Arc<Wake>,
    acceptor: Mutex<Option<JoinHandle<usize>>>,
    /// Connections the acceptor took from the accept queue when it stopped (reported once).
    taken: Mutex<Option<usize>>,
}

impl Server {
    /// Bind the listener and start the acceptor thread.
    pub fn start(cfg: Config) -> io::Result<Server> {
        let listener = Arc::new(TcpListener::bind((cfg.host.as_str(), cfg.port))?);
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let wake = Arc::new(Wake::new()?);
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            queue: BatchQueue::new(stats.clone()),
            latency: Histogram::new(&cfg.latency_buckets),
            max_connections: cfg.max_connections as u64,
            config: RwLock::new(Arc::new(cfg)),
            stats,
            log: AccessLog::default(),
            closing: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            busy_threads: AtomicU64::new(0),
            first_grace_over: AtomicBool::new(false),
            #[cfg(test)]
            hold_accepts: AtomicBool::new(false),
            #[cfg(test)]
            pause_before_last_accept: Mutex::new(Duration::ZERO),
        });
        let (acc, l, w) = (shared.clone(), listener.clone(), wake.clone());
        let handle = thread::Builder::new()
            .name("bgfront-accept".into())
            .spawn(move || accept_loop(&acc, &l, &w))?;
        Ok(Server {
            shared,
            addr,
            listener: Mutex::new(Some(listener)),
            wake,
            acceptor: Mutex::new(Some(handle)),
            taken: Mutex::new(None),
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Refuse new connections from now on ([`listener::refuse_new_connections`]) while still
    /// accepting those whose handshake is under way or queued. False when the filter could not
    /// be attached (not Linux) or the listener is closed.
    pub fn refuse_new(&self) -> bool {
        let listener = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        listener.as_deref().is_some_and(listener::refuse_new_connections)
    }

    /// Stop accepting: wake and join the acceptor, which refuses new connections, takes (and
    /// serves) its accept queue and lets the listener close. Idempotent. Returns how many
    /// connections it took from the queue, on the first call (0 on later ones).
    fn close_listener(&self) -> usize {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.wake.wake();
        // held through the join: a concurrent caller returns once the queue is served
        let mut acceptor = self.acceptor.lock().unwrap_or_else(|p| p.into_inner());
        let taken = acceptor.take().map(|h| h.join().unwrap_or(0));
        drop(acceptor);
        self.listener.lock().unwrap_or_else(|p| p.into_inner()).take(); // the socket closes
        let mut reported = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        match (taken, reported.is_some()) {
            (Some(n), false) => {
                *reported = Some(n);
                n
            }
            _ => 0,
        }
    }

    /// Drain: close the listener (serving its accept queue), close connections idle between
    /// requests, answer everything else with `connection: close`. Queued jobs and `next_batch`
    /// are unaffected. Idempotent; returns how many connections were taken from the accept
    /// queue (on the first call).
    pub fn drain(&self) -> usize {
        let first = !self.shared.draining.swap(true, Ordering::SeqCst);
        let taken = self.close_listener();
        self.shared.shut_waiting_connections(IDLE);
        if first {
            // connections that have not sent their first request get the grace, then go as
            // idle ones do (a detached thread: the drain is called on Python's event loop)
            let shared = self.shared.clone();
            let grace = shared.config().first_request_grace;
            let end_grace = move || {
                thread::sleep(grace);
                shared.first_grace_over.store(true, Ordering::SeqCst);
                shared.shut_waiting_connections(FIRST);
            };
            let spawned = thread::Builder::new()
                .name("bgfront-drain".into())
                .stack_size(64 * 1024)
                .spawn(end_grace);
            if spawned.is_err() {
                // no thread to wait on: no grace
                self.shared.first_grace_over.store(true, Ordering::SeqCst);
                self.shared.shut_waiting_connections(FIRST);
            }
        }
        taken
    }

    /// Stop accepting, answer queued jobs 503, make `next_batch` return nothing, join the
    /// acceptor. Idempotent.
    pub fn stop(&self) {
        self.close_listener();
        self.shared.queue.stop();
    }
}

/// Accept until told to stop; then refuse new connections, take every connection in the
/// accept queue (the listener's close would reset them) and return how many there were. The
/// listener is non-blocking; [`Wake::wait`] waits for the next connection or the stop.
fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, wake: &Wake) -> usize {
    while !shared.closing.load(Ordering::SeqCst) && wake.wait(listener) {
        accept_waiting(shared, listener, false);
    }
    listener::refuse_new_connections(listener);
    #[cfg(test)]
    thread::sleep(*shared.pause_before_last_accept.lock().unwrap());
    accept_waiting(shared, listener, true)
}

/// How long the last pass over the accept queue keeps retrying an `accept` that failed for
/// want of descriptors or memory (what it leaves is reset with the listener).
const LAST_ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accept (and serve) every connection waiting now; how many. A connection aborted while
/// queued (ECONNABORTED, EPROTO) is skipped; on another error (e.g. out of descriptors) the
/// acceptor pauses 10 ms — and on the `last` pass, before the listener closes, retries for up
/// to [`LAST_ACCEPT_RETRY`].
fn accept_waiting(shared: &Arc<Shared>, listener: &TcpListener, last: bool) -> usize {
    #[cfg(test)]
    if shared.hold_accepts.load(Ordering::SeqCst) && !shared.closing.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(2));
        return 0;
    }
    const EPROTO: i32 = 71; // Linux's
    let mut n = 0;
    let retry_until = Instant::now() + LAST_ACCEPT_RETRY;
    loop {
        match listener.accept() {
            Ok((stream, addr)) => {
                n += 1;
                admit(shared, stream, addr);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) if e.raw_os_error() == Some(EPROTO) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
            Err(_) => {
                thread::sleep(Duration::from_millis(10)); // e.g. out of descriptors
                if !last || Instant::now() >= retry_until {
                    return n;
                }
            }
        }
    }
}

/// Serve an accepted connection on a thread of its own (503 `busy_body` over the limit).
fn admit(shared: &Arc<Shared>, stream: TcpStream, addr: SocketAddr) {
    // accepted sockets inherit the listener's O_NONBLOCK on some systems (not Linux)
    let _ = stream.set_nonblocking(false);
    // only the acceptor raises the gauge: the check cannot be overtaken
    if shared.stats.open_connections.load(Ordering::SeqCst) >= shared.max_connections {
        reject_busy(shared, stream, addr);
        return;
    }
    shared.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
    let conn = Conn {
        reg: Registration::new(shared, &stream),
        stream,
    };
    let spawned = thread::Builder::new()
        .name("bgfront-conn".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let mut conn = conn;
            let shared = conn.reg.shared.clone();
            serve_connection(&shared, &mut conn.stream, &conn.reg.slot, &addr.to_string());
        });
    if spawned.is_err() {
        thread::sleep(Duration::from_millis(10));
    }
}

/// A connection over `max_connections`: 503 `busy_body`, `connection: close`, graceful close
/// (on a short-lived thread of its own; inline without the drain past [`MAX_BUSY_THREADS`]).
fn reject_busy(shared: &Arc<Shared>, mut stream: TcpStream, addr: SocketAddr) {
    let arrival = Instant::now();
    let cfg = shared.config();
    let id = request_id::new_id();
    let bytes = http::json_response(503, cfg.busy_body.as_bytes(), &id, true);
    let client = addr.to_string();
    let answered = move |shared: &Shared, stream: &mut TcpStream| {
        let a = Answered {
            request_id: &id,
            method: "-",
            path: "-",
            route: "-",
            status: 503,
            arrival,
            client: &client,
        };
        shared.answer(&cfg, stream, &bytes, &a, true);
    };
    if shared.busy_threads.fetch_add(1, Ordering::SeqCst) < MAX_BUSY_THREADS {
        let s = shared.clone();
        let spawned = thread::Builder::new()
            .name("bgfront-busy".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                answered(&s, &mut stream);
                close_gracefully(&mut stream, &s.config());
                s.busy_threads.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // the closure (and the connection) is gone: counted, not answered
            shared.busy_threads.fetch_sub(1, Ordering::SeqCst);
            shared.stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    shared.busy_threads.fetch_sub(1, Ordering::SeqCst);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    answered(shared, &mut stream);
    let _ = stream.shutdown(Shutdown::Write);
}

/// Close after a final response: half-close, then read and drop what the client still sends
/// until it closes its side, at most `cfg.linger_idle` between two reads and `cfg.linger` in all
/// (the service's `BAYESGATE_LINGER_IDLE_S` / `BAYESGATE_LINGER_S`). Bytes still arriving at a
/// closed socket turn the close into a reset, which can take the response with it: a client
/// that writes its whole body before reading (Python's urllib) then saw "broken pipe" instead of
/// a relayed 413 (with the 1 MiB this read at most before, for any body over about 2 MiB).
fn close_gracefully(stream: &mut TcpStream, cfg: &Config) {
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
fn serve_connection(shared: &Shared, stream: &mut TcpStream, slot: &ConnSlot, client: &str) {
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
                break Some(end);
            }
            if buf.len() >= MAX_HEAD {
                break None;
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
        let Some(end) = end.filter(|&e| e <= MAX_HEAD) else {
            unframeable(stream, 431, http::HEAD_TOO_LARGE_BODY);
            return;
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
                relay::relay(&cfg.upstream, stream, &head, framing, &buf[end..])
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
