//! Mutation fuzzing of the parsers a client's bytes reach: the HTTP head, the JSON header, the
//! fast-path checks and the configuration text. Valid inputs are mutated (bytes overwritten,
//! inserted, deleted, repeated, cut) by a seeded xorshift generator; nothing may panic, and
//! whatever the fast path accepts must be a request the service would take (its images the
//! model's size, every value finite and in range, K and the outputs within the configuration).

use crate::config::tests::{test_config, test_config_text};
use crate::config::Config;
use crate::fast_path::tests::{header_json, request_with};
use crate::fast_path::{check_body, check_head};
use crate::http::{find_head_end, Head};
use crate::json::{self, ParseOptions};

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes a mutation writes: JSON's and HTTP's punctuation, digits, letters, and any byte.
const ALPHABET: &[u8] = b"{}[]\":,.-+eE0123456789 \\/\r\nabcfnrtuxyzINPUT\x00\xff\xc3";

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if at < out.len() => out[at] = ALPHABET[rng.below(ALPHABET.len())],
            1 => out.insert(at, ALPHABET[rng.below(ALPHABET.len())]),
            2 if at < out.len() => {
                let end = (at + 1 + rng.below(8)).min(out.len());
                out.drain(at..end);
            }
            3 if at < out.len() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                let piece = out[at..end].to_vec();
                out.splice(at..at, piece);
            }
            4 => out.truncate(at),
            _ if at < out.len() => out[at] = rng.next() as u8,
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

const ROUNDS: usize = 40_000;

#[test]
fn json_never_panics_on_mutated_headers() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let seeds = [
        header_json(1, ""),
        header_json(
            2,
            r#","parameters":{"seed":7,"mc_samples":5,"binary_data_output":true}"#,
        ),
        header_json(1, r#","outputs":[{"name":"label","parameters":{"binary_data":true}}]"#),
        r#"{"a":[1,-2.5e-3,true,false,null,"x\"y\u00e9"],"b":{"c":{}}}"#.to_string(),
    ];
    for i in 0..ROUNDS {
        let text = mutate(&mut rng, seeds[i % seeds.len()].as_bytes());
        for options in [ParseOptions::STRICT, ParseOptions::LENIENT] {
            let _ = json::parse(&text, options);
        }
    }
}

#[test]
fn json_nesting_is_bounded_without_recursion_trouble() {
    for open in [b'[', b'{'] {
        let deep: Vec<u8> = if open == b'[' {
            vec![b'['; 1_000_000]
        } else {
            b"{\"a\":".repeat(200_000)
        };
        assert!(json::parse(&deep, ParseOptions::STRICT).is_err());
    }
}

#[test]
fn accepted_mutants_are_requests_the_service_takes() {
    let cfg = test_config();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let (mut accepted, mut refused) = (0usize, 0usize);
    let rests = [
        r#","parameters":{"binary_data_output":true}"#,
        r#","parameters":{"seed":3,"binary_data_output":true}"#,
        r#","parameters":{"mc_samples":7,"binary_data_output":true}"#,
        r#","outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]"#,
    ];
    for (i, rest) in rests.iter().enumerate() {
        let (head, body) = request_with(&header_json(1 + i % 3, rest), 1 + i % 3, "");
        let h = check_head(&cfg, &head, head.framing().unwrap()).unwrap();
        assert!(
            check_body(&cfg, h, &body).is_ok(),
            "the unmutated request {i} is accepted"
        );
    }
    for i in 0..ROUNDS {
        let n = 1 + i % 3;
        let header = header_json(n, rests[i % rests.len()]);
        let (head, body) = request_with(&header, n, "");
        // mutate the JSON header, or the whole body (header and tensor bytes together)
        let (h, body) = if rng.below(2) == 0 {
            let mutated = mutate(&mut rng, header.as_bytes());
            let mut b = mutated.clone();
            b.extend_from_slice(&body[header.len()..]);
            (mutated.len(), b)
        } else {
            (header.len(), mutate(&mut rng, &body))
        };
        let h = if rng.below(8) == 0 {
            rng.below(body.len() + 8)
        } else {
            h
        };
        let Ok(h0) = check_head(&cfg, &head, head.framing().unwrap()) else {
            panic!("the unmutated head is a fast-path head");
        };
        assert_eq!(h0, header.len());
        match check_body(&cfg, h, &body) {
            Ok(req) => {
                accepted += 1;
                assert!(req.n >= 1 && req.n as u64 <= cfg.max_instances);
                assert_eq!(req.images.len(), req.n * cfg.image_len);
                assert_eq!(body.len(), h + 4 * req.images.len());
                let (lo, hi) = cfg.input_range;
                assert!(req.images.iter().all(|&v| (v as f64) >= lo && (v as f64) <= hi));
                assert!(req.k >= 1 && u64::from(req.k) <= cfg.max_mc_samples);
                assert!(req.outputs.iter().all(|&o| o < cfg.outputs.len()));
                let header = json::parse(&body[..h], ParseOptions::STRICT);
                assert!(header.is_ok(), "accepted a header that is not JSON");
            }
            Err(_) => refused += 1,
        }
    }
    // both sides of the decision were reached (most mutants break a rule: an overwritten tensor
    // byte is rarely a value in [0, 1]; a cut header no longer parses)
    assert!(
        accepted >= 50 && refused > ROUNDS / 2,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn heads_never_panic_when_mutated() {
    let cfg = test_config();
    let mut rng = Rng(0x94D0_49BB_1331_11EB);
    let (fast, body) = request_with(&header_json(1, ""), 1, "Connection: keep-alive\r\n");
    let chunked = "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\
                   Inference-Header-Content-Length: 12\r\nExpect: 100-continue\r\n\r\n";
    let heads = [fast.raw.clone(), chunked.as_bytes().to_vec()];
    assert!(check_head(&cfg, &fast, fast.framing().unwrap()).is_ok() && !body.is_empty());
    for i in 0..ROUNDS {
        let text = mutate(&mut rng, &heads[i % 2]);
        let _ = find_head_end(&text, rng.below(text.len() + 1));
        if let Ok(h) = Head::parse(text) {
            let _ = (h.method(), h.target(), h.wants_close(), h.has("host"));
            if let Ok(framing) = h.framing() {
                let _ = check_head(&cfg, &h, framing);
            }
        }
    }
}

#[test]
fn configuration_text_never_panics_when_mutated() {
    let text = test_config_text(0, "127.0.0.1:9");
    let current = test_config();
    let mut rng = Rng(0xBF58_476D_1CE4_E5B9);
    let mut parsed = 0usize;
    for _ in 0..ROUNDS / 4 {
        let mutated = mutate(&mut rng, text.as_bytes());
        if Config::parse(&mutated).is_ok() {
            parsed += 1;
        }
        let _ = Config::parse_update(&mutated, &current);
    }
    assert!(
        parsed > 0,
        "no mutant parsed: the mutations are too coarse to test acceptance"
    );
}
