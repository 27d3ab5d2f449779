//! The C ABI loaded by Python with `ctypes` (see README.md). No panic crosses it: every
//! entry point runs under `catch_unwind` and reports failure through its return value.

use crate::config::Config;
use crate::server::Server;
use crate::stats::COUNTERS;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

fn write_err(err: *mut c_char, cap: usize, msg: &str) {
    if err.is_null() || cap == 0 {
        return;
    }
    let bytes = msg.as_bytes();
    let n = bytes.len().min(cap - 1);
    // SAFETY: the caller gives `cap` writable bytes at `err`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// A slice from a C pointer and length (empty for NULL).
///
/// # Safety
/// `ptr` must point to `len` readable bytes when it is not NULL.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len)
    }
}

/// # Safety
/// `h` is NULL or a handle from [`bgf_start`] not yet given to [`bgf_free`].
unsafe fn server<'a>(h: *mut c_void) -> Option<&'a Server> {
    h.cast::<Server>().as_ref()
}

/// The ABI version of this library (3).
pub const ABI_VERSION: u32 = 3;

/// The ABI version: 3.
#[no_mangle]
pub extern "C" fn bgf_abi_version() -> u32 {
    ABI_VERSION
}

/// Parse the config JSON, bind, start the acceptor. NULL (and a reason in `err`) on failure.
///
/// # Safety
/// `config` points to `config_len` bytes; `err` to `err_cap` writable bytes (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn bgf_start(
    config: *const c_char,
    config_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> *mut c_void {
    let text = bytes(config.cast(), config_len);
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<Server, String> {
        let cfg = Config::parse(text)?;
        let addr = format!("{}:{}", cfg.host, cfg.port);
        Server::start(cfg).map_err(|e| format!("cannot listen on {addr}: {e}"))
    }));
    match result {
        Ok(Ok(server)) => Box::into_raw(Box::new(server)).cast(),
        Ok(Err(msg)) => {
            write_err(err, err_cap, &msg);
            std::ptr::null_mut()
        }
        Err(_) => {
            write_err(err, err_cap, "panic while starting the native front end");
            std::ptr::null_mut()
        }
    }
}

/// The bound port (0 for a NULL handle).
///
/// # Safety
/// `h` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn bgf_port(h: *mut c_void) -> u16 {
    server(h).map(Server::port).unwrap_or(0)
}

/// Wait up to `timeout_ms` for one batch; copy its images; return the image count (0 on
/// timeout, when stopping, or on bad arguments). `*generation` = the configuration generation
/// of the batch's jobs, `*requests` = the jobs in it.
///
/// # Safety
/// `images` has room for `capacity_images × prod(input_shape)` floats of the configuration
/// current at the call; the out pointers are writable (or NULL).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn bgf_next_batch(
    h: *mut c_void,
    images: *mut f32,
    capacity_images: usize,
    timeout_ms: u32,
    batch_id: *mut u64,
    k: *mut u32,
    seed: *mut i64,
    generation: *mut u64,
    requests: *mut u32,
) -> usize {
    let Some(s) = server(h) else { return 0 };
    if images.is_null() || capacity_images == 0 {
        return 0;
    }
    let got = catch_unwind(AssertUnwindSafe(|| {
        let image_len = s.shared.config().image_len;
        let floats = capacity_images.checked_mul(image_len)?;
        // SAFETY: the caller gives room for `capacity_images` images of the current configuration.
        let out = std::slice::from_raw_parts_mut(images, floats);
        s.shared.queue.next_batch(out, Duration::from_millis(timeout_ms as u64))
    }));
    match got {
        Ok(Some(b)) => {
            for (ptr, v) in [(batch_id, b.id), (generation, b.generation)] {
                if !ptr.is_null() {
                    *ptr = v;
                }
            }
            for (ptr, v) in [(k, b.k), (requests, b.requests)] {
                if !ptr.is_null() {
                    *ptr = v;
                }
            }
            if !seed.is_null() {
                *seed = b.seed;
            }
            b.n
        }
        _ => 0,
    }
}

/// Python's answer for a batch (see README.md). 0, or -1 for an unknown id / wrong
/// `data_len` (the batch's jobs then get a 500).
///
/// # Safety
/// `prefix` and `data` point to `prefix_len` / `data_len` readable bytes (or are NULL).
#[no_mangle]
pub unsafe extern "C" fn bgf_complete(
    h: *mut c_void,
    batch_id: u64,
    status: c_int,
    prefix: *const u8,
    prefix_len: usize,
    data: *const u8,
    data_len: usize,
) -> c_int {
    let Some(s) = server(h) else { return -1 };
    let prefix = bytes(prefix, prefix_len);
    let data = bytes(data, data_len);
    catch_unwind(AssertUnwindSafe(|| {
        s.shared.queue.complete(batch_id, status, prefix, data)
    }))
    .unwrap_or(-1)
}

/// Counters (see README.md for the order): fills the first `min(n, 16)` and returns 16
/// (0 for a NULL handle).
///
/// # Safety
/// `out` has room for `n` u64 values (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn bgf_stats(h: *mut c_void, out: *mut u64, n: usize) -> usize {
    let Some(s) = server(h) else { return 0 };
    let snap = catch_unwind(AssertUnwindSafe(|| s.shared.stats.snapshot())).unwrap_or_default();
    if !out.is_null() {
        for (i, v) in snap.iter().take(n).enumerate() {
            *out.add(i) = *v;
        }
    }
    COUNTERS
}

/// The latency histogram: fills the first `min(n, buckets)` non-cumulative counts and returns
/// the number of buckets (`len(latency_buckets) + 1`, +Inf last; 0 for a NULL handle).
///
/// # Safety
/// `out` has room for `n` u64 values (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn bgf_latency_buckets(h: *mut c_void, out: *mut u64, n: usize) -> usize {
    let Some(s) = server(h) else { return 0 };
    let Ok(counts) = catch_unwind(AssertUnwindSafe(|| s.shared.latency.snapshot())) else {
        return 0;
    };
    if !out.is_null() {
        for (i, v) in counts.iter().take(n).enumerate() {
            *out.add(i) = *v;
        }
    }
    counts.len()
}

/// Make `config` (the `bgf_start` schema; `host`, `port`, `upstream`, `max_connections` and
/// `latency_buckets` ignored) the configuration of every request classified from now on, as
/// the next generation. 0, or -1 with a NUL-terminated reason in `err`.
///
/// # Safety
/// `h` is NULL or a live handle; `config` points to `config_len` bytes; `err` to `err_cap`
/// writable bytes (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn bgf_configure(
    h: *mut c_void,
    config: *const c_char,
    config_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> c_int {
    let Some(s) = server(h) else {
        write_err(err, err_cap, "no front end (NULL handle)");
        return -1;
    };
    let text = bytes(config.cast(), config_len);
    match catch_unwind(AssertUnwindSafe(|| s.shared.configure(text))) {
        Ok(Ok(_)) => 0,
        Ok(Err(msg)) => {
            write_err(err, err_cap, &msg);
            -1
        }
        Err(_) => {
            write_err(err, err_cap, "panic while configuring the native front end");
            -1
        }
    }
}

/// Refuse new connections from now on (a socket filter on the listener, Linux) while still
/// accepting those whose handshake is under way or queued: call it a moment before
/// [`bgf_drain`]. 1 when the filter is on, 0 when it could not be attached (not Linux, or the
/// listener is closed) or `h` is NULL. Idempotent.
///
/// # Safety
/// `h` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn bgf_refuse_new(h: *mut c_void) -> c_int {
    let Some(s) = server(h) else { return 0 };
    catch_unwind(AssertUnwindSafe(|| c_int::from(s.refuse_new()))).unwrap_or(0)
}

/// Drain: refuse new connections, serve the accept queue and close the listener, close idle
/// connections, answer the rest with `connection: close`; queued jobs and `bgf_next_batch`
/// keep working. Idempotent. Returns how many connections were taken from the accept queue
/// (0 on later calls, and for NULL).
///
/// # Safety
/// `h` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn bgf_drain(h: *mut c_void) -> usize {
    let Some(s) = server(h) else { return 0 };
    catch_unwind(AssertUnwindSafe(|| s.drain())).unwrap_or(0)
}

/// Fast-path requests not yet answered plus relayed requests in progress, and once draining,
/// connections still waiting for their first request (0 for NULL).
///
/// # Safety
/// `h` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn bgf_pending(h: *mut c_void) -> usize {
    let Some(s) = server(h) else { return 0 };
    catch_unwind(AssertUnwindSafe(|| s.shared.pending() as usize)).unwrap_or(0)
}

/// Stop accepting, answer queued jobs 503, wake `bgf_next_batch` (returns 0 from now on),
/// join the acceptor. The handle stays valid until [`bgf_free`].
///
/// # Safety
/// `h` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn bgf_stop(h: *mut c_void) {
    if let Some(s) = server(h) {
        let _ = catch_unwind(AssertUnwindSafe(|| s.stop()));
    }
}

/// Stop (if not yet) and free the handle. Connection threads still running keep the shared
/// state alive on their own.
///
/// # Safety
/// `h` is NULL or a live handle; no other call may use it during or after this one.
#[no_mangle]
pub unsafe extern "C" fn bgf_free(h: *mut c_void) {
    if h.is_null() {
        return;
    }
    let server = Box::from_raw(h.cast::<Server>());
    let _ = catch_unwind(AssertUnwindSafe(|| {
        server.stop();
        drop(server);
    }));
}
