//! HTTP/1.1 request heads (parse, framing) and natively built responses.

use std::ops::Range;

/// Longest request head accepted (request line + headers + the blank line).
pub const MAX_HEAD: usize = 64 * 1024;

/// Body of the 431 answered when the head is over [`MAX_HEAD`] (or still arriving past the main
/// port's `max_header_bytes`).
pub const HEAD_TOO_LARGE_BODY: &str = "{\"error\":\"request head too large\"}";

/// Longest method taken: the longest in the IANA HTTP Method Registry (`UPDATEREDIRECTREF`).
/// httptools knows none as long; a longer token before the first space is not HTTP (an SSH
/// banner, say).
pub const MAX_METHOD: usize = 17;
/// Body of the 400 answered when a relayed request's chunked body is malformed and the service
/// answered nothing (a head that cannot be framed gets [`HeadError::body`], naming the problem).
pub const BAD_CHUNKED_BODY: &str =
    "{\"error\":\"malformed HTTP request: a chunked body that does not follow RFC 9112\"}";

/// One header line of a request head (byte ranges into [`Head::raw`]).
#[derive(Debug, Clone)]
pub struct HeaderLine {
    /// The whole line without its CRLF.
    pub line: Range<usize>,
    /// The field name.
    pub name: Range<usize>,
    /// The field value without surrounding optional white space.
    pub value: Range<usize>,
}

/// A parsed request head; the bytes are kept so a relay can forward them as received.
#[derive(Debug, Clone)]
pub struct Head {
    /// The head as received, request line through the final CRLF CRLF.
    pub raw: Vec<u8>,
    /// Request line without CRLF.
    pub request_line: Range<usize>,
    /// Method token.
    pub method: Range<usize>,
    /// Request target.
    pub target: Range<usize>,
    /// `HTTP/1.1` (else `HTTP/1.0`).
    pub http11: bool,
    /// Header lines in order.
    pub headers: Vec<HeaderLine>,
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Why a head cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Syntax error or unusable framing → native 400 (naming the problem) and close.
    Malformed(&'static str),
}

impl HeadError {
    /// The native 400's JSON body: `{"error":"malformed HTTP request: <what>"}`.
    pub fn body(&self) -> String {
        let HeadError::Malformed(what) = self;
        format!("{{\"error\":\"malformed HTTP request: {what}\"}}")
    }
}

const LINE_ENDING: HeadError = HeadError::Malformed("a line of the head does not end in CRLF");
const REQUEST_LINE: HeadError = HeadError::Malformed("the request line is not 'METHOD target HTTP/1.x'");
const METHOD_LENGTH: HeadError = HeadError::Malformed("a method longer than any registered one (17 characters)");
const VERSION: HeadError = HeadError::Malformed("HTTP version other than HTTP/1.1 or HTTP/1.0");
const HEADER_LINE: HeadError =
    HeadError::Malformed("a header line is not 'Name: value' (or holds a control character)");
const TRANSFER_ENCODING: HeadError = HeadError::Malformed("Transfer-Encoding whose last coding is not chunked");
const CONTENT_LENGTH: HeadError = HeadError::Malformed("Content-Length is not a number of at most 19 digits");
const CONTENT_LENGTHS: HeadError = HeadError::Malformed("Content-Length values that differ");

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim_ows(bytes: &[u8], mut r: Range<usize>) -> Range<usize> {
    while r.start < r.end && matches!(bytes[r.start], b' ' | b'\t') {
        r.start += 1;
    }
    while r.end > r.start && matches!(bytes[r.end - 1], b' ' | b'\t') {
        r.end -= 1;
    }
    r
}

/// Position just past the head's terminating `\r\n\r\n` in `buf`, searching from `from`
/// (a previous search's length, so a slowly arriving head is not rescanned).
pub fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    buf.get(start..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| start + p + 4)
}

/// Whether the first bytes of a head still arriving can begin a request line: a method (1 to
/// [`MAX_METHOD`] token characters), then a space. Bytes that cannot — a TLS handshake, an SSH
/// banner, binary noise — are refused as soon as they arrive, as the main port's parser refuses
/// them, rather than closed unanswered after the read timeout for want of a CRLF CRLF. `start` is
/// what is buffered, empty lines before the request line removed.
pub fn check_request_start(start: &[u8]) -> Result<(), HeadError> {
    if start == b"\r" {
        return Ok(()); // perhaps an empty line's CR
    }
    for (i, &b) in start.iter().take(MAX_METHOD + 1).enumerate() {
        if b == b' ' && i > 0 {
            return Ok(());
        }
        if !is_tchar(b) {
            return Err(REQUEST_LINE);
        }
    }
    if start.len() > MAX_METHOD {
        return Err(METHOD_LENGTH);
    }
    Ok(())
}

impl Head {
    /// Parse a head (`raw` ends with `\r\n\r\n`).
    pub fn parse(raw: Vec<u8>) -> Result<Head, HeadError> {
        let end = raw.len().checked_sub(4).ok_or(LINE_ENDING)?;
        let mut lines = Vec::new();
        let mut pos = 0;
        while pos <= end {
            let rel = raw[pos..end + 2]
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or(LINE_ENDING)?;
            lines.push(pos..pos + rel);
            pos += rel + 2;
            if pos >= end + 2 {
                break;
            }
        }
        let mut iter = lines.into_iter();
        let rl = iter.next().ok_or(REQUEST_LINE)?;
        let line = &raw[rl.clone()];
        if line.iter().any(|&b| b == b'\r' || b == b'\n') {
            return Err(LINE_ENDING);
        }
        let sp1 = line.iter().position(|&b| b == b' ').ok_or(REQUEST_LINE)?;
        let sp2 = line.iter().rposition(|&b| b == b' ').ok_or(REQUEST_LINE)?;
        if sp2 <= sp1 + 1 || sp1 == 0 {
            return Err(REQUEST_LINE);
        }
        let method = rl.start..rl.start + sp1;
        let target = rl.start + sp1 + 1..rl.start + sp2;
        let version = &line[sp2 + 1..];
        if !raw[method.clone()].iter().all(|&b| is_tchar(b))
            || raw[target.clone()].iter().any(|&b| b <= b' ' || b == 0x7f)
        {
            return Err(REQUEST_LINE);
        }
        if method.len() > MAX_METHOD {
            return Err(METHOD_LENGTH); // as a head still arriving is refused (check_request_start)
        }
        let http11 = match version {
            b"HTTP/1.1" => true,
            b"HTTP/1.0" => false,
            _ => return Err(VERSION),
        };
        let mut headers = Vec::new();
        for l in iter {
            let bytes = &raw[l.clone()];
            if bytes.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(HEADER_LINE);
            }
            let colon = bytes.iter().position(|&b| b == b':').ok_or(HEADER_LINE)?;
            if colon == 0 || !bytes[..colon].iter().all(|&b| is_tchar(b)) {
                return Err(HEADER_LINE); // also catches obs-fold and space before ':'
            }
            let name = l.start..l.start + colon;
            let value = trim_ows(&raw, l.start + colon + 1..l.end);
            headers.push(HeaderLine { line: l, name, value });
        }
        Ok(Head {
            request_line: rl,
            method,
            target,
            http11,
            headers,
            raw,
        })
    }

    /// The method token.
    pub fn method(&self) -> &[u8] {
        &self.raw[self.method.clone()]
    }

    /// The request target.
    pub fn target(&self) -> &[u8] {
        &self.raw[self.target.clone()]
    }

    /// Values of every header named `name` (ASCII case-insensitive), in order.
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s [u8]> + 's {
        self.headers
            .iter()
            .filter(move |h| self.raw[h.name.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(move |h| &self.raw[h.value.clone()])
    }

    /// True when any header named `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.values(name).next().is_some()
    }

    /// True when a `Connection` header lists `close` (or the request is HTTP/1.0 without
    /// `keep-alive`): the connection ends after this request's response.
    pub fn wants_close(&self) -> bool {
        let mut close = false;
        let mut keep_alive = false;
        for v in self.values("connection") {
            for token in v.split(|&b| b == b',') {
                let t = trim_ows(token, 0..token.len());
                let t = &token[t];
                close |= t.eq_ignore_ascii_case(b"close");
                keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        close || (!self.http11 && !keep_alive)
    }

    /// How the body is delimited (`Transfer-Encoding` wins over `Content-Length`).
    pub fn framing(&self) -> Result<Framing, HeadError> {
        let mut te_last: Option<&[u8]> = None;
        let mut te_seen = false;
        for v in self.values("transfer-encoding") {
            te_seen = true;
            for token in v.split(|&b| b == b',') {
                let r = trim_ows(token, 0..token.len());
                if !r.is_empty() {
                    te_last = Some(&token[r]);
                }
            }
        }
        if te_seen {
            return match te_last {
                Some(t) if t.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
                _ => Err(TRANSFER_ENCODING),
            };
        }
        let mut length: Option<u64> = None;
        for v in self.values("content-length") {
            let n = parse_digits(v, 19).ok_or(CONTENT_LENGTH)?;
            if length.is_some_and(|l| l != n) {
                return Err(CONTENT_LENGTHS);
            }
            length = Some(n);
        }
        Ok(match length {
            Some(0) | None => Framing::Empty,
            Some(n) => Framing::Length(n),
        })
    }
}

/// A value of ASCII digits only (at most `max_digits`) as u64.
pub fn parse_digits(v: &[u8], max_digits: usize) -> Option<u64> {
    if v.is_empty() || v.len() > max_digits || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter()
        .try_fold(0u64, |a, &b| a.checked_mul(10)?.checked_add((b - b'0') as u64))
}

/// The reason phrase of a status code (Python's `http.HTTPStatus` phrases).
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Request Entity Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// A complete JSON error response (`content-type: application/json`; a 503 also gets
/// `retry-after: 1`).
pub fn json_response(status: u16, body: &[u8], request_id: &str, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 + body.len());
    out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(status)).as_bytes());
    out.extend_from_slice(b"content-type: application/json\r\n");
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    if status == 503 {
        out.extend_from_slice(b"retry-after: 1\r\n");
    }
    if !request_id.is_empty() {
        out.extend_from_slice(format!("x-request-id: {request_id}\r\n").as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A complete response built here with `connection: close` added to its head (unchanged when
/// it has one). Used for answers written once the drain began.
pub fn add_close(bytes: Vec<u8>) -> Vec<u8> {
    const CLOSE: &[u8] = b"connection: close\r\n";
    let Some(end) = find_head_end(&bytes, 0) else {
        return bytes;
    };
    let head = &bytes[..end];
    if head
        .windows(CLOSE.len() + 2)
        .any(|w| w[..2] == *b"\r\n" && w[2..] == *CLOSE)
    {
        return bytes;
    }
    let mut out = Vec::with_capacity(bytes.len() + CLOSE.len());
    out.extend_from_slice(&bytes[..end - 2]);
    out.extend_from_slice(CLOSE);
    out.extend_from_slice(&bytes[end - 2..]);
    out
}

/// The head of a fast-path 200 (`body_len` bytes follow, the first `header_len` of them JSON).
pub fn binary_ok_head(out: &mut Vec<u8>, header_len: usize, body_len: usize, request_id: &str, close: bool) {
    use std::io::Write;
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ninference-header-content-length: {header_len}\r\ncontent-length: {body_len}\r\nx-request-id: {request_id}\r\n{}\r\n",
        if close { "connection: close\r\n" } else { "" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<Head, HeadError> {
        Head::parse(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_a_head() {
        let h = head("POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length:  12 \r\nX-A:\r\n\r\n").unwrap();
        assert_eq!(h.method(), b"POST");
        assert_eq!(h.target(), b"/v2/models/m/infer");
        assert!(h.http11);
        assert_eq!(h.values("content-length").collect::<Vec<_>>(), vec![b"12".as_slice()]);
        assert_eq!(h.values("x-a").collect::<Vec<_>>(), vec![b"".as_slice()]);
        assert_eq!(h.framing(), Ok(Framing::Length(12)));
        assert!(!h.wants_close());
    }

    #[test]
    fn rejects_bad_heads() {
        for (s, why) in [
            ("POST /x HTTP/2.0\r\n\r\n", VERSION),
            ("POST  HTTP/1.1\r\n\r\n", REQUEST_LINE),
            ("POST /x HTTP/1.1\r\nBad Header: 1\r\n\r\n", HEADER_LINE),
            ("POST /x HTTP/1.1\r\n folded\r\n\r\n", HEADER_LINE),
            ("POST /x HTTP/1.1\r\nNoColon\r\n\r\n", HEADER_LINE),
            ("POST /x HTTP/1.1\r\nX: a\x00b\r\n\r\n", HEADER_LINE),
            ("GARBAGE\r\n\r\n", REQUEST_LINE),
            ("UPDATEREDIRECTREFS / HTTP/1.1\r\n\r\n", METHOD_LENGTH),
            ("POST /x HTTP/1.1\n\r\n", LINE_ENDING),
        ] {
            assert_eq!(head(s).err(), Some(why), "{s:?}");
        }
        for (s, why) in [
            ("Content-Length: 1\r\nContent-Length: 2", CONTENT_LENGTHS),
            ("Content-Length: +1", CONTENT_LENGTH),
            ("Content-Length: 12345678901234567890", CONTENT_LENGTH),
            ("Transfer-Encoding: gzip", TRANSFER_ENCODING),
            ("Transfer-Encoding: chunked, gzip", TRANSFER_ENCODING),
        ] {
            let h = head(&format!("POST /x HTTP/1.1\r\n{s}\r\n\r\n")).unwrap();
            assert_eq!(h.framing(), Err(why), "{s:?}");
        }
        // the 400's body names the problem, as JSON
        let body = CONTENT_LENGTHS.body();
        assert_eq!(
            body,
            r#"{"error":"malformed HTTP request: Content-Length values that differ"}"#
        );
        for why in [
            LINE_ENDING,
            REQUEST_LINE,
            METHOD_LENGTH,
            VERSION,
            HEADER_LINE,
            TRANSFER_ENCODING,
            CONTENT_LENGTH,
        ] {
            let body = why.body();
            let v = crate::json::parse(body.as_bytes(), crate::json::ParseOptions::STRICT).unwrap();
            assert!(v
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap()
                .starts_with("malformed"));
        }
        let h =
            head("POST /x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nConnection: keep-alive, Close\r\n\r\n").unwrap();
        assert_eq!(h.framing(), Ok(Framing::Chunked));
        assert!(h.wants_close());
    }

    #[test]
    fn the_start_of_a_request_line() {
        for ok in [
            &b""[..],
            b"G",
            b"GET",
            b"GET ",
            b"GET /x HTTP/1.1\r\n",
            b"\r",
            b"UPDATEREDIRECTREF",
            b"UPDATEREDIRECTREF /",
            b"M-SEARCH * HTTP/1.1",
        ] {
            assert_eq!(check_request_start(ok), Ok(()), "{ok:?}");
        }
        for (bad, why) in [
            (&b"\x16\x03\x01\x02\x00\x01"[..], REQUEST_LINE), // TLS ClientHello
            (b" GET /", REQUEST_LINE),
            (b"GET\t/", REQUEST_LINE),
            (b"G\x00", REQUEST_LINE),
            (b"\r\x00", REQUEST_LINE),
            (b"\n", REQUEST_LINE),
            (b"GARBAGE-NO-NEWLINE", METHOD_LENGTH),
            (b"SSH-2.0-OpenSSH_9.6\r\n", METHOD_LENGTH),
            (b"UPDATEREDIRECTREFS", METHOD_LENGTH),
        ] {
            assert_eq!(check_request_start(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn close_is_added_once() {
        let open = json_response(503, b"{}", "id", false);
        let closed = json_response(503, b"{}", "id", true);
        assert_eq!(add_close(open), closed);
        assert_eq!(add_close(closed.clone()), closed);
        let mut ok = Vec::new();
        binary_ok_head(&mut ok, 2, 5, "id", false);
        ok.extend_from_slice(b"{}\r\n\r\nx"); // body bytes that look like a head end
        let mut expected = Vec::new();
        binary_ok_head(&mut expected, 2, 5, "id", true);
        expected.extend_from_slice(b"{}\r\n\r\nx");
        assert_eq!(add_close(ok), expected);
    }

    #[test]
    fn finds_the_head_end() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nrest", 0), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r", 0), None);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n", 17), Some(18));
    }
}
