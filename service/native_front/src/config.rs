//! The configuration JSON given by Python to `bgf_start` (and, replacing the per-request part,
//! to `bgf_configure`).

use crate::json::{self, ParseOptions, Value};
use std::time::Duration;

/// One output of the served table.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputSpec {
    /// Output name (as in the response JSON).
    pub name: String,
    /// OIP datatype (`FP32`, `FP64`, `INT32`, `INT64`, `BOOL`).
    pub datatype: String,
    /// Elements per image (1 → shape `[n]`, else `[n, elements]`).
    pub elements: usize,
    /// Bytes per element.
    pub itemsize: usize,
}

impl OutputSpec {
    /// Bytes of one image's row of this output.
    pub fn row_bytes(&self) -> usize {
        self.elements * self.itemsize
    }
}

/// How access-log lines are written (see `access_log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object per line (the service's `JsonFormatter` shape).
    Json,
    /// `INFO:     <message>` (uvicorn's text shape).
    Text,
    /// No access log.
    Off,
}

/// The front end's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// 0 for the start configuration, +1 for each successful `bgf_configure`.
    pub generation: u64,
    /// Public listen host.
    pub host: String,
    /// Public listen port (0 = ephemeral).
    pub port: u16,
    /// The Python service, `host:port`.
    pub upstream: String,
    /// The served model's name.
    pub model_name: String,
    /// The one input's name.
    pub input_name: String,
    /// One image's shape (without the batch dimension).
    pub input_shape: Vec<u64>,
    /// `prod(input_shape)`: floats per image.
    pub image_len: usize,
    /// Inclusive value range of the input.
    pub input_range: (f64, f64),
    /// Most images per request.
    pub max_instances: u64,
    /// Most MC samples per request.
    pub max_mc_samples: u64,
    /// MC samples when the request does not say.
    pub default_mc_samples: u32,
    /// The served output table, default order.
    pub outputs: Vec<OutputSpec>,
    /// Most images per batch.
    pub max_batch: usize,
    /// Most images waiting in the queue.
    pub queue_limit: usize,
    /// Time from arrival to a 504.
    pub request_timeout: Duration,
    /// Body of a native 503.
    pub queue_full_body: String,
    /// Body of a native 504.
    pub timeout_body: String,
    /// `/v2/models/<model_name>/infer`
    pub infer_path: String,
    /// Most open client connections (start value only).
    pub max_connections: usize,
    /// Body of the native 503 for a connection over `max_connections`.
    pub busy_body: String,
    /// Access-log format.
    pub access_log: AccessLogFormat,
    /// The Python process id (written into JSON access-log lines).
    pub pid: u64,
    /// Upper bounds (seconds, strictly ascending) of the latency histogram (start value only).
    pub latency_buckets: Vec<f64>,
    /// An idle keep-alive connection is closed after this (`idle_timeout_ms`, default 75 s;
    /// start value only).
    pub idle_timeout: Duration,
    /// Longest wait for the next bytes of a request on its way (`read_timeout_ms`, default
    /// 75 s; start value only); the connection is closed after it.
    pub read_timeout: Duration,
    /// The main port's head limits (`max_header_bytes`, `max_header_count`; unbounded when
    /// absent): a request whose head passes either is relayed, for the service's own 431.
    pub max_header_bytes: u64,
    /// See [`Config::max_header_bytes`].
    pub max_header_count: u64,
    /// The main port's body limit (`max_body_bytes`; unbounded when absent): a larger
    /// `Content-Length` is relayed, for the service's own 413.
    pub max_body_bytes: u64,
    /// After a response that closes the connection, what the client still sends is read and
    /// dropped (so it does not turn the close into a reset that loses the response) until it
    /// closes its side, for at most this long in all (`linger_ms`, default 10 s; 0 = at once:
    /// the service's `BAYESGATE_LINGER_S`) …
    pub linger: Duration,
    /// … and at most this long between two reads (`linger_idle_ms`, default 2 s:
    /// `BAYESGATE_LINGER_IDLE_S`).
    pub linger_idle: Duration,
    /// From the drain's start, how long a connection that has not sent its first request may
    /// still send it (`first_request_grace_ms`, default 250 ms: the time the service's port
    /// still takes relays after the native drain); then it is closed as an idle one.
    pub first_request_grace: Duration,
}

/// `idle_timeout_ms` / `read_timeout_ms` when the start configuration does not give them.
pub const DEFAULT_TIMEOUT_MS: u64 = 75_000;
/// `linger_ms` / `linger_idle_ms` when the configuration does not give them (the service's
/// defaults).
pub const DEFAULT_LINGER_MS: u64 = 10_000;
/// See [`DEFAULT_LINGER_MS`].
pub const DEFAULT_LINGER_IDLE_MS: u64 = 2_000;
/// `first_request_grace_ms` when the configuration does not give it.
pub const DEFAULT_FIRST_REQUEST_GRACE_MS: u64 = 250;

/// Itemsize of an OIP datatype the front end can slice.
pub fn itemsize(datatype: &str) -> Option<usize> {
    match datatype {
        "FP32" | "INT32" => Some(4),
        "FP64" | "INT64" => Some(8),
        "BOOL" => Some(1),
        _ => None,
    }
}

fn field<'a, 'v>(root: &'v Value<'a>, key: &str) -> Result<&'v Value<'a>, String> {
    root.get(key).ok_or_else(|| format!("config: missing {key:?}"))
}

fn string(root: &Value<'_>, key: &str) -> Result<String, String> {
    field(root, key)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("config: {key:?} must be a string"))
}

/// An optional positive number of milliseconds (`default` when the key is absent).
fn millis(root: &Value<'_>, key: &str, default: u64) -> Result<Duration, String> {
    let ms = match root.get(key) {
        None => default,
        Some(_) => uint(root, key)?,
    };
    if ms == 0 {
        return Err(format!("config: {key:?} must be positive"));
    }
    Ok(Duration::from_millis(ms))
}

/// An optional non-negative integer (`default` when the key is absent).
fn opt_uint(root: &Value<'_>, key: &str, default: u64) -> Result<u64, String> {
    match root.get(key) {
        None => Ok(default),
        Some(_) => uint(root, key),
    }
}

fn uint(root: &Value<'_>, key: &str) -> Result<u64, String> {
    field(root, key)?
        .as_plain_u64()
        .ok_or_else(|| format!("config: {key:?} must be a non-negative integer"))
}

/// The settings fixed at start: taken from the start configuration, ignored by `bgf_configure`.
struct StartOnly {
    host: String,
    port: u16,
    upstream: String,
    max_connections: usize,
    latency_buckets: Vec<f64>,
    idle_timeout: Duration,
    read_timeout: Duration,
}

impl StartOnly {
    fn parse(root: &Value<'_>) -> Result<StartOnly, String> {
        let port = uint(root, "port")?;
        let port = u16::try_from(port).map_err(|_| "config: \"port\" out of range".to_string())?;
        let max_connections = usize::try_from(uint(root, "max_connections")?)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or("config: \"max_connections\" must be at least 1")?;
        let buckets = field(root, "latency_buckets")?
            .as_array()
            .ok_or("config: \"latency_buckets\" must be an array")?;
        let latency_buckets: Vec<f64> = buckets
            .iter()
            .map(|v| {
                v.as_f64()
                    .filter(|b| b.is_finite())
                    .ok_or("config: latency_buckets entries must be finite numbers")
            })
            .collect::<Result<_, _>>()?;
        if latency_buckets.is_empty() || latency_buckets.windows(2).any(|w| w[0] >= w[1]) {
            return Err("config: \"latency_buckets\" must be non-empty and strictly ascending".into());
        }
        Ok(StartOnly {
            host: string(root, "host")?,
            port,
            upstream: string(root, "upstream")?,
            max_connections,
            latency_buckets,
            idle_timeout: millis(root, "idle_timeout_ms", DEFAULT_TIMEOUT_MS)?,
            read_timeout: millis(root, "read_timeout_ms", DEFAULT_TIMEOUT_MS)?,
        })
    }

    fn of(cfg: &Config) -> StartOnly {
        StartOnly {
            host: cfg.host.clone(),
            port: cfg.port,
            upstream: cfg.upstream.clone(),
            max_connections: cfg.max_connections,
            latency_buckets: cfg.latency_buckets.clone(),
            idle_timeout: cfg.idle_timeout,
            read_timeout: cfg.read_timeout,
        }
    }
}

impl Config {
    /// Parse and check the start configuration text (generation 0).
    pub fn parse(text: &[u8]) -> Result<Config, String> {
        Config::parse_inner(text, None)
    }

    /// Parse a `bgf_configure` text against the running configuration `current`: `host`,
    /// `port`, `upstream`, `max_connections` and `latency_buckets` are ignored (they may be
    /// absent) and keep `current`'s values; the generation is `current`'s + 1.
    pub fn parse_update(text: &[u8], current: &Config) -> Result<Config, String> {
        Config::parse_inner(text, Some(current))
    }

    fn parse_inner(text: &[u8], current: Option<&Config>) -> Result<Config, String> {
        let root = json::parse(text, ParseOptions::LENIENT).map_err(|e| format!("config: not JSON ({e:?})"))?;
        if root.as_object().is_none() {
            return Err("config: expected an object".into());
        }
        let fixed = match current {
            None => StartOnly::parse(&root)?,
            Some(c) => StartOnly::of(c),
        };
        let input_shape: Vec<u64> = field(&root, "input_shape")?
            .as_array()
            .ok_or("config: \"input_shape\" must be an array")?
            .iter()
            .map(|v| {
                v.as_plain_u64()
                    .filter(|&d| d > 0)
                    .ok_or("config: input_shape entries must be positive integers")
            })
            .collect::<Result<_, _>>()?;
        let image_len = input_shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0 && n < (1 << 30))
            .ok_or("config: input_shape too large")?;
        let range = field(&root, "input_range")?
            .as_array()
            .ok_or("config: \"input_range\" must be [lo, hi]")?;
        let (lo, hi) = match range {
            [lo, hi] => (
                lo.as_f64().ok_or("config: input_range lo must be a number")?,
                hi.as_f64().ok_or("config: input_range hi must be a number")?,
            ),
            _ => return Err("config: \"input_range\" must be [lo, hi]".into()),
        };
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err("config: input_range must be finite with lo <= hi".into());
        }
        let mut outputs = Vec::new();
        for o in field(&root, "outputs")?
            .as_array()
            .ok_or("config: \"outputs\" must be an array")?
        {
            let name = string(o, "name")?;
            let datatype = string(o, "datatype")?;
            let size = itemsize(&datatype).ok_or_else(|| format!("config: unsupported datatype {datatype:?}"))?;
            let elements = uint(o, "elements")? as usize;
            if elements == 0 {
                return Err(format!("config: output {name:?} has 0 elements"));
            }
            if name.contains(['"', '\\']) || name.chars().any(|c| c < ' ') {
                return Err(format!("config: output name {name:?} needs JSON escaping"));
            }
            if outputs.iter().any(|x: &OutputSpec| x.name == name) {
                return Err(format!("config: output {name:?} twice"));
            }
            outputs.push(OutputSpec {
                name,
                datatype,
                elements,
                itemsize: size,
            });
        }
        if outputs.is_empty() {
            return Err("config: \"outputs\" is empty".into());
        }
        let model_name = string(&root, "model_name")?;
        let default_mc = uint(&root, "default_mc_samples")?;
        let max_mc = uint(&root, "max_mc_samples")?;
        if default_mc == 0 || default_mc > u32::MAX as u64 || max_mc > u32::MAX as u64 {
            return Err("config: mc sample counts out of range".into());
        }
        let max_batch = uint(&root, "max_batch")? as usize;
        if max_batch == 0 {
            return Err("config: max_batch must be positive".into());
        }
        let access_log = match string(&root, "access_log")?.as_str() {
            "json" => AccessLogFormat::Json,
            "text" => AccessLogFormat::Text,
            "off" => AccessLogFormat::Off,
            other => {
                return Err(format!(
                    "config: \"access_log\" must be json, text or off, not {other:?}"
                ))
            }
        };
        let cfg = Config {
            generation: current.map_or(0, |c| c.generation + 1),
            host: fixed.host,
            port: fixed.port,
            upstream: fixed.upstream,
            max_connections: fixed.max_connections,
            latency_buckets: fixed.latency_buckets,
            idle_timeout: fixed.idle_timeout,
            read_timeout: fixed.read_timeout,
            busy_body: string(&root, "busy_body")?,
            access_log,
            pid: uint(&root, "pid")?,
            infer_path: format!("/v2/models/{model_name}/infer"),
            model_name,
            input_name: string(&root, "input_name")?,
            input_shape,
            image_len,
            input_range: (lo, hi),
            max_instances: uint(&root, "max_instances")?,
            max_mc_samples: max_mc,
            default_mc_samples: default_mc as u32,
            outputs,
            max_batch,
            queue_limit: uint(&root, "queue_limit")? as usize,
            request_timeout: Duration::from_millis(uint(&root, "request_timeout_ms")?),
            queue_full_body: string(&root, "queue_full_body")?,
            timeout_body: string(&root, "timeout_body")?,
            max_header_bytes: opt_uint(&root, "max_header_bytes", u64::MAX)?,
            max_header_count: opt_uint(&root, "max_header_count", u64::MAX)?,
            max_body_bytes: opt_uint(&root, "max_body_bytes", u64::MAX)?,
            linger: Duration::from_millis(opt_uint(&root, "linger_ms", DEFAULT_LINGER_MS)?),
            linger_idle: millis(&root, "linger_idle_ms", DEFAULT_LINGER_IDLE_MS)?,
            first_request_grace: Duration::from_millis(opt_uint(
                &root,
                "first_request_grace_ms",
                DEFAULT_FIRST_REQUEST_GRACE_MS,
            )?),
        };
        Ok(cfg)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A configuration for tests (model `m`, input 1×2×2 in [0, 1], four outputs).
    pub fn test_config_text(port: u16, upstream: &str) -> String {
        format!(
            r#"{{"host":"127.0.0.1","port":{port},"upstream":"{upstream}",
            "model_name":"m","input_name":"input","input_shape":[1,2,2],"input_range":[0.0,1.0],
            "max_instances":8,"max_mc_samples":100,"default_mc_samples":10,
            "outputs":[{{"name":"probabilities","datatype":"FP32","elements":3}},
                       {{"name":"label","datatype":"INT64","elements":1}},
                       {{"name":"score","datatype":"FP64","elements":1}},
                       {{"name":"flagged","datatype":"BOOL","elements":1}}],
            "max_batch":6,"queue_limit":20,"request_timeout_ms":2000,
            "queue_full_body":"{{\"error\":\"queue full\"}}","timeout_body":"{{\"error\":\"timed out\"}}",
            "max_connections":64,"busy_body":"{{\"error\":\"busy\"}}","access_log":"off","pid":4242,
            "latency_buckets":[0.005,0.05,0.5,5]}}"#
        )
    }

    pub fn test_config() -> Config {
        Config::parse(test_config_text(0, "127.0.0.1:9").as_bytes()).unwrap()
    }

    #[test]
    fn parses_the_test_config() {
        let c = test_config();
        assert_eq!(c.image_len, 4);
        assert_eq!(c.outputs.len(), 4);
        assert_eq!(c.outputs[1].itemsize, 8);
        assert_eq!(c.queue_full_body, "{\"error\":\"queue full\"}");
        assert_eq!(c.infer_path, "/v2/models/m/infer");
        assert_eq!(c.generation, 0);
        assert_eq!(c.max_connections, 64);
        assert_eq!(c.busy_body, "{\"error\":\"busy\"}");
        assert_eq!(c.access_log, AccessLogFormat::Off);
        assert_eq!(c.pid, 4242);
        assert_eq!(c.latency_buckets, vec![0.005, 0.05, 0.5, 5.0]);
    }

    #[test]
    fn linger_times_default_to_the_service_and_zero_turns_lingering_off() {
        let c = test_config();
        assert_eq!(c.linger, Duration::from_secs(10));
        assert_eq!(c.linger_idle, Duration::from_secs(2));
        let text = test_config_text(0, "127.0.0.1:9");
        let with = |extra: &str| text.replace("\"pid\":4242", &format!("\"pid\":4242,{extra}"));
        let c = Config::parse(with("\"linger_ms\":0,\"linger_idle_ms\":150").as_bytes()).unwrap();
        assert_eq!(c.linger, Duration::ZERO);
        assert_eq!(c.linger_idle, Duration::from_millis(150));
        let err = Config::parse(with("\"linger_idle_ms\":0").as_bytes()).unwrap_err();
        assert!(err.contains("linger_idle_ms"), "{err}");
        let err = Config::parse(with("\"linger_ms\":-1").as_bytes()).unwrap_err();
        assert!(err.contains("linger_ms"), "{err}");
    }

    #[test]
    fn new_keys_are_checked() {
        let base = test_config_text(0, "x");
        for (from, to) in [
            ("\"max_connections\":64", "\"max_connections\":0"),
            ("\"max_connections\":64,", ""),
            ("\"busy_body\":\"{\\\"error\\\":\\\"busy\\\"}\",", ""),
            ("\"access_log\":\"off\"", "\"access_log\":\"yes\""),
            ("\"pid\":4242", "\"pid\":-1"),
            ("[0.005,0.05,0.5,5]", "[]"),
            ("[0.005,0.05,0.5,5]", "[0.05,0.005]"),
            ("[0.005,0.05,0.5,5]", "[0.5,0.5]"),
            ("[0.005,0.05,0.5,5]", "0.5"),
        ] {
            let t = base.replacen(from, to, 1);
            assert_ne!(t, base, "{from}");
            assert!(Config::parse(t.as_bytes()).is_err(), "{to}");
        }
        let t = base.replace("\"access_log\":\"off\"", "\"access_log\":\"text\"");
        assert_eq!(Config::parse(t.as_bytes()).unwrap().access_log, AccessLogFormat::Text);
    }

    #[test]
    fn an_update_keeps_the_start_only_settings() {
        let start = Config::parse(test_config_text(8080, "127.0.0.1:9").as_bytes()).unwrap();
        // start-only keys may be absent or anything
        let text = test_config_text(1, "other:1")
            .replace("\"host\":\"127.0.0.1\",", "")
            .replace("\"max_connections\":64", "\"max_connections\":\"x\"")
            .replace("[0.005,0.05,0.5,5]", "[]")
            .replace("\"model_name\":\"m\"", "\"model_name\":\"m2\"")
            .replace("\"access_log\":\"off\"", "\"access_log\":\"json\"");
        let next = Config::parse_update(text.as_bytes(), &start).unwrap();
        assert_eq!(next.generation, 1);
        assert_eq!((next.host.as_str(), next.port), ("127.0.0.1", 8080));
        assert_eq!(next.upstream, "127.0.0.1:9");
        assert_eq!(next.max_connections, 64);
        assert_eq!(next.latency_buckets, start.latency_buckets);
        assert_eq!(next.infer_path, "/v2/models/m2/infer");
        assert_eq!(next.access_log, AccessLogFormat::Json);
        assert_eq!(Config::parse_update(text.as_bytes(), &next).unwrap().generation, 2);
        // the per-request keys are still required
        let bad = text.replace("\"pid\":4242,", "");
        assert!(Config::parse_update(bad.as_bytes(), &start).is_err());
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(Config::parse(b"[]").is_err());
        let t = test_config_text(0, "x").replace("\"FP64\"", "\"FP16\"");
        assert!(Config::parse(t.as_bytes()).is_err());
    }
}
