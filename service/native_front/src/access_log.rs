//! Access-log lines for the requests the front end answers itself (relayed requests are logged
//! by the Python service). One line per request, built in a buffer and written with one
//! `write_all` to stderr (or to a sink set for tests).
//!
//! JSON (the service's `JsonFormatter` shape, Python `json.dumps` separators, key order fixed):
//!
//! ```text
//! {"ts": "2026-11-22T10:04:05.123+00:00", "level": "info", "logger": "bayesgate.access", "message": "POST /v2/models/m/infer 200", "pid": 4242, "request_id": "…", "method": "POST", "path": "/v2/models/m/infer", "route": "/v2/models/{name}/infer", "status": 200, "duration_ms": 1.234, "bytes_sent": 5678, "client": "127.0.0.1:54321", "front": "native"}
//! ```
//!
//! Text: `INFO:     POST /v2/models/m/infer 200`.

use crate::clock;
use crate::config::AccessLogFormat;
use std::io::{self, Write};
use std::sync::Mutex;
use std::time::Duration;

/// The route of a fast-path request (the service's route template).
pub const INFER_ROUTE: &str = "/v2/models/{name}/infer";

/// What is logged about one natively answered request.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The response's `x-request-id`.
    pub request_id: &'a str,
    /// Method, or `-` when the head could not be parsed.
    pub method: &'a str,
    /// Path (request target without its query), or `-`.
    pub path: &'a str,
    /// Route template (fast path), else the path.
    pub route: &'a str,
    /// Status sent.
    pub status: u16,
    /// Request head complete → response written.
    pub duration: Duration,
    /// Bytes of the response written (0 when the write failed).
    pub bytes_sent: u64,
    /// Peer `ip:port` (None → JSON `null`).
    pub client: Option<&'a str>,
}

/// Append `s` as a JSON string (as `json.dumps(..., ensure_ascii=False)`).
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(round(x, 3))`: correctly rounded to 3 decimals, then the shortest text that
/// reads back as that float, with `.0` for whole numbers.
pub fn py_round3(x: f64) -> String {
    let rounded: f64 = format!("{x:.3}").parse().unwrap_or(x);
    let mut s = format!("{rounded}");
    if rounded.is_finite() && !s.contains('.') {
        s.push_str(".0");
    }
    s
}

/// A duration in milliseconds as the service logs it (`round(seconds * 1000, 3)`).
pub fn duration_ms(d: Duration) -> String {
    py_round3(d.as_nanos() as f64 / 1e6)
}

/// The request target without its query string (the service never logs queries).
pub fn path_of(target: &[u8]) -> String {
    let end = target.iter().position(|&b| b == b'?').unwrap_or(target.len());
    String::from_utf8_lossy(&target[..end]).into_owned()
}

/// One complete line (with its `\n`), or None when the log is off. `ts` is the
/// `clock::iso_utc_millis` text of the time the response was written.
pub fn line(format: AccessLogFormat, pid: u64, ts: &str, e: &Entry<'_>) -> Option<Vec<u8>> {
    let message = format!("{} {} {}", e.method, e.path, e.status);
    let mut out = String::with_capacity(400);
    match format {
        AccessLogFormat::Off => return None,
        AccessLogFormat::Text => {
            out.push_str("INFO:     ");
            out.push_str(&message);
        }
        AccessLogFormat::Json => {
            out.push_str("{\"ts\": ");
            json_string(&mut out, ts);
            out.push_str(", \"level\": \"info\", \"logger\": \"bayesgate.access\", \"message\": ");
            json_string(&mut out, &message);
            out.push_str(&format!(", \"pid\": {pid}, \"request_id\": "));
            json_string(&mut out, e.request_id);
            out.push_str(", \"method\": ");
            json_string(&mut out, e.method);
            out.push_str(", \"path\": ");
            json_string(&mut out, e.path);
            out.push_str(", \"route\": ");
            json_string(&mut out, e.route);
            out.push_str(&format!(
                ", \"status\": {}, \"duration_ms\": {}, \"bytes_sent\": {}, \"client\": ",
                e.status,
                duration_ms(e.duration),
                e.bytes_sent
            ));
            match e.client {
                Some(c) => json_string(&mut out, c),
                None => out.push_str("null"),
            }
            out.push_str(", \"front\": \"native\"}");
        }
    }
    out.push('\n');
    Some(out.into_bytes())
}

/// Where lines go: stderr unless a sink was set.
#[derive(Default)]
pub struct AccessLog {
    sink: Mutex<Option<Box<dyn Write + Send>>>,
}

impl AccessLog {
    /// Send lines to `sink` instead of stderr (tests).
    pub fn set_sink(&self, sink: Box<dyn Write + Send>) {
        *self.sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// Write one complete line with one `write_all` (errors are ignored).
    pub fn write(&self, line: &[u8]) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let _ = match sink.as_mut() {
            Some(w) => w.write_all(line),
            None => io::stderr().lock().write_all(line),
        };
    }

    /// Build and write the line of `e` (nothing when the log is off).
    pub fn log(&self, format: AccessLogFormat, pid: u64, e: &Entry<'_>) {
        if format == AccessLogFormat::Off {
            return;
        }
        if let Some(l) = line(format, pid, &clock::now_iso_utc_millis(), e) {
            self.write(&l);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink collecting everything written, for tests.
    #[derive(Clone, Default)]
    pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        pub fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    fn entry() -> Entry<'static> {
        Entry {
            request_id: "abc-1",
            method: "POST",
            path: "/v2/models/m/infer",
            route: INFER_ROUTE,
            status: 200,
            duration: Duration::from_micros(1234),
            bytes_sent: 5678,
            client: Some("127.0.0.1:54321"),
        }
    }

    #[test]
    fn json_line_shape() {
        let l = line(AccessLogFormat::Json, 4242, "2026-11-22T10:04:05.123+00:00", &entry()).unwrap();
        assert_eq!(
            String::from_utf8(l).unwrap(),
            concat!(
                r#"{"ts": "2026-11-22T10:04:05.123+00:00", "level": "info", "logger": "bayesgate.access", "#,
                r#""message": "POST /v2/models/m/infer 200", "pid": 4242, "request_id": "abc-1", "method": "POST", "#,
                r#""path": "/v2/models/m/infer", "route": "/v2/models/{name}/infer", "status": 200, "#,
                r#""duration_ms": 1.234, "bytes_sent": 5678, "client": "127.0.0.1:54321", "front": "native"}"#,
                "\n"
            )
        );
        let e = Entry {
            method: "-",
            path: "-",
            route: "-",
            status: 400,
            duration: Duration::from_millis(12),
            bytes_sent: 0,
            client: None,
            ..entry()
        };
        let l = String::from_utf8(line(AccessLogFormat::Json, 1, "t", &e).unwrap()).unwrap();
        assert!(l.contains(r#""message": "- - 400", "pid": 1,"#), "{l}");
        assert!(
            l.contains(r#""duration_ms": 12.0, "bytes_sent": 0, "client": null, "front""#),
            "{l}"
        );
    }

    #[test]
    fn text_line_and_off() {
        let l = line(AccessLogFormat::Text, 4242, "t", &entry()).unwrap();
        assert_eq!(l, b"INFO:     POST /v2/models/m/infer 200\n");
        assert!(line(AccessLogFormat::Off, 4242, "t", &entry()).is_none());
    }

    #[test]
    fn strings_are_escaped_as_json_dumps() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\n\t\u{1}\u{7f}é/");
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\t\\u0001\u{7f}é/\"");
        assert_eq!(path_of(b"/v2/x?token=secret"), "/v2/x");
        assert_eq!(path_of(b"/a\"b"), "/a\"b");
    }

    #[test]
    fn durations_print_like_python_floats() {
        // expected values from Python: repr(round(x, 3))
        for (x, py) in [
            (1.2344999, "1.234"),
            (0.0625, "0.062"),
            (0.5, "0.5"),
            (12.0, "12.0"),
            (0.0004, "0.0"),
            (0.0005, "0.001"),
            (0.0015, "0.002"),
            (2.675, "2.675"),
            (1e-7, "0.0"),
            (123456.7895, "123456.789"),
        ] {
            assert_eq!(py_round3(x), py, "{x}");
        }
        assert_eq!(duration_ms(Duration::from_nanos(1_234_567)), "1.235");
        assert_eq!(duration_ms(Duration::from_secs(2)), "2000.0");
    }

    #[test]
    fn the_sink_gets_whole_lines() {
        let log = AccessLog::default();
        let cap = Captured::default();
        log.set_sink(Box::new(cap.clone()));
        log.log(AccessLogFormat::Json, 7, &entry());
        log.log(AccessLogFormat::Off, 7, &entry());
        log.log(AccessLogFormat::Text, 7, &entry());
        let lines = cap.lines();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("{\"ts\": \"") && lines[0].ends_with("\"front\": \"native\"}"));
        assert_eq!(lines[1], "INFO:     POST /v2/models/m/infer 200");
    }
}
