//! `bgfront`: a native HTTP/1.1 front end for the BayesGate inference service, loaded into the
//! Python process with `ctypes` (see README.md for the C ABI).
//!
//! It answers `POST /v2/models/{name}/infer` with the Open Inference Protocol binary tensor
//! extension itself — parse ([`http`], [`json`]), validate ([`fast_path`]), queue and batch
//! ([`batch_queue`]), encode ([`response`]) and write ([`server`]) — and calls into Python once
//! per batch ([`ffi`]: `bgf_next_batch` / `bgf_complete`). Every other request is relayed byte
//! for byte to the unchanged Python HTTP service ([`relay`]). It limits open connections,
//! takes new configurations as generations ([`config`], `bgf_configure`), drops jobs whose
//! client left ([`peer`]), drains gracefully (`bgf_refuse_new`, `bgf_drain`, `bgf_pending`; [`listener`]), and logs
//! ([`access_log`], [`clock`]) and times ([`histogram`], [`stats`]) what it answers itself.

pub mod access_log;
pub mod batch_queue;
pub mod clock;
pub mod config;
pub mod connection;
pub mod fast_path;
pub mod ffi;
pub mod histogram;
pub mod http;
pub mod json;
pub mod listener;
pub mod peer;
pub mod relay;
pub mod request_id;
pub mod response;
pub mod server;
pub mod stats;

#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod roundtrip_tests;
#[cfg(test)]
mod roundtrip_v2_tests;
