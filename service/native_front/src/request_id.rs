//! `x-request-id` values: the client's own when it is 1–128 safe characters (as the Python
//! service's `accept_request_id`, `[A-Za-z0-9._:/+=@-]{1,128}`), else 32 lowercase hex digits
//! unique per request (a random per-process prefix, then a counter put through a bijective mix).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

struct Ids {
    prefix: u64,
    key: u64,
    counter: AtomicU64,
}

fn random_u64(salt: u64) -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

fn ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(|| Ids {
        prefix: random_u64(1),
        key: random_u64(2),
        counter: AtomicU64::new(random_u64(3)),
    })
}

/// splitmix64's finalizer: a bijection on u64, so distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A fresh 32-hex-digit id.
pub fn new_id() -> String {
    let ids = ids();
    let n = ids.counter.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}{:016x}", ids.prefix, mix(n ^ ids.key))
}

/// True when a client's `X-Request-ID` value is kept as is.
pub fn acceptable(value: &[u8]) -> bool {
    (1..=128).contains(&value.len())
        && value
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"._:/+=@-".contains(&b))
}

/// The id for a request that offered `offered` (its first `X-Request-ID`, if any).
pub fn for_request(offered: Option<&[u8]>) -> String {
    match offered {
        Some(v) if acceptable(v) => String::from_utf8_lossy(v).into_owned(),
        _ => new_id(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_and_unique() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_ne!(a, b);
        assert_eq!(for_request(Some(b"abc-1")), "abc-1");
        assert_eq!(for_request(Some(b"bad id")).len(), 32);
    }
}
