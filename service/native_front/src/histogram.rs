//! The latency histogram of natively answered requests (`bgf_latency_buckets`): fixed upper
//! bounds in seconds from the start configuration, plus +Inf; counts are per bucket (not
//! cumulative) and a duration `d` falls in the first bucket with `d <= bound`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Non-cumulative bucket counts.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<AtomicU64>,
}

impl Histogram {
    /// A histogram with the given upper bounds (seconds, strictly ascending) and a +Inf bucket.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Buckets, the +Inf one included.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Never: there is always the +Inf bucket.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bucket a duration falls in.
    pub fn bucket(&self, d: Duration) -> usize {
        let secs = d.as_secs_f64();
        self.bounds.partition_point(|&b| b < secs)
    }

    /// Count one duration.
    pub fn observe(&self, d: Duration) {
        self.counts[self.bucket(d)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts, in bound order, +Inf last.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_the_first_bucket_not_below_them() {
        let h = Histogram::new(&[0.005, 0.05, 0.5]);
        assert_eq!(h.len(), 4);
        assert_eq!(h.bucket(Duration::ZERO), 0);
        assert_eq!(h.bucket(Duration::from_millis(5)), 0); // le: the bound itself is inside
        assert_eq!(h.bucket(Duration::from_micros(5001)), 1);
        assert_eq!(h.bucket(Duration::from_millis(50)), 1);
        assert_eq!(h.bucket(Duration::from_millis(499)), 2);
        assert_eq!(h.bucket(Duration::from_millis(501)), 3);
        assert_eq!(h.bucket(Duration::from_secs(3600)), 3);
        for ms in [1, 2, 10, 600, 700] {
            h.observe(Duration::from_millis(ms));
        }
        assert_eq!(h.snapshot(), vec![2, 1, 0, 2]);
    }
}
