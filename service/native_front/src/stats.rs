//! Counters reported by `bgf_stats`, and the gauges behind `bgf_pending`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How many counters `bgf_stats` reports.
pub const COUNTERS: usize = 16;

/// The front end's counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests accepted onto the fast path (queued).
    pub fast_requests: AtomicU64,
    /// Images in those requests.
    pub fast_images: AtomicU64,
    /// Requests relayed to the Python service.
    pub relayed_requests: AtomicU64,
    /// Native 503 answers (queue full or stopping; not the connection limit).
    pub rejected_503: AtomicU64,
    /// Native 504 answers.
    pub timed_out_504: AtomicU64,
    /// Batches handed to Python.
    pub batches: AtomicU64,
    /// Connections accepted (and served; not those over the limit).
    pub connections_accepted: AtomicU64,
    /// Native 400 (unframeable request, malformed chunked body) and 431 (head too large) answers.
    pub bad_requests_400_native: AtomicU64,
    /// Queued jobs dropped unanswered because their client had closed the connection.
    pub client_gone: AtomicU64,
    /// Connections answered 503 `busy_body` because `max_connections` were open.
    pub rejected_connections: AtomicU64,
    /// Connections open now (gauge).
    pub open_connections: AtomicU64,
    /// Native 200 answers (fast path).
    pub answered_200: AtomicU64,
    /// Native 500 answers.
    pub errors_500: AtomicU64,
    /// Native 502 answers (the Python service unreachable).
    pub upstream_502: AtomicU64,
    /// Natively answered requests in the latency histogram.
    pub latency_count: AtomicU64,
    /// Sum of their durations, microseconds.
    pub latency_sum_us: AtomicU64,
    /// Fast-path requests not yet answered (gauge; see [`InFlight`]).
    pub fast_in_flight: AtomicU64,
    /// Relays in progress (gauge).
    pub relays_in_flight: AtomicU64,
    /// Connections waiting for their first request (gauge).
    pub awaiting_first: AtomicU64,
    /// Requests whose first bytes arrived and that are not yet queued or relayed (gauge).
    pub requests_reading: AtomicU64,
}

impl Stats {
    /// The counters in ABI order.
    pub fn snapshot(&self) -> [u64; COUNTERS] {
        [
            &self.fast_requests,
            &self.fast_images,
            &self.relayed_requests,
            &self.rejected_503,
            &self.timed_out_504,
            &self.batches,
            &self.connections_accepted,
            &self.bad_requests_400_native,
            &self.client_gone,
            &self.rejected_connections,
            &self.open_connections,
            &self.answered_200,
            &self.errors_500,
            &self.upstream_502,
            &self.latency_count,
            &self.latency_sum_us,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }

    /// `bgf_pending`: fast-path requests not yet answered plus relays in progress.
    pub fn pending(&self) -> u64 {
        self.fast_in_flight.load(Ordering::SeqCst) + self.relays_in_flight.load(Ordering::SeqCst)
    }
}

/// Holds a gauge up by one for its lifetime.
#[derive(Debug)]
pub struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    /// +1 now, -1 on drop.
    pub fn up(g: &'a AtomicU64) -> Gauge<'a> {
        g.fetch_add(1, Ordering::SeqCst);
        Gauge(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fast-path request in flight: kept by its job (queue, batch) and its connection thread, so
/// [`Stats::fast_in_flight`] counts it until it has left the queue or Python's batch *and* its
/// connection thread is done with it.
#[derive(Debug)]
pub struct InFlight(Arc<Stats>);

impl InFlight {
    /// +1 now, -1 on drop.
    pub fn new(stats: Arc<Stats>) -> InFlight {
        stats.fast_in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(stats)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fast_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_counters_and_gauges() {
        let s = Arc::new(Stats::default());
        s.client_gone.fetch_add(3, Ordering::Relaxed);
        s.latency_sum_us.fetch_add(9, Ordering::Relaxed);
        let snap = s.snapshot();
        assert_eq!(snap.len(), COUNTERS);
        assert_eq!((snap[8], snap[15]), (3, 9));
        {
            let _a = InFlight::new(s.clone());
            let _g = Gauge::up(&s.relays_in_flight);
            assert_eq!(s.pending(), 2);
        }
        assert_eq!(s.pending(), 0);
    }
}
