//! Counters reported by `bgf_stats`.

use std::sync::atomic::{AtomicU64, Ordering};

/// The front end's counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests accepted onto the fast path (queued).
    pub fast_requests: AtomicU64,
    /// Images in those requests.
    pub fast_images: AtomicU64,
    /// Requests relayed to the Python service.
    pub relayed_requests: AtomicU64,
    /// Native 503 answers (queue full or stopping).
    pub rejected_503: AtomicU64,
    /// Native 504 answers.
    pub timed_out_504: AtomicU64,
    /// Batches handed to Python.
    pub batches: AtomicU64,
    /// Connections accepted.
    pub connections_accepted: AtomicU64,
    /// Native 400 (unframeable request) and 431 (head too large) answers.
    pub bad_requests_400_native: AtomicU64,
}

impl Stats {
    /// The counters in ABI order.
    pub fn snapshot(&self) -> [u64; 8] {
        [
            &self.fast_requests,
            &self.fast_images,
            &self.relayed_requests,
            &self.rejected_503,
            &self.timed_out_504,
            &self.batches,
            &self.connections_accepted,
            &self.bad_requests_400_native,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}
