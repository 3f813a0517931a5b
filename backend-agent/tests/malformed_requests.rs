//! Requests whose bytes are not the message (issue 19): a string that is not UTF-8, a
//! truncated message, a wrong wire type, groups nested past the decoder's recursion limit.
//! Sent raw over HTTP/2 to a real `serve`, each answers INVALID_ARGUMENT, with or without
//! a token, and none counts as an internal error in the metrics.

mod common;

use std::io::{Read, Write};

use common::*;
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Sends the bytes it is given as the message, and takes the answer's bytes as they come.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One call of `path` with `body` as the message's bytes.
async fn call(
    endpoint: &str,
    path: &'static str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    let channel = Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(body);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            gpufleet_proto::bearer(token).parse().unwrap(),
        );
    }
    grpc.unary(
        request,
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        Raw,
    )
    .await
    .map(tonic::Response::into_inner)
}

const CREATE_TENANT: &str = "/gpufleet.v1.TenantService/CreateTenant";

/// A field's key: its number and wire type.
fn key(field: u8, wire_type: u8) -> u8 {
    field << 3 | wire_type
}

/// The malformed bodies of a CreateTenantRequest, by what is wrong with them.
fn malformed() -> Vec<(&'static str, Vec<u8>)> {
    // `name` (field 2, length-delimited) holding bytes that are not UTF-8.
    let not_utf8 = vec![key(1, 2), 2, b'r', b'1', key(2, 2), 3, b'a', 0xff, 0xfe];
    // `name` says 10 bytes; 3 follow.
    let truncated = vec![key(2, 2), 10, b'a', b'b', b'c'];
    // `name` (a string) sent as a varint.
    let wrong_wire_type = vec![key(2, 0), 7];
    // An unknown field 15 as groups nested 200 deep (prost stops at 100).
    let mut nested = Vec::new();
    nested.extend(std::iter::repeat_n(key(15, 3), 200));
    nested.extend(std::iter::repeat_n(key(15, 4), 200));
    vec![
        ("a string that is not UTF-8", not_utf8),
        ("a truncated message", truncated),
        ("a wrong wire type", wrong_wire_type),
        ("groups nested 200 deep", nested),
    ]
}

/// The metrics endpoint's address, from the agent's log.
fn metrics_addr(agent: &Agent) -> String {
    let log = std::fs::read_to_string(agent.data_dir.with_extension("log")).unwrap();
    let marker = "Prometheus metrics on http://";
    let start = log.find(marker).expect("the metrics address in the log") + marker.len();
    let rest = &log[start..];
    rest[..rest.find("/metrics").unwrap()].to_string()
}

/// `gpufleet_api_requests_total` of CreateTenant by code, from one scrape.
fn create_tenant_requests(agent: &Agent, addr: &str) -> Vec<(String, f64)> {
    let token = std::fs::read_to_string(agent.data_dir.join("metrics.token")).unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        token.trim()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let series = "gpufleet_api_requests_total{";
    text.lines()
        .filter(|l| l.starts_with(series) && l.contains("TenantService/CreateTenant\""))
        .map(|l| {
            let code = l
                .split("code=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let value = l.split_whitespace().last().unwrap().parse().unwrap();
            (code.to_string(), value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_decode_is_invalid_argument_with_or_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start_with(
        &data,
        &["--admin-token", ADMIN, "--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = metrics_addr(&agent);
    for (what, body) in malformed() {
        for token in [None, Some(ADMIN)] {
            let status = call(&agent.endpoint, CREATE_TENANT, token, body.clone())
                .await
                .expect_err(what);
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{what} (token: {}): {status:?}",
                token.is_some()
            );
            assert!(
                status
                    .message()
                    .contains("failed to decode Protobuf message"),
                "{what}: {status:?}"
            );
        }
    }
    // A well-formed request still works, made of the same hand-made bytes.
    let ok = vec![
        key(1, 2),
        2,
        b'r',
        b'1',
        key(2, 2),
        6,
        b't',
        b'e',
        b'a',
        b'm',
        b'-',
        b'a',
    ];
    call(&agent.endpoint, CREATE_TENANT, Some(ADMIN), ok)
        .await
        .expect("a well-formed CreateTenant");

    let counted = create_tenant_requests(&agent, &metrics);
    let of = |code: &str| {
        counted
            .iter()
            .find(|(c, _)| c == code)
            .map(|(_, v)| *v)
            .unwrap_or(0.0)
    };
    let malformed = malformed().len() as f64 * 2.0;
    assert_eq!(of("INVALID_ARGUMENT"), malformed, "{counted:?}");
    assert_eq!(of("INTERNAL"), 0.0, "{counted:?}");
    assert_eq!(of("OK"), 1.0, "{counted:?}");
}

/// A request body of one chunk: the bytes as given, prefix and all.
struct Chunk(Option<tonic::codegen::Bytes>);

impl http_body::Body for Chunk {
    type Data = tonic::codegen::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// The gRPC status of a CreateTenant whose body is `body` exactly (no prefix added).
async fn raw_status(endpoint: &str, body: Vec<u8>) -> Code {
    use tonic::codegen::Service;
    let mut channel = Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    let request = tonic::codegen::http::Request::post(format!("{endpoint}{CREATE_TENANT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::boxed(Chunk(Some(body.into()))))
        .unwrap();
    let response = channel.call(request).await.unwrap();
    // A call refused before any answer is trailers-only: its status is in the headers.
    let status = response
        .headers()
        .get("grpc-status")
        .expect("a trailers-only answer");
    Code::from_bytes(status.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_ends_inside_a_message_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start_with(
        &data,
        &["--admin-token", ADMIN, "--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = metrics_addr(&agent);
    // The prefix announces 100 bytes; 3 come. Then a prefix cut after 3 of its 5 bytes.
    for body in [vec![0, 0, 0, 0, 100, key(2, 2), 1, b'a'], vec![0, 0, 0]] {
        assert_eq!(
            raw_status(&agent.endpoint, body).await,
            Code::InvalidArgument
        );
    }
    // A whole message passes the same way (a request without a token is refused as such).
    let whole = vec![0, 0, 0, 0, 3, key(2, 2), 1, b'a'];
    assert_eq!(
        raw_status(&agent.endpoint, whole).await,
        Code::Unauthenticated
    );
    let counted = create_tenant_requests(&agent, &metrics);
    assert!(
        counted.contains(&("INVALID_ARGUMENT".to_string(), 2.0)),
        "{counted:?}"
    );
    assert!(
        !counted.iter().any(|(code, _)| code == "INTERNAL"),
        "{counted:?}"
    );
}
