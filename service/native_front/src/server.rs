//! The listener, the acceptor thread, the connection registry and the drain.
//!
//! Each accepted connection is served on a thread of its own ([`crate::connection`]). Over
//! `max_connections` open connections a new one is answered 503 `busy_body` and closed.
//! While draining ([`Server::drain`]) the listener is closed — its accept queue taken and served
//! first ([`crate::listener`]) — connections idle between requests are closed (a registry of
//! connection slots: idle ones are shut down for reading) and every response carries
//! `connection: close`. A connection that has not sent its first request yet is not idle at
//! once: it may send one until `first_request_grace` after the drain began.

use crate::access_log::{AccessLog, Entry};
use crate::batch_queue::BatchQueue;
use crate::config::Config;
use crate::connection::{close_gracefully, serve_connection, ConnSlot, BUSY, FIRST, IDLE, SHUT};
use crate::histogram::Histogram;
use crate::http;
use crate::listener::{self, Wake};
use crate::peer::{self, Peek};
use crate::request_id;
use crate::stats::Stats;
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Most threads answering connections over the limit at once; past it the 503 is written by
/// the acceptor itself, without the graceful drain.
const MAX_BUSY_THREADS: u64 = 64;

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
    pub(crate) first_grace_over: AtomicBool,
    /// Tests: leave connections in the accept queue until the listener closes.
    #[cfg(test)]
    pub(crate) hold_accepts: AtomicBool,
    /// Tests: pause this long between the closing acceptor's filter and its last accept.
    #[cfg(test)]
    pub(crate) pause_before_last_accept: Mutex<Duration>,
    /// Tests: fail this many of the next `accept` calls with EMFILE.
    #[cfg(test)]
    pub(crate) fail_accepts: AtomicU64,
}

/// What the access log and the histogram get about a native answer (the duration and bytes
/// are added once it is written).
pub(crate) struct Answered<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) route: &'a str,
    pub(crate) status: u16,
    pub(crate) arrival: Instant,
    pub(crate) client: &'a str,
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
    pub(crate) fn answer(
        &self,
        cfg: &Config,
        stream: &mut TcpStream,
        bytes: &[u8],
        a: &Answered<'_>,
        busy: bool,
    ) -> bool {
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
            #[cfg(test)]
            fail_accepts: AtomicU64::new(0),
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
        // held through the join: a concurrent caller returns once the queue is served; only
        // the caller that takes the handle gets the count
        let mut acceptor = self.acceptor.lock().unwrap_or_else(|p| p.into_inner());
        let taken = acceptor.take().map_or(0, |h| h.join().unwrap_or(0));
        drop(acceptor);
        self.listener.lock().unwrap_or_else(|p| p.into_inner()).take(); // the socket closes
        taken
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
        #[cfg(test)]
        let injected = shared
            .fail_accepts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
            .is_ok();
        #[cfg(not(test))]
        let injected = false;
        let accepted = if injected {
            Err(io::Error::from_raw_os_error(24)) // EMFILE
        } else {
            listener.accept()
        };
        match accepted {
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
    // accepted sockets inherit the listener's O_NONBLOCK on the BSDs and macOS (not on Linux)
    #[cfg(not(target_os = "linux"))]
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
