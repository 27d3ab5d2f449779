//! The job queue between connection threads and the Python batch thread.
//!
//! Connection threads [`BatchQueue::push`] jobs; Python's thread calls
//! [`BatchQueue::next_batch`] (one batch, FIFO, grouped by K) and later
//! [`BatchQueue::complete`] with the batch's outputs. Each job's answer goes back to its
//! connection thread as a complete HTTP response over a one-slot channel.

use crate::config::Config;
use crate::http;
use crate::response::{job_response, BatchLayout};
use crate::stats::Stats;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Body of a 500 when Python's completion does not fit the batch.
pub const INTERNAL_ERROR_BODY: &str = "{\"error\":\"internal error in the native front end\"}";

/// A job's answer: the complete HTTP response bytes and its status (for counters).
#[derive(Debug)]
pub struct Reply {
    /// Status code of `bytes`.
    pub status: u16,
    /// The complete response.
    pub bytes: Vec<u8>,
}

/// What the queue and the batch keep about a job (the images travel separately).
#[derive(Debug)]
pub struct JobMeta {
    /// Images.
    pub n: usize,
    /// MC samples.
    pub k: u32,
    /// Seed, if any (a seeded job is batched alone).
    pub seed: Option<i64>,
    /// Selected outputs (table indices) in response order.
    pub outputs: Vec<usize>,
    /// `x-request-id` of the response.
    pub request_id: String,
    /// Add `connection: close` to the response.
    pub close: bool,
    /// When the job is answered 504.
    pub deadline: Instant,
    /// Set by the connection thread once it gave up (answered 504 itself).
    pub abandoned: AtomicBool,
    /// Where the answer goes.
    pub reply: SyncSender<Reply>,
}

impl JobMeta {
    fn answer(&self, status: u16, body: &[u8]) {
        self.send(Reply {
            status,
            bytes: http::json_response(status, body, &self.request_id, self.close),
        });
    }

    fn send(&self, reply: Reply) {
        if !self.abandoned.load(Ordering::Acquire) {
            let _ = self.reply.try_send(reply); // the receiver may be gone; one answer per job
        }
    }

    fn is_dead(&self, now: Instant) -> bool {
        self.abandoned.load(Ordering::Acquire) || now >= self.deadline
    }
}

/// A queued job.
#[derive(Debug)]
pub struct Job {
    /// Its description.
    pub meta: Arc<JobMeta>,
    /// `n × image_len` floats.
    pub images: Vec<f32>,
}

/// A batch handed to Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    /// Id for `complete`.
    pub id: u64,
    /// Images copied.
    pub n: usize,
    /// MC samples.
    pub k: u32,
    /// Seed or -1.
    pub seed: i64,
}

struct Pending {
    jobs: Vec<Arc<JobMeta>>,
    n: usize,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    queued_images: usize,
    stopping: bool,
    next_id: u64,
    pending: HashMap<u64, Pending>,
}

/// The queue.
pub struct BatchQueue {
    cfg: Arc<Config>,
    stats: Arc<Stats>,
    state: Mutex<State>,
    cond: Condvar,
}

impl BatchQueue {
    /// An empty queue.
    pub fn new(cfg: Arc<Config>, stats: Arc<Stats>) -> BatchQueue {
        BatchQueue {
            cfg,
            stats,
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remove expired (answer 504) and abandoned jobs from the queue.
    fn purge(&self, st: &mut State, now: Instant) {
        let timeout = self.cfg.timeout_body.as_bytes();
        let mut freed = 0;
        st.jobs.retain(|j| {
            if j.meta.is_dead(now) {
                j.meta.answer(504, timeout);
                freed += j.meta.n;
                false
            } else {
                true
            }
        });
        st.queued_images -= freed;
    }

    /// Queue a job; gives it back when the queue is full or stopping (→ 503).
    pub fn push(&self, job: Job) -> Result<(), Job> {
        let mut st = self.lock();
        if st.stopping {
            return Err(job);
        }
        if st.queued_images + job.meta.n > self.cfg.queue_limit {
            self.purge(&mut st, Instant::now());
            if st.queued_images + job.meta.n > self.cfg.queue_limit {
                return Err(job);
            }
        }
        st.queued_images += job.meta.n;
        st.jobs.push_back(job);
        drop(st);
        self.cond.notify_one();
        Ok(())
    }

    /// Images waiting.
    pub fn queued_images(&self) -> usize {
        self.lock().queued_images
    }

    /// Wait up to `timeout` for work and form one batch, copying its images into `out`
    /// (`capacity` images of `image_len` floats). None on timeout or once stopping.
    pub fn next_batch(&self, out: &mut [f32], capacity: usize, timeout: Duration) -> Option<BatchInfo> {
        let image_len = self.cfg.image_len;
        let capacity = capacity.min(out.len() / image_len);
        let limit = self.cfg.max_batch.min(capacity);
        let until = Instant::now() + timeout;
        let mut st = self.lock();
        let (id, taken) = loop {
            if st.stopping {
                return None;
            }
            let now = Instant::now();
            let mut first = None;
            while let Some(job) = st.jobs.pop_front() {
                st.queued_images -= job.meta.n;
                if job.meta.is_dead(now) {
                    job.meta.answer(504, self.cfg.timeout_body.as_bytes());
                } else if job.meta.n > capacity {
                    job.meta.answer(500, INTERNAL_ERROR_BODY.as_bytes());
                } else {
                    first = Some(job);
                    break;
                }
            }
            if let Some(first) = first {
                let k = first.meta.k;
                let mut total = first.meta.n;
                let mut taken = vec![first];
                if taken[0].meta.seed.is_none() {
                    let mut i = 0;
                    while i < st.jobs.len() && total < limit {
                        let m = &st.jobs[i].meta;
                        if m.is_dead(now) {
                            let job = st.jobs.remove(i).expect("in range");
                            st.queued_images -= job.meta.n;
                            job.meta.answer(504, self.cfg.timeout_body.as_bytes());
                        } else if m.seed.is_none() && m.k == k && total + m.n <= limit {
                            let job = st.jobs.remove(i).expect("in range");
                            st.queued_images -= job.meta.n;
                            total += job.meta.n;
                            taken.push(job);
                        } else {
                            i += 1;
                        }
                    }
                }
                let id = st.next_id;
                st.next_id += 1;
                let jobs = taken.iter().map(|j| j.meta.clone()).collect();
                st.pending.insert(id, Pending { jobs, n: total });
                break (id, taken);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self.cond.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        };
        drop(st);
        let mut at = 0;
        for job in &taken {
            out[at..at + job.images.len()].copy_from_slice(&job.images);
            at += job.images.len();
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let m = &taken[0].meta;
        Some(BatchInfo {
            id,
            n: at / image_len,
            k: m.k,
            seed: m.seed.unwrap_or(-1),
        })
    }

    /// Python's answer for batch `id`: see the crate docs. Returns 0, or -1 for an unknown id
    /// or a `data` of the wrong length (the batch's jobs then get a 500).
    pub fn complete(&self, id: u64, status: i32, prefix: &[u8], data: &[u8]) -> i32 {
        let Some(batch) = self.lock().pending.remove(&id) else {
            return -1;
        };
        if status != 200 {
            let code = u16::try_from(status).ok().filter(|s| (100..=599).contains(s));
            let (code, body) = match code {
                Some(c) if c >= 200 => (c, prefix),
                _ => (500, INTERNAL_ERROR_BODY.as_bytes()),
            };
            for job in &batch.jobs {
                job.answer(code, body);
            }
            return 0;
        }
        let table = &self.cfg.outputs;
        let layout = BatchLayout::new(table, batch.n);
        if data.len() != layout.total {
            for job in &batch.jobs {
                job.answer(500, INTERNAL_ERROR_BODY.as_bytes());
            }
            return -1;
        }
        let mut row = 0;
        for job in &batch.jobs {
            if !job.abandoned.load(Ordering::Acquire) {
                let bytes = job_response(
                    prefix,
                    table,
                    &layout,
                    data,
                    &job.outputs,
                    row,
                    job.n,
                    &job.request_id,
                    job.close,
                );
                job.send(Reply { status: 200, bytes });
            }
            row += job.n;
        }
        0
    }

    /// Stop: answer every queued job 503 and make `next_batch` return None from now on.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stopping = true;
        let jobs: Vec<Job> = st.jobs.drain(..).collect();
        st.queued_images = 0;
        drop(st);
        for job in jobs {
            job.meta.answer(503, self.cfg.queue_full_body.as_bytes());
        }
        self.cond.notify_all();
    }

    /// True once [`stop`](Self::stop) ran.
    pub fn stopping(&self) -> bool {
        self.lock().stopping
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::test_config;
    use std::sync::mpsc::{sync_channel, Receiver};

    fn queue() -> BatchQueue {
        BatchQueue::new(Arc::new(test_config()), Arc::new(Stats::default()))
    }

    fn job(n: usize, k: u32, seed: Option<i64>, tag: f32) -> (Job, Receiver<Reply>) {
        let (tx, rx) = sync_channel(1);
        let meta = JobMeta {
            n,
            k,
            seed,
            outputs: vec![1],
            request_id: format!("job{tag}"),
            close: false,
            deadline: Instant::now() + Duration::from_secs(10),
            abandoned: AtomicBool::new(false),
            reply: tx,
        };
        (
            Job {
                meta: Arc::new(meta),
                images: vec![tag; n * 4],
            },
            rx,
        )
    }

    fn tags(out: &[f32], n: usize) -> Vec<f32> {
        (0..n).map(|i| out[i * 4]).collect()
    }

    #[test]
    fn groups_same_k_and_leaves_others_in_place() {
        let q = queue(); // max_batch 6
        let mut rxs = Vec::new();
        for (n, k, tag) in [(1, 10, 1.0), (2, 20, 2.0), (2, 10, 3.0), (1, 10, 4.0), (1, 20, 5.0)] {
            let (j, rx) = job(n, k, None, tag);
            q.push(j).unwrap();
            rxs.push(rx);
        }
        let mut out = vec![0f32; 64 * 4];
        let b = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b.n, b.k, b.seed), (4, 10, -1));
        assert_eq!(tags(&out, 4), vec![1.0, 3.0, 3.0, 4.0]);
        let b2 = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b2.n, b2.k), (3, 20));
        assert_eq!(tags(&out, 3), vec![2.0, 2.0, 5.0]);
        assert!(q.next_batch(&mut out, 64, Duration::from_millis(10)).is_none());
        assert_eq!(q.queued_images(), 0);
        // complete the first: label is INT64, 1 element: data = probabilities 4×12 + label 4×8 + score 4×8 + flagged 4
        let layout = BatchLayout::new(&test_config().outputs, 4);
        let data = vec![7u8; layout.total];
        assert_eq!(q.complete(b.id, 200, b"{\"outputs\":[", &data), 0);
        assert_eq!(rxs[0].try_recv().unwrap().status, 200);
        assert_eq!(rxs[2].try_recv().unwrap().status, 200);
        assert!(rxs[1].try_recv().is_err());
        // unknown id, wrong length
        assert_eq!(q.complete(b.id, 200, b"", &data), -1);
        assert_eq!(q.complete(b2.id, 200, b"", &data[..3]), -1);
        let r = rxs[1].try_recv().unwrap();
        assert_eq!(r.status, 500);
        assert!(String::from_utf8_lossy(&r.bytes).ends_with(INTERNAL_ERROR_BODY));
    }

    #[test]
    fn seeded_jobs_go_alone() {
        let q = queue();
        let (a, _ra) = job(1, 10, Some(5), 1.0);
        let (b, _rb) = job(1, 10, None, 2.0);
        let (c, _rc) = job(1, 10, Some(6), 3.0);
        let (d, _rd) = job(1, 10, None, 4.0);
        for j in [a, b, c, d] {
            q.push(j).unwrap();
        }
        let mut out = vec![0f32; 64 * 4];
        let b1 = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b1.n, b1.seed), (1, 5));
        let b2 = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b2.n, b2.seed), (2, -1)); // b and d; the seeded c is skipped, stays queued
        assert_eq!(tags(&out, 2), vec![2.0, 4.0]);
        let b3 = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b3.n, b3.seed), (1, 6));
    }

    #[test]
    fn capacity_and_max_batch() {
        let q = queue(); // max_batch 6, queue_limit 20
        let mut keep = Vec::new();
        for (n, tag) in [(4, 1.0), (3, 2.0), (2, 3.0), (5, 4.0)] {
            let (j, rx) = job(n, 10, None, tag);
            q.push(j).unwrap();
            keep.push(rx);
        }
        let mut out = vec![0f32; 64 * 4];
        // capacity 64 → limit max_batch 6: 4 + 2 (3 does not fit, stays in place)
        let b = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!(b.n, 6);
        assert_eq!(
            tags(&out, 6),
            vec![1.0; 4].into_iter().chain([3.0, 3.0]).collect::<Vec<_>>()
        );
        // capacity 4: the 3 alone (5 does not fit)
        let b = q.next_batch(&mut out, 4, Duration::ZERO).unwrap();
        assert_eq!(b.n, 3);
        // capacity 4 < 5: that job is answered 500
        assert!(q.next_batch(&mut out, 4, Duration::ZERO).is_none());
        assert_eq!(keep[3].try_recv().unwrap().status, 500);
        // queue limit
        let (big, _r) = job(8, 10, None, 0.0);
        q.push(big).unwrap();
        let (big2, _r2) = job(8, 10, None, 0.0);
        q.push(big2).unwrap();
        let (over, _r3) = job(5, 10, None, 0.0);
        assert!(q.push(over).is_err());
        // a job larger than max_batch but within capacity goes alone
        let b = q.next_batch(&mut out, 64, Duration::ZERO).unwrap();
        assert_eq!(b.n, 8);
    }

    #[test]
    fn expired_and_stop() {
        let q = queue();
        let (mut j, rx) = job(1, 10, None, 1.0);
        Arc::get_mut(&mut j.meta).unwrap().deadline = Instant::now();
        q.push(j).unwrap();
        let mut out = vec![0f32; 64 * 4];
        assert!(q.next_batch(&mut out, 64, Duration::ZERO).is_none());
        assert_eq!(rx.try_recv().unwrap().status, 504);
        let (j, rx) = job(1, 10, None, 1.0);
        q.push(j).unwrap();
        q.stop();
        let r = rx.try_recv().unwrap();
        assert_eq!(r.status, 503);
        assert!(String::from_utf8_lossy(&r.bytes).contains("retry-after: 1"));
        assert!(q.next_batch(&mut out, 64, Duration::from_millis(50)).is_none());
        let (j, _rx) = job(1, 10, None, 1.0);
        assert!(q.push(j).is_err());
    }
}
