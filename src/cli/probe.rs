//! `divvy probe URL`: one HTTP GET, for images with no shell and no curl
//! (the chart's `helm test` pod asks the Service for `/readyz` with it).
//! Exit 0 and the body on stdout for a 2xx answer; an error naming what
//! failed otherwise. `https://` is verified against `--ca` or the system's
//! roots, with the rustls the server already uses.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// The most of an answer read: `/readyz` and friends say a line.
const MAX_RESPONSE: u64 = 1 << 20;

/// `divvy probe`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The URL to GET: http://host[:port][/path] or https://...
    url: String,
    /// Give up after this long, connection and answer included (e.g. 5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    timeout: Duration,
    /// For https://, trust these CAs (PEM) instead of the system's roots.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
}

/// What can go wrong with a probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL is not one this probe understands.
    #[error("bad URL {url:?}: {why}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A timeout that is not a duration.
    #[error("bad timeout {0:?}: expected a duration such as 5s, 500ms or 1m")]
    Timeout(String),
    /// The server could not be reached or the exchange broke off.
    #[error("{target}: no answer")]
    Io {
        /// host:port.
        target: String,
        /// The failure.
        source: io::Error,
    },
    /// TLS could not be set up.
    #[error("TLS: {0}")]
    Tls(String),
    /// An answer that is not HTTP.
    #[error("not an HTTP answer: {0}")]
    Malformed(&'static str),
    /// An answer that is not 2xx.
    #[error("{url} answered {status} {reason}: {body}")]
    Status {
        /// The URL asked.
        url: String,
        /// The status code.
        status: u16,
        /// Its reason phrase.
        reason: String,
        /// The body, trimmed.
        body: String,
    },
}

/// The parts of a URL a GET needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    /// Whether to speak TLS.
    pub https: bool,
    /// The host as written (brackets stripped from an IPv6 address).
    pub host: String,
    /// The port (80 or 443 unless given).
    pub port: u16,
    /// The path and query, at least `/`.
    pub path: String,
}

/// Parses `http://host[:port][/path]` or `https://...`.
pub fn parse_url(url: &str) -> Result<Target, ProbeError> {
    let bad = |why| ProbeError::Url {
        url: url.to_owned(),
        why,
    };
    let (https, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err(bad("it must start with http:// or https://"));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_owned()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_owned()),
    };
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    let (host, port) = split_authority(authority).ok_or_else(|| bad("bad host or port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(Target {
        https,
        host: host.to_owned(),
        port: port.unwrap_or(if https { 443 } else { 80 }),
        path,
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (&rest[..end], port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => None,
    };
    Some((host, port))
}

/// Parses `5s`, `500ms`, `1m` or a bare number of seconds.
pub fn parse_timeout(text: &str) -> Result<Duration, ProbeError> {
    let bad = || ProbeError::Timeout(text.to_owned());
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        _ => return Err(bad()),
    };
    if !seconds.is_finite() || seconds <= 0.0 || seconds > 3600.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// An HTTP answer: its status line and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

/// Parses a whole HTTP/1.x answer (read until the server closed).
pub fn parse_answer(bytes: &[u8]) -> Result<Answer, ProbeError> {
    let end = memchr::memmem::find(bytes, b"\r\n\r\n")
        .ok_or(ProbeError::Malformed("no end of headers"))?;
    let head = std::str::from_utf8(&bytes[..end])
        .map_err(|_| ProbeError::Malformed("headers not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(ProbeError::Malformed("no HTTP/1.x status line"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or(ProbeError::Malformed("no status code"))?;
    let reason = parts.next().unwrap_or_default().to_owned();
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = &bytes[end + 4..];
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(Answer {
        status,
        reason,
        body,
    })
}

/// Joins the chunks of a chunked body.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, ProbeError> {
    let mut out = Vec::new();
    loop {
        let line_end = memchr::memmem::find(body, b"\r\n")
            .ok_or(ProbeError::Malformed("chunk size without CRLF"))?;
        let size_text = std::str::from_utf8(&body[..line_end])
            .map_err(|_| ProbeError::Malformed("bad chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| ProbeError::Malformed("bad chunk size"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body
            .get(..size)
            .ok_or(ProbeError::Malformed("chunk cut short"))?;
        out.extend_from_slice(chunk);
        body = body
            .get(size..)
            .and_then(|b| b.strip_prefix(b"\r\n"))
            .ok_or(ProbeError::Malformed("chunk without CRLF"))?;
    }
}

/// The request: HTTP/1.1, and the server closes when done.
fn request(target: &Target) -> String {
    let host = if target.host.contains(':') {
        format!("[{}]", target.host)
    } else {
        target.host.clone()
    };
    let default = if target.https { 443 } else { 80 };
    let host = if target.port == default {
        host
    } else {
        format!("{host}:{}", target.port)
    };
    format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: divvy-probe\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        target.path
    )
}

/// Connects to the first address of `target` that answers within the time left.
fn connect(target: &Target, deadline: Instant) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port)
        .to_socket_addrs()?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
    for addr in addrs {
        let left = time_left(deadline)?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A TCP stream that gives up at one deadline for the whole exchange: each
/// read and write may wait only for the time left, so a server dribbling a
/// byte at a time cannot keep the probe past `--timeout`.
struct Deadlined {
    stream: TcpStream,
    deadline: Instant,
}

impl Deadlined {
    /// The time left, or a timeout error when none is; a socket timeout
    /// (`WouldBlock` on Unix) is reported as one too.
    fn with_time_left<T>(
        &mut self,
        set: fn(&TcpStream, Option<Duration>) -> io::Result<()>,
        op: impl FnOnce(&mut TcpStream) -> io::Result<T>,
    ) -> io::Result<T> {
        set(&self.stream, Some(time_left(self.deadline)?))?;
        op(&mut self.stream).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, "timed out"),
            _ => e,
        })
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.with_time_left(TcpStream::set_read_timeout, |s| s.read(buf))
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.with_time_left(TcpStream::set_write_timeout, |s| s.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

fn time_left(deadline: Instant) -> io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "timed out"))
}

/// Writes the request and reads the answer until the server closes (a TLS
/// peer that closes without close_notify still gave a whole answer here:
/// the request asked it to close).
fn exchange<S: Read + Write>(stream: &mut S, request: &str) -> io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes())?;
    stream.flush()?;
    let mut answer = Vec::new();
    match stream.take(MAX_RESPONSE).read_to_end(&mut answer) {
        Ok(_) => Ok(answer),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !answer.is_empty() => Ok(answer),
        Err(e) => Err(e),
    }
}

/// A TLS client for `host` trusting `ca` (PEM) or the system's roots.
fn tls_client(host: &str, ca: Option<&Path>) -> Result<rustls::ClientConnection, ProbeError> {
    let tls = |e: String| ProbeError::Tls(e);
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| tls(format!("{}: {e}", path.display())))?
            {
                let cert = cert.map_err(|e| tls(format!("{}: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| tls(format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system root rustls cannot use is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err(tls("no CA certificate to verify the server with".to_owned()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| tls(e.to_string()))?;
    rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| tls(e.to_string()))
}

/// GETs `url` and returns a 2xx answer's body; anything else is an error.
pub fn get(url: &str, timeout: Duration, ca: Option<&Path>) -> Result<Vec<u8>, ProbeError> {
    let target = parse_url(url)?;
    let deadline = Instant::now() + timeout;
    let io_err = |source| ProbeError::Io {
        target: format!("{}:{}", target.host, target.port),
        source,
    };
    let mut tcp = Deadlined {
        stream: connect(&target, deadline).map_err(io_err)?,
        deadline,
    };
    let request = request(&target);
    let bytes = if target.https {
        let client = tls_client(&target.host, ca)?;
        let mut tls = rustls::StreamOwned::new(client, tcp);
        exchange(&mut tls, &request).map_err(io_err)?
    } else {
        exchange(&mut tcp, &request).map_err(io_err)?
    };
    let answer = parse_answer(&bytes)?;
    if (200..300).contains(&answer.status) {
        return Ok(answer.body);
    }
    Err(ProbeError::Status {
        url: url.to_owned(),
        status: answer.status,
        reason: answer.reason,
        body: String::from_utf8_lossy(&answer.body).trim().to_owned(),
    })
}

/// Runs `divvy probe`: prints a 2xx answer's body.
pub fn run(args: &ProbeArgs) -> anyhow::Result<()> {
    let body = get(&args.url, args.timeout, args.ca.as_deref())?;
    io::stdout().write_all(&body)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_scheme_host_port_and_path() {
        let t = parse_url("http://divvy.divvy.svc:8080/readyz").unwrap();
        assert_eq!(
            t,
            Target {
                https: false,
                host: "divvy.divvy.svc".into(),
                port: 8080,
                path: "/readyz".into()
            }
        );
        let t = parse_url("https://example.com").unwrap();
        assert_eq!((t.https, t.port, t.path.as_str()), (true, 443, "/"));
        let t = parse_url("http://[::1]:9/x?y=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9, "/x?y=1")
        );
        let t = parse_url("http://h?q").unwrap();
        assert_eq!((t.port, t.path.as_str()), (80, "/?q"));
    }

    #[test]
    fn bad_urls_are_refused() {
        for url in [
            "ftp://h/",
            "h:80/readyz",
            "http://",
            "http://:80/",
            "http://h:0/",
            "http://h:99999/",
            "http://h:x/",
            "http://u:p@h/",
            "http://[::1/",
        ] {
            assert!(parse_url(url).is_err(), "{url} was accepted");
        }
    }

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_timeout("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_timeout("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_timeout("1m").unwrap(), Duration::from_secs(60));
        for bad in ["", "0", "0s", "5h", "s", "-1s", "1e3"] {
            assert!(parse_timeout(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn the_request_names_the_host_and_asks_to_close() {
        let req = request(&parse_url("http://[::1]:8080/readyz").unwrap());
        assert!(
            req.starts_with("GET /readyz HTTP/1.1\r\nHost: [::1]:8080\r\n"),
            "{req}"
        );
        assert!(req.ends_with("Connection: close\r\n\r\n"));
        let req = request(&parse_url("https://h/").unwrap());
        assert!(req.contains("Host: h\r\n"), "{req}");
    }

    #[test]
    fn answers_parse_with_plain_and_chunked_bodies() {
        let a = parse_answer(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\n\r\nnot ready\n",
        )
        .unwrap();
        assert_eq!(
            (a.status, a.reason.as_str(), a.body.as_slice()),
            (503, "Service Unavailable", &b"not ready\n"[..])
        );
        let a = parse_answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nrea\r\n4;x=y\r\ndy\r\n\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"ready\r\n"[..]));
    }

    /// A server that answers one byte every 300 ms, forever: the probe gives
    /// up at `--timeout` (1 s) overall, not per read. Allowed: 1.5 s, the
    /// timeout plus one dribble interval and scheduling slack on a loaded
    /// machine (before, it ran until the server stopped).
    #[test]
    fn a_dribbling_server_is_given_up_on_at_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // Ends when the probe has hung up and a write fails.
            for byte in b"HTTP/1.1 200 OK\r\n".iter().cycle() {
                if conn.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let start = Instant::now();
        let err = get(&format!("http://{addr}/"), Duration::from_secs(1), None)
            .expect_err("a dribbling server never finishes its answer");
        let took = start.elapsed();
        assert!(
            matches!(&err, ProbeError::Io { source, .. } if source.kind() == io::ErrorKind::TimedOut),
            "{err:?}"
        );
        assert!(took < Duration::from_millis(1500), "took {took:?}");
        assert!(took >= Duration::from_millis(900), "took {took:?}");
    }

    #[test]
    fn malformed_answers_are_errors() {
        for bad in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"SSH-2.0-x\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab\r\n",
        ] {
            assert!(
                parse_answer(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
