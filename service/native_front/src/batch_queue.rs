//! The job queue between connection threads and the Python batch thread.
//!
//! Connection threads [`BatchQueue::push`] jobs; Python's thread calls
//! [`BatchQueue::next_batch`] (one batch, FIFO, grouped by configuration generation and K) and
//! later [`BatchQueue::complete`] with the batch's outputs. Each job's answer goes back to its
//! connection thread as a complete HTTP response over a one-slot channel. A job carries the
//! configuration it was validated with (its generation): its 504/503 bodies and the output
//! table its 200 is cut with come from there.

use crate::config::Config;
use crate::http;
use crate::peer::{self, Fd};
use crate::response::{job_response, BatchLayout};
use crate::stats::{InFlight, Stats};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Body of a 500 when Python's completion does not fit the batch.
pub const INTERNAL_ERROR_BODY: &str = "{\"error\":\"internal error in the native front end\"}";

/// The [`Reply::status`] of a job dropped because its client closed the connection: nothing is
/// written.
pub const CLIENT_GONE: u16 = 0;

/// A job's answer: the complete HTTP response bytes and its status (for counters).
#[derive(Debug)]
pub struct Reply {
    /// Status code of `bytes` ([`CLIENT_GONE`]: no answer).
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
    /// The configuration the request was validated with (its generation, bodies, outputs).
    pub cfg: Arc<Config>,
    /// The client connection (peeked for a close while the job waits; owned and kept open by
    /// the connection thread until the job has left the queue).
    pub fd: Fd,
    /// Counts the request in `bgf_pending` while the job lives.
    pub in_flight: InFlight,
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

    fn time_out(&self) {
        self.answer(504, self.cfg.timeout_body.as_bytes());
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
    /// Configuration generation of every job in the batch.
    pub generation: u64,
    /// Jobs (requests) in the batch.
    pub requests: u32,
}

struct Pending {
    jobs: Vec<Arc<JobMeta>>,
    n: usize,
    cfg: Arc<Config>,
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
    stats: Arc<Stats>,
    state: Mutex<State>,
    cond: Condvar,
}

impl BatchQueue {
    /// An empty queue.
    pub fn new(stats: Arc<Stats>) -> BatchQueue {
        BatchQueue {
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
        let mut freed = 0;
        st.jobs.retain(|j| {
            if j.meta.is_dead(now) {
                j.meta.time_out();
                freed += j.meta.n;
                false
            } else {
                true
            }
        });
        st.queued_images -= freed;
    }

    /// Drop a job whose client is gone: no answer (its connection thread just ends).
    fn drop_gone(&self, meta: &JobMeta) {
        self.stats.client_gone.fetch_add(1, Ordering::Relaxed);
        meta.send(Reply {
            status: CLIENT_GONE,
            bytes: Vec::new(),
        });
    }

    /// Queue a job; gives it back when the queue is full (past its configuration's
    /// `queue_limit` images) or stopping (→ 503).
    pub fn push(&self, job: Job) -> Result<(), Job> {
        let limit = job.meta.cfg.queue_limit;
        let mut st = self.lock();
        if st.stopping {
            return Err(job);
        }
        if st.queued_images + job.meta.n > limit {
            self.purge(&mut st, Instant::now());
            if st.queued_images + job.meta.n > limit {
                return Err(job);
            }
        }
        st.queued_images += job.meta.n;
        st.jobs.push_back(job);
        drop(st);
        self.cond.notify_one();
        Ok(())
    }

    /// The connection thread gives up on its job (deadline): mark it abandoned and take it out
    /// of the queue if it is still there, so its connection is never peeked again.
    pub fn abandon(&self, meta: &Arc<JobMeta>) {
        let mut st = self.lock();
        meta.abandoned.store(true, Ordering::Release);
        if let Some(i) = st.jobs.iter().position(|j| Arc::ptr_eq(&j.meta, meta)) {
            let job = st.jobs.remove(i).expect("in range");
            st.queued_images -= job.meta.n;
        }
    }

    /// Images waiting.
    pub fn queued_images(&self) -> usize {
        self.lock().queued_images
    }

    /// Wait up to `timeout` for work and form one batch, copying its images into `out` (its
    /// whole length is room). Expired jobs are answered 504, jobs whose client closed the
    /// connection are dropped, a first job larger than `out` is answered 500. The batch takes
    /// the first live job's generation; later jobs join when of that generation, unseeded, of
    /// the same K and while the batch stays within `max_batch` (of that generation) and `out`.
    /// None on timeout or once stopping.
    pub fn next_batch(&self, out: &mut [f32], timeout: Duration) -> Option<BatchInfo> {
        let until = Instant::now() + timeout;
        let mut st = self.lock();
        let (id, taken, cfg) = loop {
            if st.stopping {
                return None;
            }
            let now = Instant::now();
            let mut first = None;
            while let Some(job) = st.jobs.pop_front() {
                st.queued_images -= job.meta.n;
                if job.meta.is_dead(now) {
                    job.meta.time_out();
                } else if peer::client_gone(job.meta.fd) {
                    self.drop_gone(&job.meta);
                } else if job.images.len() > out.len() {
                    job.meta.answer(500, INTERNAL_ERROR_BODY.as_bytes());
                } else {
                    first = Some(job);
                    break;
                }
            }
            if let Some(first) = first {
                let cfg = first.meta.cfg.clone();
                let limit = cfg.max_batch.min(out.len() / cfg.image_len);
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
                            job.meta.time_out();
                        } else if m.cfg.generation == cfg.generation
                            && m.seed.is_none()
                            && m.k == k
                            && total + m.n <= limit
                        {
                            let job = st.jobs.remove(i).expect("in range");
                            st.queued_images -= job.meta.n;
                            if peer::client_gone(job.meta.fd) {
                                self.drop_gone(&job.meta);
                            } else {
                                total += job.meta.n;
                                taken.push(job);
                            }
                        } else {
                            i += 1;
                        }
                    }
                }
                let id = st.next_id;
                st.next_id += 1;
                let jobs = taken.iter().map(|j| j.meta.clone()).collect();
                st.pending.insert(
                    id,
                    Pending {
                        jobs,
                        n: total,
                        cfg: cfg.clone(),
                    },
                );
                break (id, taken, cfg);
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
            n: at / cfg.image_len,
            k: m.k,
            seed: m.seed.unwrap_or(-1),
            generation: cfg.generation,
            requests: taken.len() as u32,
        })
    }

    /// Python's answer for batch `id`: see the crate docs. Returns 0, or -1 for an unknown id
    /// or a `data` of the wrong length (the batch's jobs then get a 500). The outputs are cut
    /// with the output table of the batch's generation.
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
        let table = &batch.cfg.outputs;
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

    /// Stop: answer every queued job 503 (its configuration's `queue_full_body`) and make
    /// `next_batch` return None from now on.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stopping = true;
        let jobs: Vec<Job> = st.jobs.drain(..).collect();
        st.queued_images = 0;
        drop(st);
        for job in jobs {
            job.meta.answer(503, job.meta.cfg.queue_full_body.as_bytes());
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
        BatchQueue::new(Arc::new(Stats::default()))
    }

    /// `next_batch` with room for `capacity` images of 4 floats.
    fn next(q: &BatchQueue, out: &mut [f32], capacity: usize, timeout: Duration) -> Option<BatchInfo> {
        q.next_batch(&mut out[..capacity * 4], timeout)
    }

    fn job(n: usize, k: u32, seed: Option<i64>, tag: f32) -> (Job, Receiver<Reply>) {
        job_with(Arc::new(test_config()), -1, n, k, seed, tag)
    }

    fn job_with(cfg: Arc<Config>, fd: Fd, n: usize, k: u32, seed: Option<i64>, tag: f32) -> (Job, Receiver<Reply>) {
        let (tx, rx) = sync_channel(1);
        let image_len = cfg.image_len;
        let meta = JobMeta {
            cfg,
            fd,
            in_flight: InFlight::new(Arc::new(Stats::default())),
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
                images: vec![tag; n * image_len],
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
        let b = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b.n, b.k, b.seed), (4, 10, -1));
        assert_eq!(tags(&out, 4), vec![1.0, 3.0, 3.0, 4.0]);
        let b2 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b2.n, b2.k), (3, 20));
        assert_eq!(tags(&out, 3), vec![2.0, 2.0, 5.0]);
        assert!(next(&q, &mut out, 64, Duration::from_millis(10)).is_none());
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
        let b1 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b1.n, b1.seed), (1, 5));
        let b2 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b2.n, b2.seed), (2, -1)); // b and d; the seeded c is skipped, stays queued
        assert_eq!(tags(&out, 2), vec![2.0, 4.0]);
        let b3 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
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
        let b = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!(b.n, 6);
        assert_eq!(
            tags(&out, 6),
            vec![1.0; 4].into_iter().chain([3.0, 3.0]).collect::<Vec<_>>()
        );
        // capacity 4: the 3 alone (5 does not fit)
        let b = next(&q, &mut out, 4, Duration::ZERO).unwrap();
        assert_eq!(b.n, 3);
        // capacity 4 < 5: that job is answered 500
        assert!(next(&q, &mut out, 4, Duration::ZERO).is_none());
        assert_eq!(keep[3].try_recv().unwrap().status, 500);
        // queue limit
        let (big, _r) = job(8, 10, None, 0.0);
        q.push(big).unwrap();
        let (big2, _r2) = job(8, 10, None, 0.0);
        q.push(big2).unwrap();
        let (over, _r3) = job(5, 10, None, 0.0);
        assert!(q.push(over).is_err());
        // a job larger than max_batch but within capacity goes alone
        let b = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!(b.n, 8);
    }

    #[test]
    fn expired_and_stop() {
        let q = queue();
        let (mut j, rx) = job(1, 10, None, 1.0);
        Arc::get_mut(&mut j.meta).unwrap().deadline = Instant::now();
        q.push(j).unwrap();
        let mut out = vec![0f32; 64 * 4];
        assert!(next(&q, &mut out, 64, Duration::ZERO).is_none());
        assert_eq!(rx.try_recv().unwrap().status, 504);
        let (j, rx) = job(1, 10, None, 1.0);
        q.push(j).unwrap();
        q.stop();
        let r = rx.try_recv().unwrap();
        assert_eq!(r.status, 503);
        assert!(String::from_utf8_lossy(&r.bytes).contains("retry-after: 1"));
        assert!(next(&q, &mut out, 64, Duration::from_millis(50)).is_none());
        let (j, _rx) = job(1, 10, None, 1.0);
        assert!(q.push(j).is_err());
    }

    #[test]
    fn batches_hold_one_generation_and_say_so() {
        let q = queue();
        let gen0 = Arc::new(test_config());
        // generation 1: input 1×3×2 (6 floats), only two outputs, max_batch 4
        let text = crate::config::tests::test_config_text(0, "x")
            .replace("[1,2,2]", "[1,3,2]")
            .replace("\"max_batch\":6", "\"max_batch\":4")
            .replace(
                r#",
                       {"name":"score","datatype":"FP64","elements":1},
                       {"name":"flagged","datatype":"BOOL","elements":1}"#,
                "",
            );
        let gen1 = Arc::new(Config::parse_update(text.as_bytes(), &gen0).unwrap());
        assert_eq!((gen1.generation, gen1.image_len, gen1.outputs.len()), (1, 6, 2));
        let mut rxs = Vec::new();
        for (cfg, n, tag) in [
            (&gen0, 1, 1.0),
            (&gen1, 2, 2.0),
            (&gen0, 2, 3.0),
            (&gen1, 1, 4.0),
            (&gen1, 2, 5.0),
        ] {
            let (j, rx) = job_with(cfg.clone(), -1, n, 10, None, tag);
            q.push(j).unwrap();
            rxs.push(rx);
        }
        let mut out = vec![0f32; 64 * 4];
        let b0 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b0.n, b0.generation, b0.requests), (3, 0, 2));
        assert_eq!(tags(&out, 3), vec![1.0, 3.0, 3.0]);
        // generation 1: 6 floats per image; max_batch 4 of that generation: 2 + 1 (the last 2 wait)
        let b1 = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((b1.n, b1.generation, b1.requests), (3, 1, 2));
        assert_eq!((out[0], out[6], out[12], out[17]), (2.0, 2.0, 4.0, 4.0));
        // the room is counted in floats: 2 images of generation 1 are 12 floats, 11 do not hold them
        assert!(q.next_batch(&mut out[..11], Duration::ZERO).is_none());
        assert_eq!(rxs[4].try_recv().unwrap().status, 500);
        // each batch is cut with its own generation's table
        let d0 = vec![1u8; BatchLayout::new(&gen0.outputs, 3).total];
        let d1 = vec![2u8; BatchLayout::new(&gen1.outputs, 3).total];
        assert_eq!(q.complete(b1.id, 200, b"{\"outputs\":[", &d0), -1); // gen-0 sized data
        assert_eq!(rxs[1].try_recv().unwrap().status, 500);
        assert_eq!(q.complete(b0.id, 200, b"{\"outputs\":[", &d0), 0);
        let r = String::from_utf8_lossy(&rxs[0].try_recv().unwrap().bytes).into_owned();
        assert!(r.contains("\"label\"") && !r.contains("\"score\":"), "{r}"); // outputs [1]
        assert!(d1.len() < d0.len());
    }

    #[test]
    fn jobs_of_closed_clients_are_dropped_unanswered() {
        use std::io::Write;
        use std::net::{Shutdown, TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns = Vec::new();
        for _ in 0..4 {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            conns.push((c, s));
        }
        let stats = Arc::new(Stats::default());
        let q = BatchQueue::new(stats.clone());
        let cfg = Arc::new(test_config());
        // 0: gone (first), 1: alive, 2: gone (would join), 3: alive with pipelined bytes
        conns[0].0.shutdown(Shutdown::Write).unwrap();
        conns[2].0.shutdown(Shutdown::Write).unwrap();
        conns[3].0.write_all(b"GET").unwrap();
        thread_sleep_ms(50);
        let mut rxs = Vec::new();
        for (i, (_, s)) in conns.iter().enumerate() {
            let (j, rx) = job_with(cfg.clone(), peer::fd_of(s), 1, 10, None, i as f32);
            q.push(j).unwrap();
            rxs.push(rx);
        }
        let mut out = vec![0f32; 64 * 4];
        let b = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        #[cfg(target_os = "linux")]
        {
            assert_eq!((b.n, b.requests), (2, 2));
            assert_eq!(tags(&out, 2), vec![1.0, 3.0]);
            for i in [0, 2] {
                let r = rxs[i].try_recv().unwrap();
                assert_eq!((r.status, r.bytes.len()), (CLIENT_GONE, 0));
            }
            assert_eq!(stats.client_gone.load(Ordering::Relaxed), 2);
        }
        #[cfg(not(target_os = "linux"))]
        assert_eq!(b.n, 4);
        assert_eq!(q.queued_images(), 0);
    }

    fn thread_sleep_ms(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn abandoned_jobs_leave_the_queue_and_pending_follows_the_jobs() {
        let stats = Arc::new(Stats::default());
        let q = BatchQueue::new(stats.clone());
        let make = |tag: f32| {
            let (tx, rx) = sync_channel(1);
            let meta = Arc::new(JobMeta {
                cfg: Arc::new(test_config()),
                fd: -1,
                in_flight: InFlight::new(stats.clone()),
                n: 2,
                k: 10,
                seed: None,
                outputs: vec![0],
                request_id: "r".into(),
                close: false,
                deadline: Instant::now() + Duration::from_secs(10),
                abandoned: AtomicBool::new(false),
                reply: tx,
            });
            (
                meta.clone(),
                Job {
                    meta,
                    images: vec![tag; 8],
                },
                rx,
            )
        };
        let (a_meta, a, _ra) = make(1.0);
        let (b_meta, b, rb) = make(2.0);
        q.push(a).unwrap();
        q.push(b).unwrap();
        assert_eq!((q.queued_images(), stats.pending()), (4, 2));
        q.abandon(&a_meta);
        drop(a_meta); // the connection thread is done with it
        assert_eq!((q.queued_images(), stats.pending()), (2, 1));
        let mut out = vec![0f32; 64 * 4];
        let batch = next(&q, &mut out, 64, Duration::ZERO).unwrap();
        assert_eq!((batch.n, out[0]), (2, 2.0));
        // in Python's hands: still pending, also once the connection thread gave up
        q.abandon(&b_meta);
        drop(b_meta);
        assert_eq!(stats.pending(), 1);
        let data = vec![0u8; BatchLayout::new(&test_config().outputs, 2).total];
        assert_eq!(q.complete(batch.id, 200, b"{", &data), 0);
        assert!(rb.try_recv().is_err()); // abandoned: no answer
        assert_eq!(stats.pending(), 0);
    }
}
