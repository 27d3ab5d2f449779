//! The configuration JSON given by Python to `bgf_start`.

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

/// The front end's settings.
#[derive(Debug, Clone)]
pub struct Config {
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
}

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

fn uint(root: &Value<'_>, key: &str) -> Result<u64, String> {
    field(root, key)?
        .as_plain_u64()
        .ok_or_else(|| format!("config: {key:?} must be a non-negative integer"))
}

impl Config {
    /// Parse and check the configuration text.
    pub fn parse(text: &[u8]) -> Result<Config, String> {
        let root = json::parse(text, ParseOptions::LENIENT).map_err(|e| format!("config: not JSON ({e:?})"))?;
        if root.as_object().is_none() {
            return Err("config: expected an object".into());
        }
        let port = uint(&root, "port")?;
        let port = u16::try_from(port).map_err(|_| "config: \"port\" out of range".to_string())?;
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
        let cfg = Config {
            host: string(&root, "host")?,
            port,
            upstream: string(&root, "upstream")?,
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
            "queue_full_body":"{{\"error\":\"queue full\"}}","timeout_body":"{{\"error\":\"timed out\"}}"}}"#
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
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(Config::parse(b"[]").is_err());
        let t = test_config_text(0, "x").replace("\"FP64\"", "\"FP16\"");
        assert!(Config::parse(t.as_bytes()).is_err());
    }
}
