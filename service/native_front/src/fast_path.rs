//! The fast-path classifier: is a request an OIP binary `infer` the front end answers itself?
//!
//! A request is on the fast path only when every rule holds; otherwise it is relayed to the
//! Python service (never answered with a native error), which gives the exact message.
//! [`check_head`] applies the head rules (before the body is read), [`check_body`] the rest.

use crate::config::Config;
use crate::http::{parse_digits, Framing, Head};
use crate::json::{self, ParseOptions, Value};

/// Why a request goes to the Python service (for tests and debugging).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayReason {
    /// Rule 1: not POST.
    Method,
    /// Rule 1: not HTTP/1.1.
    Version,
    /// Rule 1: path is not exactly `/v2/models/<model>/infer`.
    Path,
    /// Rule 1: Content-Type is not absent / `application/octet-stream`.
    ContentType,
    /// Rule 1: `Inference-Header-Content-Length` missing, repeated, not digits or not within
    /// the body.
    HeaderLength,
    /// Rule 1: no Content-Length or more than one, or Transfer-Encoding present.
    Framing,
    /// `Expect` present (the Python service handles `100-continue`).
    Expect,
    /// `Content-Encoding` present: the service refuses a compressed body (400 on `/v2`) and
    /// takes `identity`; it judges every such head.
    Encoding,
    /// No `Host` header, or more than one.
    Host,
    /// The head is over the main port's limits (`max_header_bytes`, `max_header_count`): the
    /// service answers its own 431.
    HeadLimits,
    /// The body is larger than any fast-path request can be, or than the main port takes.
    TooLarge,
    /// Rule 2: the header is not strict JSON (or has escapes / duplicate keys / is too deep).
    Json,
    /// Rule 3: not an object, or unknown top-level keys.
    TopLevel,
    /// Rule 4: `inputs` is not the one expected input.
    Inputs,
    /// Rule 5: the binary part is not exactly `binary_data_size` bytes.
    BinarySize,
    /// Rule 6: request `parameters`.
    Parameters,
    /// Rule 7: requested `outputs`.
    Outputs,
    /// Rule 8: a selected output would not be binary.
    NotBinary,
    /// Rule 9: an image value is not finite or outside the input range.
    Values,
}

/// A request accepted onto the fast path.
#[derive(Debug, Clone, PartialEq)]
pub struct FastRequest {
    /// Images in the request.
    pub n: usize,
    /// MC samples.
    pub k: u32,
    /// The seed, if given.
    pub seed: Option<i64>,
    /// Selected outputs (indices into the served table), in response order.
    pub outputs: Vec<usize>,
    /// `n × image_len` floats.
    pub images: Vec<f32>,
}

/// Largest body a fast-path request can have (JSON header up to 64 KiB + the images).
pub fn max_fast_body(cfg: &Config) -> u64 {
    64 * 1024 + cfg.max_instances.saturating_mul(cfg.image_len as u64 * 4)
}

/// Rule 1 (and `Expect`): the head. Returns the `Inference-Header-Content-Length` value.
pub fn check_head(cfg: &Config, head: &Head, framing: Framing) -> Result<usize, RelayReason> {
    if head.method() != b"POST" {
        return Err(RelayReason::Method);
    }
    // the main port's head limits, counted as strictly as either of its checks counts them (the
    // whole head's bytes, every header line)
    if head.raw.len() as u64 > cfg.max_header_bytes || head.headers.len() as u64 > cfg.max_header_count {
        return Err(RelayReason::HeadLimits);
    }
    if !head.http11 {
        return Err(RelayReason::Version);
    }
    if head.target() != cfg.infer_path.as_bytes() {
        return Err(RelayReason::Path);
    }
    let mut ct = head.values("content-type");
    match (ct.next(), ct.next()) {
        (None, _) => {}
        // an empty value is the service's "no media type" too (urllib / tritonclient send one)
        (Some(v), None) if v.is_empty() || v.eq_ignore_ascii_case(b"application/octet-stream") => {}
        _ => return Err(RelayReason::ContentType),
    }
    let mut hl = head.values("inference-header-content-length");
    let h = match (hl.next(), hl.next()) {
        (Some(v), None) => parse_digits(v, 18).ok_or(RelayReason::HeaderLength)?,
        _ => return Err(RelayReason::HeaderLength),
    };
    // exactly one Content-Length: httptools refuses a repeated one even with equal values (400
    // "Duplicate Content-Length"), h11 takes it; either way the service's answer, not a 200 here
    let mut cl = head.values("content-length");
    if head.has("transfer-encoding") || cl.next().is_none() || cl.next().is_some() {
        return Err(RelayReason::Framing);
    }
    if head.has("expect") {
        return Err(RelayReason::Expect);
    }
    if head.has("content-encoding") {
        return Err(RelayReason::Encoding);
    }
    // HTTP/1.1 requires exactly one Host (h11 answers 400 without it): leave that to Python
    let mut host = head.values("host");
    if host.next().is_none() || host.next().is_some() {
        return Err(RelayReason::Host);
    }
    let len = match framing {
        Framing::Length(n) => n,
        Framing::Empty => 0,
        Framing::Chunked => return Err(RelayReason::Framing),
    };
    if h == 0 || h > len {
        return Err(RelayReason::HeaderLength);
    }
    if len > max_fast_body(cfg) || len > cfg.max_body_bytes {
        return Err(RelayReason::TooLarge);
    }
    Ok(h as usize)
}

fn keys_within(v: &Value<'_>, allowed: &[&str]) -> bool {
    v.as_object()
        .is_some_and(|m| m.iter().all(|(k, _)| allowed.contains(&k.as_ref())))
}

fn keys_exactly(v: &Value<'_>, keys: &[&str]) -> bool {
    v.as_object()
        .is_some_and(|m| m.len() == keys.len() && keys_within(v, keys))
}

/// Rules 2–9: the body (`h` = the JSON header's length, from [`check_head`]).
pub fn check_body(cfg: &Config, h: usize, body: &[u8]) -> Result<FastRequest, RelayReason> {
    use RelayReason as R;
    let header = body.get(..h).ok_or(R::HeaderLength)?;
    let binary = &body[h..];
    let root = json::parse(header, ParseOptions::STRICT).map_err(|_| R::Json)?;
    if !keys_within(&root, &["inputs", "parameters", "outputs"]) {
        return Err(R::TopLevel);
    }

    // Rule 4: inputs
    let inputs = root.get("inputs").and_then(Value::as_array).ok_or(R::Inputs)?;
    let [input] = inputs else { return Err(R::Inputs) };
    if !keys_exactly(input, &["name", "datatype", "shape", "parameters"])
        || input.get("name").and_then(Value::as_str) != Some(cfg.input_name.as_str())
        || input.get("datatype").and_then(Value::as_str) != Some("FP32")
    {
        return Err(R::Inputs);
    }
    let shape = input.get("shape").and_then(Value::as_array).ok_or(R::Inputs)?;
    if shape.len() != cfg.input_shape.len() + 1 {
        return Err(R::Inputs);
    }
    let dims: Vec<u64> = shape
        .iter()
        .map(Value::as_plain_u64)
        .collect::<Option<_>>()
        .ok_or(R::Inputs)?;
    let n = dims[0];
    if n < 1 || n > cfg.max_instances || dims[1..] != cfg.input_shape[..] {
        return Err(R::Inputs);
    }
    let n = n as usize;
    let params = input.get("parameters").ok_or(R::Inputs)?;
    if !keys_exactly(params, &["binary_data_size"]) {
        return Err(R::Inputs);
    }
    let expected = n as u64 * cfg.image_len as u64 * 4;
    if params.get("binary_data_size").and_then(Value::as_plain_u64) != Some(expected) {
        return Err(R::Inputs);
    }

    // Rule 5
    if binary.len() as u64 != expected {
        return Err(R::BinarySize);
    }

    // Rule 6: parameters
    let mut k = cfg.default_mc_samples;
    let mut seed = None;
    let mut binary_default = false;
    if let Some(p) = root.get("parameters") {
        let members = p.as_object().ok_or(R::Parameters)?;
        for (key, v) in members {
            match key.as_ref() {
                "mc_samples" => {
                    let m = v
                        .as_plain_u64()
                        .filter(|&m| m >= 1 && m <= cfg.max_mc_samples)
                        .ok_or(R::Parameters)?;
                    k = m as u32;
                }
                "seed" => {
                    let s = v
                        .as_plain_u64()
                        .filter(|&s| s <= i64::MAX as u64)
                        .ok_or(R::Parameters)?;
                    seed = Some(s as i64);
                }
                "binary_data_output" => match v {
                    Value::Bool(b) => binary_default = *b,
                    _ => return Err(R::Parameters),
                },
                _ => return Err(R::Parameters),
            }
        }
    }

    // Rules 7 and 8: outputs
    let selected: Vec<usize> = match root.get("outputs") {
        None => {
            if !binary_default {
                return Err(R::NotBinary);
            }
            (0..cfg.outputs.len()).collect()
        }
        Some(list) => {
            let list = list.as_array().filter(|l| !l.is_empty()).ok_or(R::Outputs)?;
            let mut chosen: Vec<(usize, bool)> = Vec::with_capacity(list.len());
            for o in list {
                if !keys_within(o, &["name", "parameters"]) {
                    return Err(R::Outputs);
                }
                let name = o.get("name").and_then(Value::as_str).ok_or(R::Outputs)?;
                let idx = cfg.outputs.iter().position(|s| s.name == name).ok_or(R::Outputs)?;
                if chosen.iter().any(|&(i, _)| i == idx) {
                    return Err(R::Outputs);
                }
                let own = match o.get("parameters") {
                    None => None,
                    Some(p) => {
                        if !keys_within(p, &["binary_data"]) {
                            return Err(R::Outputs);
                        }
                        match p.get("binary_data") {
                            None => None,
                            Some(Value::Bool(b)) => Some(*b),
                            Some(_) => return Err(R::Outputs),
                        }
                    }
                };
                chosen.push((idx, own.unwrap_or(binary_default)));
            }
            if chosen.iter().any(|&(_, b)| !b) {
                return Err(R::NotBinary);
            }
            chosen.into_iter().map(|(i, _)| i).collect()
        }
    };

    // Rule 9: values
    let (lo, hi) = cfg.input_range;
    let mut images = Vec::with_capacity(n * cfg.image_len);
    let mut ok = true;
    for c in binary.chunks_exact(4) {
        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let w = x as f64;
        ok &= w >= lo && w <= hi; // false for NaN; ±inf is outside any finite range
        images.push(x);
    }
    if !ok {
        return Err(R::Values);
    }
    Ok(FastRequest {
        n,
        k,
        seed,
        outputs: selected,
        images,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::tests::test_config;

    /// A fast-path request for the test config: `n` images of 0.5, the given JSON header.
    pub fn request_with(header: &str, n: usize, extra_head: &str) -> (Head, Vec<u8>) {
        let mut body = header.as_bytes().to_vec();
        for _ in 0..n * 4 {
            body.extend_from_slice(&0.5f32.to_le_bytes());
        }
        let head = format!(
            "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: {}\r\nContent-Length: {}\r\n{extra_head}\r\n",
            header.len(),
            body.len()
        );
        (Head::parse(head.into_bytes()).unwrap(), body)
    }

    pub fn header_json(n: usize, rest: &str) -> String {
        format!(
            r#"{{"inputs":[{{"name":"input","datatype":"FP32","shape":[{n},1,2,2],"parameters":{{"binary_data_size":{}}}}}]{rest}}}"#,
            n * 16
        )
    }

    fn classify_parts(head: &Head, body: &[u8]) -> Result<FastRequest, RelayReason> {
        let cfg = test_config();
        let h = check_head(&cfg, head, head.framing().unwrap())?;
        check_body(&cfg, h, body)
    }

    fn classify(header: &str, n: usize) -> Result<FastRequest, RelayReason> {
        let (head, body) = request_with(header, n, "");
        classify_parts(&head, &body)
    }

    const BIN: &str = r#","parameters":{"binary_data_output":true}"#;

    #[test]
    fn the_main_port_s_limits_send_a_request_to_the_service() {
        let (head, body) = request_with(&header_json(1, BIN), 1, "X-A: 1\r\n");
        let (bytes, count, len) = (head.raw.len(), head.headers.len(), body.len());
        let with = |b: usize, c: usize, l: usize| {
            let extra = format!(r#""max_header_bytes":{b},"max_header_count":{c},"max_body_bytes":{l},"max_batch""#);
            let text = crate::config::tests::test_config_text(0, "127.0.0.1:9").replacen(r#""max_batch""#, &extra, 1);
            let cfg = Config::parse(text.as_bytes()).unwrap();
            check_head(&cfg, &head, head.framing().unwrap())
        };
        assert!(with(bytes, count, len).is_ok()); // at each limit: taken
        assert_eq!(with(bytes - 1, count, len), Err(RelayReason::HeadLimits));
        assert_eq!(with(bytes, count - 1, len), Err(RelayReason::HeadLimits));
        assert_eq!(with(bytes, count, len - 1), Err(RelayReason::TooLarge));
        let cfg = test_config(); // no limits given: unbounded
        assert_eq!(
            (cfg.max_header_bytes, cfg.max_header_count, cfg.max_body_bytes),
            (u64::MAX, u64::MAX, u64::MAX)
        );
    }

    #[test]
    fn accepts_a_plain_request() {
        let r = classify(&header_json(2, BIN), 2).unwrap();
        assert_eq!(r.n, 2);
        assert_eq!(r.k, 10);
        assert_eq!(r.seed, None);
        assert_eq!(r.outputs, vec![0, 1, 2, 3]);
        assert_eq!(r.images, vec![0.5; 8]);
    }

    fn head_variant(replace: (&str, &str)) -> Result<FastRequest, RelayReason> {
        let (head, body) = request_with(&header_json(1, BIN), 1, "");
        let text = String::from_utf8(head.raw).unwrap().replacen(replace.0, replace.1, 1);
        classify_parts(&Head::parse(text.into_bytes()).unwrap(), &body)
    }

    #[test]
    fn rule1_head() {
        assert_eq!(head_variant(("POST", "PUT")), Err(RelayReason::Method));
        assert_eq!(head_variant(("HTTP/1.1", "HTTP/1.0")), Err(RelayReason::Version));
        assert_eq!(head_variant(("/infer", "/infer?x=1")), Err(RelayReason::Path));
        assert_eq!(head_variant(("/m/", "/other/")), Err(RelayReason::Path));
        assert_eq!(
            head_variant(("application/octet-stream", "application/json")),
            Err(RelayReason::ContentType)
        );
        assert_eq!(
            head_variant(("application/octet-stream", "application/octet-stream; x=1")),
            Err(RelayReason::ContentType)
        );
        assert!(head_variant(("application/octet-stream", "Application/Octet-Stream")).is_ok());
        assert!(head_variant(("Content-Type: application/octet-stream\r\n", "")).is_ok());
        assert!(head_variant(("Content-Type: application/octet-stream\r\n", "Content-Type: \r\n")).is_ok());
        assert_eq!(
            head_variant((
                "Content-Type: application/octet-stream\r\n",
                "Content-Type: a\r\nContent-Type: \r\n"
            )),
            Err(RelayReason::ContentType)
        );
        let line = format!("Inference-Header-Content-Length: {}\r\n", header_json(1, BIN).len());
        let with = |v: &str| head_variant((&line, &format!("Inference-Header-Content-Length: {v}\r\n")));
        assert!(with(&format!(" \t{}\t", header_json(1, BIN).len())).is_ok());
        assert_eq!(
            with(&format!("+{}", header_json(1, BIN).len())),
            Err(RelayReason::HeaderLength)
        );
        assert_eq!(with("0"), Err(RelayReason::HeaderLength));
        assert_eq!(with("99999"), Err(RelayReason::HeaderLength));
        assert_eq!(with("1234567890123456789"), Err(RelayReason::HeaderLength));
        assert_eq!(
            head_variant(("Host: x\r\n", "Inference-Header-Content-Length: 5\r\n")),
            Err(RelayReason::HeaderLength)
        );
        assert_eq!(
            head_variant(("Host: x\r\n", "Transfer-Encoding: chunked\r\n")),
            Err(RelayReason::Framing)
        );
        let cl = format!("Content-Length: {}\r\n", header_json(1, BIN).len() + 16);
        assert!(head_variant((&cl, &cl)).is_ok());
        assert_eq!(head_variant((&cl, &format!("{cl}{cl}"))), Err(RelayReason::Framing));
        assert_eq!(
            head_variant((
                &cl,
                &format!("{cl}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n")
            )),
            Err(RelayReason::Framing)
        );
        assert_eq!(
            head_variant(("Host: x\r\n", "Host: x\r\nExpect: 100-continue\r\n")),
            Err(RelayReason::Expect)
        );
        for coding in ["gzip", "identity", ""] {
            assert_eq!(
                head_variant(("Host: x\r\n", &format!("Host: x\r\nContent-Encoding: {coding}\r\n"))),
                Err(RelayReason::Encoding)
            );
        }
        assert_eq!(head_variant(("Host: x\r\n", "")), Err(RelayReason::Host));
        assert_eq!(
            head_variant(("Host: x\r\n", "Host: x\r\nhost: y\r\n")),
            Err(RelayReason::Host)
        );
    }

    #[test]
    fn rule2_json() {
        assert!(classify(&header_json(1, BIN), 1).is_ok());
        assert_eq!(
            classify(&header_json(1, r#","parameters":{"binary_data_output":true}x"#), 1),
            Err(RelayReason::Json)
        );
        assert_eq!(
            classify(
                &header_json(1, r#","parameters":{"binary_data_output":true},"parameters":{}"#),
                1
            ),
            Err(RelayReason::Json)
        );
        let escaped = header_json(1, BIN).replace("\"input\"", "\"inp\\u0075t\"");
        assert_eq!(classify(&escaped, 1), Err(RelayReason::Json));
    }

    #[test]
    fn rule3_top_level() {
        assert_eq!(
            classify(
                &header_json(1, r#","id":"x","parameters":{"binary_data_output":true}"#),
                1
            ),
            Err(RelayReason::TopLevel)
        );
        let (head, mut body) = request_with("[1,2,3,4]", 0, "");
        body.truncate(9);
        assert_eq!(classify_parts(&head, &body), Err(RelayReason::TopLevel));
    }

    #[test]
    fn rule4_inputs() {
        let ok = header_json(2, BIN);
        assert!(classify(&ok, 2).is_ok());
        for (from, to) in [
            ("\"input\"", "\"other\""),
            ("\"FP32\"", "\"FP64\""),
            ("[2,1,2,2]", "[2,4]"),
            ("[2,1,2,2]", "[2,1,2,2.0]"),
            ("[2,1,2,2]", "[2,1,4,1]"),
            ("\"binary_data_size\":32", "\"binary_data_size\":32,\"x\":1"),
            ("\"binary_data_size\":32", "\"binary_data_size\":32.0"),
            (
                "\"parameters\":{\"binary_data_size\":32}}]",
                "\"parameters\":{\"binary_data_size\":32},\"data\":[]}]",
            ),
        ] {
            assert_eq!(classify(&ok.replacen(from, to, 1), 2), Err(RelayReason::Inputs), "{to}");
        }
        // more than max_instances (8)
        assert_eq!(classify(&header_json(9, BIN), 9), Err(RelayReason::Inputs));
        // two inputs
        let two = ok.replacen("}]", "},{}]", 1);
        assert_eq!(classify(&two, 2), Err(RelayReason::Inputs));
    }

    #[test]
    fn rule5_binary_size() {
        // binary_data_size says 2 images, 3 are sent
        let (head, body) = request_with(&header_json(2, BIN), 3, "");
        assert_eq!(classify_parts(&head, &body), Err(RelayReason::BinarySize));
    }

    #[test]
    fn rule6_parameters() {
        let p = |s: &str| {
            classify(
                &header_json(1, &format!(r#","parameters":{{"binary_data_output":true{s}}}"#)),
                1,
            )
        };
        let r = p(r#","mc_samples":100,"seed":9223372036854775807"#).unwrap();
        assert_eq!((r.k, r.seed), (100, Some(i64::MAX)));
        for bad in [
            r#","mc_samples":0"#,
            r#","mc_samples":101"#,
            r#","mc_samples":10.0"#,
            r#","mc_samples":null"#,
            r#","seed":-1"#,
            r#","seed":9223372036854775808"#,
            r#","seed":"1""#,
            r#","other":1"#,
        ] {
            assert_eq!(p(bad), Err(RelayReason::Parameters), "{bad}");
        }
        assert_eq!(
            classify(&header_json(1, r#","parameters":{"binary_data_output":null}"#), 1),
            Err(RelayReason::Parameters)
        );
        assert_eq!(
            classify(&header_json(1, r#","parameters":[]"#), 1),
            Err(RelayReason::Parameters)
        );
    }

    #[test]
    fn rule7_outputs() {
        let o = |s: &str| {
            classify(
                &header_json(
                    1,
                    &format!(r#","outputs":{s},"parameters":{{"binary_data_output":true}}"#),
                ),
                1,
            )
        };
        assert_eq!(
            o(r#"[{"name":"score"},{"name":"probabilities","parameters":{}}]"#)
                .unwrap()
                .outputs,
            vec![2, 0]
        );
        for bad in [
            "[]",
            "{}",
            r#"[{"name":"nope"}]"#,
            r#"[{"parameters":{}}]"#,
            r#"[{"name":"label"},{"name":"label"}]"#,
            r#"[{"name":"label","x":1}]"#,
            r#"[{"name":"label","parameters":{"binary_data":1}}]"#,
            r#"[{"name":"label","parameters":{"classification":1}}]"#,
            r#"[{"name":1}]"#,
        ] {
            assert_eq!(o(bad), Err(RelayReason::Outputs), "{bad}");
        }
    }

    #[test]
    fn rule8_binary() {
        // own binary_data without the request default
        let r = classify(
            &header_json(1, r#","outputs":[{"name":"label","parameters":{"binary_data":true}}]"#),
            1,
        )
        .unwrap();
        assert_eq!(r.outputs, vec![1]);
        // no default and no outputs → JSON answer → relay
        assert_eq!(classify(&header_json(1, ""), 1), Err(RelayReason::NotBinary));
        // one output opts out
        assert_eq!(
            classify(
                &header_json(
                    1,
                    r#","outputs":[{"name":"label"},{"name":"score","parameters":{"binary_data":false}}],"parameters":{"binary_data_output":true}"#
                ),
                1
            ),
            Err(RelayReason::NotBinary)
        );
        assert_eq!(
            classify(&header_json(1, r#","outputs":[{"name":"label"}]"#), 1),
            Err(RelayReason::NotBinary)
        );
    }

    #[test]
    fn rule9_values() {
        let header = header_json(1, BIN);
        let cfg = test_config();
        let make = |vals: [f32; 4]| {
            let mut body = header.as_bytes().to_vec();
            for v in vals {
                body.extend_from_slice(&v.to_le_bytes());
            }
            check_body(&cfg, header.len(), &body)
        };
        assert!(make([0.0, 1.0, 0.25, 0.75]).is_ok());
        assert_eq!(make([0.0, 1.0000001, 0.25, 0.75]), Err(RelayReason::Values));
        assert_eq!(make([-0.0001, 0.5, 0.5, 0.5]), Err(RelayReason::Values));
        assert_eq!(make([f32::NAN, 0.5, 0.5, 0.5]), Err(RelayReason::Values));
        assert_eq!(make([0.5, f32::INFINITY, 0.5, 0.5]), Err(RelayReason::Values));
    }
}
