//! A bound on error messages at the API edge: a status message travels in an HTTP/2
//! header, and one that lists a thousand nodes (or quotes a megabyte) overflows the
//! header limits, so the client sees a protocol error or RESOURCE_EXHAUSTED instead of
//! the status. Messages are cut to [`MAX_MESSAGE_BYTES`] on the way out, saying so.
//!
//! Handlers already quote values by a short prefix (`crate::limits::quote`); this is
//! the net under every message, whoever wrote it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderValue;

/// Bytes of a message (UTF-8, before percent-encoding) that reach the client.
pub const MAX_MESSAGE_BYTES: usize = 2048;

const GRPC_MESSAGE: &str = "grpc-message";

#[derive(Clone, Copy, Debug, Default)]
pub struct ShortErrorsLayer;

impl<S> tower_layer::Layer<S> for ShortErrorsLayer {
    type Service = ShortErrors<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ShortErrors { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ShortErrors<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for ShortErrors<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // An error answered before any message is a trailers-only response: its status
            // is in the headers.
            let cut = response
                .headers()
                .get(GRPC_MESSAGE)
                .and_then(|v| shorten(v.as_bytes()))
                .and_then(|short| HeaderValue::from_bytes(&short).ok());
            if let Some(short) = cut {
                response.headers_mut().insert(GRPC_MESSAGE, short);
            }
            Ok(response)
        })
    }
}

/// A percent-encoded `grpc-message` cut to [`MAX_MESSAGE_BYTES`] (on a character
/// boundary, with a note of the full length); None when it is short enough.
pub fn shorten(encoded: &[u8]) -> Option<Vec<u8>> {
    if encoded.len() <= MAX_MESSAGE_BYTES {
        return None;
    }
    let decoded = percent_decode(encoded);
    if decoded.len() <= MAX_MESSAGE_BYTES {
        return None;
    }
    let text = String::from_utf8_lossy(&decoded);
    let mut end = MAX_MESSAGE_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let short = format!(
        "{}… (message cut: {} bytes in all)",
        &text[..end],
        decoded.len()
    );
    Some(percent_encode(short.as_bytes()))
}

fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// gRPC's encoding: printable ASCII except '%' as is, every other byte as %XX.
fn percent_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend(format!("%{b:02X}").bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_messages_are_left_alone() {
        assert_eq!(shorten(b"tenant 'x' not found"), None);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_and_say_so() {
        let long = format!("node(s) {} unreachable", "gpu-node-é, ".repeat(5000));
        let encoded = percent_encode(long.as_bytes());
        let short = shorten(&encoded).expect("cut");
        let text = String::from_utf8(percent_decode(&short)).expect("valid UTF-8");
        assert!(text.starts_with("node(s) gpu-node-é, "));
        assert!(text.ends_with(&format!("… (message cut: {} bytes in all)", long.len())));
        assert!(text.len() < MAX_MESSAGE_BYTES + 64);
        assert!(HeaderValue::from_bytes(&short).is_ok());
    }

    #[test]
    fn percent_encoding_round_trips() {
        let text = "50% of 'é' \n done";
        assert_eq!(
            percent_decode(&percent_encode(text.as_bytes())),
            text.as_bytes()
        );
        assert_eq!(percent_decode(b"100%"), b"100%");
    }
}
