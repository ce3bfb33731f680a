//! The gRPC port answers whatever `:authority` Envoy or Istio sends.
//!
//! Envoy's gRPC client sends its cluster name as `:authority`, and Istio's
//! cluster names (`outbound|8081||ratelimit.default.svc.cluster.local`) are
//! no URI authorities. No HTTP/2 client library sends such a value, so this
//! test speaks HTTP/2 itself: the frames and header blocks are written by
//! hand (HPACK literals without indexing or Huffman coding) and the answer's
//! gRPC message is read from its DATA frames. Without divvy's patch of h2
//! (vendor/README.md) every call with such an authority is reset.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{desc, request, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;

const POLICY: &str = r#"
overrides:
  - label: counted
    domain: istio
    operation: {PATH: "/productpage"}
    creditLimit: 2
    resetSeconds: 1h
default:
  creditLimit: 100
  resetSeconds: 1h
"#;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// Frame types and flags of RFC 9113 used here.
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// An HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header field as a literal without indexing, with a literal name.
fn literal(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One HTTP/2 connection to the gRPC port, spoken by hand.
struct RawH2 {
    conn: TcpStream,
    next_stream: u32,
}

impl RawH2 {
    fn connect(server: &Server) -> RawH2 {
        let mut conn = TcpStream::connect(server.grpc).expect("connect gRPC port");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        conn.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
        RawH2 {
            conn,
            next_stream: 1,
        }
    }

    fn read_frame(&mut self) -> (u8, u8, u32, Vec<u8>) {
        let mut head = [0u8; 9];
        self.conn
            .read_exact(&mut head)
            .expect("a frame from the server");
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.conn
            .read_exact(&mut payload)
            .expect("the frame's payload");
        (head[3], head[4], stream, payload)
    }

    /// One unary gRPC call with `authority`: the answer's message bytes,
    /// or what the server did instead.
    fn call(&mut self, path: &str, authority: &[u8], message: &[u8]) -> Result<Vec<u8>, String> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
        literal(&mut block, ":path", path.as_bytes());
        literal(&mut block, ":authority", authority);
        literal(&mut block, "content-type", b"application/grpc");
        literal(&mut block, "te", b"trailers");
        let mut body = vec![0u8];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        let mut out = frame(HEADERS, END_HEADERS, stream, &block);
        out.extend(frame(DATA, END_STREAM, stream, &body));
        self.conn.write_all(&out).unwrap();
        let mut data = Vec::new();
        loop {
            let (kind, flags, on, payload) = self.read_frame();
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.conn.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap()
                }
                RST_STREAM if on == stream => return Err(format!("stream reset: {payload:?}")),
                GOAWAY => return Err(format!("connection closed: {payload:?}")),
                DATA if on == stream => data.extend_from_slice(&payload),
                HEADERS if on == stream && flags & END_STREAM != 0 => break,
                _ => {}
            }
        }
        if data.len() < 5 {
            return Err("a trailers-only answer (a gRPC error), no message".into());
        }
        Ok(data[5..].to_vec())
    }
}

fn should_rate_limit(h2: &mut RawH2, authority: &[u8]) -> Result<Code, String> {
    let asked = request("istio", vec![desc(&[("PATH", "/productpage")])]);
    let answer = h2.call(SHOULD_RATE_LIMIT, authority, &asked.encode_to_vec())?;
    let response = RateLimitResponse::decode(answer.as_slice()).map_err(|e| e.to_string())?;
    Ok(response.overall_code())
}

#[test]
fn authorities_that_are_no_uri_authorities_are_answered() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut h2 = RawH2::connect(&server);
    // What Envoy sends for Istio's cluster names and other names Envoy
    // allows but URIs do not, then plainly valid ones.
    let authorities: [&[u8]; 10] = [
        b"outbound|8081||ratelimit.default.svc.cluster.local",
        b"inbound|8081||",
        b"outbound_.8081_._.ratelimit.default.svc.cluster.local",
        b"rate limit {cluster}",
        b"back\\slash^`\"quoted\"`<angle>",
        b"100%-bad-escape",
        b"ratelimit-\xc3\xbc.example",
        b"",
        b"ratelimit_cluster",
        b"ratelimit.default.svc.cluster.local:8081",
    ];
    let mut codes = Vec::new();
    for authority in authorities {
        let shown = String::from_utf8_lossy(authority);
        let code = should_rate_limit(&mut h2, authority)
            .unwrap_or_else(|e| panic!("authority {shown:?} was not answered: {e}"));
        codes.push(code);
    }
    // The one counter of 2 was charged by the first two calls alone.
    let mut expected = vec![Code::Ok, Code::Ok];
    expected.resize(authorities.len(), Code::OverLimit);
    assert_eq!(codes, expected);

    // The health service answers such an authority too (SERVING is 1).
    let health = h2
        .call(HEALTH_CHECK, authorities[0], &[])
        .expect("health answered");
    assert_eq!(health, [0x08, 0x01]);
}
