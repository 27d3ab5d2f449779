//! Relay a request to the Python service byte for byte and stream its response back.
//!
//! A new upstream connection per request: the request line and header lines as received,
//! except `Connection` lines (replaced by one `Connection: close`) and the client's forwarding
//! headers (replaced by one `X-Forwarded-For` naming the peer: [`upstream_head`]), then the
//! body as received (a `Content-Length` body, or a chunked body read to its end — chunk lines,
//! data and trailers forwarded raw). The upstream response is copied to the client unchanged, to EOF,
//! concurrently with the body upload (so an interim `100 Continue` or an early 413 reaches
//! the client). The upload stops once the upstream has closed its side ([`ClientBody`]). The
//! caller closes the client connection afterwards.

use crate::http::{self, Framing, Head};
use crate::peer::{self, Fd, Ready};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Duration;

/// Body of the native 502 when the Python service cannot be reached.
pub const UPSTREAM_DOWN_BODY: &str = "{\"error\":\"the Python service is unreachable from the native front end\"}";

/// Longest chunk-size or trailer line accepted.
const MAX_CHUNK_LINE: u64 = 8 * 1024;

/// How long the relay waits for the upstream response (between bytes).
const UPSTREAM_READ_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a chunked body could not be forwarded.
#[derive(Debug)]
pub enum ChunkedError {
    /// Bad chunk syntax (the client's fault).
    Malformed,
    /// Reading the client or writing upstream failed.
    Io(io::Error),
}

impl From<io::Error> for ChunkedError {
    fn from(e: io::Error) -> Self {
        ChunkedError::Io(e)
    }
}

fn read_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<(), ChunkedError> {
    line.clear();
    r.by_ref().take(MAX_CHUNK_LINE).read_until(b'\n', line)?;
    if !line.ends_with(b"\r\n") {
        return Err(ChunkedError::Malformed);
    }
    Ok(())
}

/// Copy one chunked body from `r` to `w` unchanged, reading exactly to its end (last chunk
/// and trailer section). Returns the bytes copied.
pub fn copy_chunked<R: BufRead, W: Write>(r: &mut R, w: &mut W) -> Result<u64, ChunkedError> {
    let mut line = Vec::with_capacity(64);
    let mut total = 0u64;
    loop {
        read_line(r, &mut line)?;
        w.write_all(&line)?;
        total += line.len() as u64;
        let spec = &line[..line.len() - 2];
        let size_text = spec.split(|&b| b == b';').next().unwrap_or(b"");
        let size_text = size_text.strip_suffix(b" ").unwrap_or(size_text);
        if size_text.is_empty() || size_text.len() > 15 || !size_text.iter().all(u8::is_ascii_hexdigit) {
            return Err(ChunkedError::Malformed);
        }
        let size = u64::from_str_radix(std::str::from_utf8(size_text).expect("hex digits"), 16)
            .map_err(|_| ChunkedError::Malformed)?;
        if size == 0 {
            loop {
                read_line(r, &mut line)?;
                w.write_all(&line)?;
                total += line.len() as u64;
                if line == b"\r\n" {
                    return Ok(total);
                }
            }
        }
        let copied = io::copy(&mut r.by_ref().take(size), w)?;
        if copied != size {
            return Err(ChunkedError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(ChunkedError::Malformed);
        }
        w.write_all(&crlf)?;
        total += size + 2;
    }
}

/// Headers a proxy uses to tell the server about the client: never relayed from the client.
/// uvicorn reads `X-Forwarded-For` and `X-Forwarded-Proto` (from a peer in its
/// `forwarded_allow_ips`, 127.0.0.1 by default: where the relay connects from); the others are
/// dropped too, so no later uvicorn or middleware that reads them takes a client's word either.
const FORWARDING_HEADERS: [&[u8]; 5] = [
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-forwarded-port",
    b"forwarded",
];

/// The head sent upstream: request line and headers as received, `Connection` replaced, and
/// the client's forwarding headers replaced by one `X-Forwarded-For: <peer>` (`peer` as
/// `ip:port` or `[v6]:port`, the native access log's `client`).
///
/// Replaced, not appended to: uvicorn's `ProxyHeadersMiddleware` (0.54) joins every
/// `X-Forwarded-For` line, then scans the list from the right for the first host not in
/// `forwarded_allow_ips` (all trusted: the leftmost; `*`: always the leftmost). Appending the
/// peer would keep a proxy chain in front of this port, but a peer that uvicorn trusts — any
/// local client, 127.0.0.1 by default — would be skipped and the client's own entry to its
/// left logged (`X-Forwarded-For: 6.6.6.6` → `"client": "6.6.6.6:0"`), and with `*` anyone's.
/// With one entry of its own, the main port logs the real peer under every setting. The port
/// too: uvicorn ≥ 0.45 reads `ip:port` and `[v6]:port` entries.
pub fn upstream_head(head: &Head, peer: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.raw.len() + 80);
    out.extend_from_slice(&head.raw[head.request_line.clone()]);
    out.extend_from_slice(b"\r\n");
    for h in &head.headers {
        let name = &head.raw[h.name.clone()];
        if name.eq_ignore_ascii_case(b"connection") || FORWARDING_HEADERS.iter().any(|f| name.eq_ignore_ascii_case(f)) {
            continue;
        }
        out.extend_from_slice(&head.raw[h.line.clone()]);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"X-Forwarded-For: ");
    out.extend_from_slice(peer.as_bytes());
    out.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    out
}

/// The client's side of a relayed body. A read waits for the client's next bytes (at most
/// `timeout`) and ends, `upstream_done` set, once the upstream has closed its side: it was sent
/// `Connection: close`, so it has answered (an early 413, say) and reads none of the rest. A
/// client that reads that answer before sending more never sends it, and waiting for it held
/// the answered connection open until the read timeout (with a request pipelined behind it
/// unanswered); the main port closes such a connection after its answer.
struct ClientBody<'a> {
    client: &'a mut TcpStream,
    upstream: Fd,
    timeout: Option<Duration>,
    upstream_done: bool,
}

impl Read for ClientBody<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match peer::wait_readable(peer::fd_of(self.client), self.upstream, self.timeout) {
            Ready::Readable => self.client.read(buf),
            Ready::TimedOut => Err(io::ErrorKind::TimedOut.into()),
            Ready::WatchedClosed => {
                self.upstream_done = true;
                Err(io::Error::other("the service has answered and closed"))
            }
        }
    }
}

/// What happened to a relayed request.
#[derive(Debug, PartialEq, Eq)]
pub enum RelayOutcome {
    /// The upstream response was forwarded (`bytes` of it).
    Forwarded(u64),
    /// Upstream unreachable: nothing was written; the caller answers with a native 502
    /// ([`native_answer`]), counting it before the client can see it.
    UpstreamDown,
    /// The chunked body was malformed and nothing came back: nothing was written; the caller
    /// answers with a native 400 ([`native_answer`]).
    BadChunked,
}

impl RelayOutcome {
    /// The native answer a relay outcome calls for: its status and bytes (none when the
    /// upstream's own response was forwarded).
    pub fn native_answer(&self, request_id: &str) -> Option<(u16, Vec<u8>)> {
        match self {
            RelayOutcome::Forwarded(_) => None,
            RelayOutcome::UpstreamDown => Some((
                502,
                http::json_response(502, UPSTREAM_DOWN_BODY.as_bytes(), request_id, true),
            )),
            RelayOutcome::BadChunked => Some((
                400,
                http::json_response(400, http::BAD_CHUNKED_BODY.as_bytes(), request_id, true),
            )),
        }
    }
}

/// Relay one request. `buffered` holds the bytes already read after the head (the start of
/// the body, maybe more); the rest of the body is read from `client`, whose address is `peer`
/// (sent as `X-Forwarded-For`: [`upstream_head`]). A native answer the outcome calls for is not
/// written here ([`RelayOutcome::native_answer`]).
pub fn relay(
    upstream: &str,
    client: &mut TcpStream,
    peer: &str,
    head: &Head,
    framing: Framing,
    buffered: &[u8],
) -> RelayOutcome {
    let mut up = match connect(upstream) {
        Ok(s) => s,
        Err(_) => return RelayOutcome::UpstreamDown,
    };
    let _ = up.set_nodelay(true);
    let _ = up.set_read_timeout(Some(UPSTREAM_READ_TIMEOUT));
    // response: upstream → client, concurrently with the upload
    let copier = match (up.try_clone(), client.try_clone()) {
        (Ok(mut from), Ok(mut to)) => Some(thread::spawn(move || {
            let mut n = 0u64;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => {
                        if to.write_all(&buf[..k]).is_err() {
                            break;
                        }
                        n += k as u64;
                    }
                }
            }
            n
        })),
        _ => None,
    };
    let mut malformed = false;
    let mut body = ClientBody {
        timeout: client.read_timeout().ok().flatten(),
        client,
        upstream: peer::fd_of(&up),
        upstream_done: false,
    };
    let upload = (|| -> io::Result<()> {
        let mut first = upstream_head(head, peer);
        match framing {
            Framing::Empty => up.write_all(&first),
            Framing::Length(n) => {
                let now = buffered.len().min(n as usize);
                first.extend_from_slice(&buffered[..now]);
                up.write_all(&first)?;
                let rest = n - now as u64;
                if rest > 0 {
                    let mut reader = BufReader::with_capacity(64 * 1024, (&mut body).take(rest));
                    if io::copy(&mut reader, &mut up)? != rest {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Ok(())
            }
            Framing::Chunked => {
                up.write_all(&first)?;
                let mut reader = BufReader::new(buffered.chain(&mut body));
                match copy_chunked(&mut reader, &mut up) {
                    Ok(_) => Ok(()),
                    Err(ChunkedError::Malformed) => {
                        malformed = true;
                        Err(io::ErrorKind::InvalidData.into())
                    }
                    Err(ChunkedError::Io(e)) => Err(e),
                }
            }
        }
    })();
    if upload.is_err() && malformed {
        let _ = up.shutdown(Shutdown::Both);
    } else if let Err(e) = upload {
        // the client went away mid-body: nothing to answer; an upstream write error or the
        // upstream's close (it answered early, e.g. 413) still lets its response through
        let client_gone = matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        );
        if client_gone && !body.upstream_done {
            let _ = up.shutdown(Shutdown::Both);
        }
    }
    let forwarded = copier.map(|c| c.join().unwrap_or(0)).unwrap_or(0);
    if malformed && forwarded == 0 {
        return RelayOutcome::BadChunked;
    }
    RelayOutcome::Forwarded(forwarded)
}

fn connect(upstream: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in upstream.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_copied_raw_to_their_end() {
        let body = b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut r = BufReader::new(&body[..]);
        let mut out = Vec::new();
        let n = copy_chunked(&mut r, &mut out).unwrap();
        assert_eq!(out, &body[..body.len() - 4]);
        assert_eq!(n as usize, out.len());
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"NEXT");
    }

    #[test]
    fn malformed_chunks() {
        for bad in [
            &b"x\r\nab\r\n0\r\n\r\n"[..],
            b"2\r\nabc\r\n0\r\n\r\n",
            b"2\nab\r\n0\r\n\r\n",
            b"2\r\nab\r\n0\r\n",
        ] {
            let r = copy_chunked(&mut BufReader::new(bad), &mut Vec::new());
            assert!(
                matches!(r, Err(ChunkedError::Malformed)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let r = copy_chunked(&mut BufReader::new(&b"5\r\nab"[..]), &mut Vec::new());
        assert!(matches!(r, Err(ChunkedError::Io(_))));
    }

    #[test]
    fn connection_header_is_replaced() {
        let head =
            Head::parse(b"GET /x HTTP/1.1\r\nHost: h\r\nconnection: keep-alive\r\nX-Y:  z \r\n\r\n".to_vec()).unwrap();
        assert_eq!(
            upstream_head(&head, "192.0.2.7:40000"),
            b"GET /x HTTP/1.1\r\nHost: h\r\nX-Y:  z \r\nX-Forwarded-For: 192.0.2.7:40000\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn the_peer_replaces_the_client_s_forwarding_headers() {
        let head = Head::parse(
            b"POST /v1/x HTTP/1.1\r\nX-Forwarded-For: 6.6.6.6\r\nHost: h\r\nx-forwarded-for: 7.7.7.7, 127.0.0.1\r\n\
              X-FORWARDED-PROTO: https\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Port: 443\r\n\
              Forwarded: for=6.6.6.6\r\nX-Forwarded-Forx: kept\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
        )
        .unwrap();
        for peer in ["203.0.113.9:5555", "[2001:db8::1]:443"] {
            let mut expected = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nX-Forwarded-Forx: kept\r\nContent-Length: 0\r\n\
                X-Forwarded-For: "
                .to_vec();
            expected.extend_from_slice(peer.as_bytes());
            expected.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
            let got = upstream_head(&head, peer);
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&expected));
        }
    }
}
