//! A bound on error messages at the API edge: a status message travels in an HTTP/2
//! header, and one that lists a thousand nodes (or quotes a megabyte) overflows the
//! header limits, so the client sees a protocol error or RESOURCE_EXHAUSTED instead of
//! the status. Messages are cut to [`MAX_MESSAGE_BYTES`] on the way out, saying so.
//!
//! Handlers already quote values by a short prefix (`crate::limits::quote`); this is
//! the net under every message, whoever wrote it.
//!
//! Being the one place every status passes, the layer also gives each refusal without
//! details of its own the field it is about and a reason as google.rpc error details
//! (see [`super::error_details`]), made from the message as it leaves (after the cut).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use http::{HeaderMap, HeaderValue};
use tonic::Code;

use crate::message_cut::{cut_noting, MAX_MESSAGE_BYTES};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";

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
            if let Some(details) = refusal_details(response.headers()) {
                response.headers_mut().insert(GRPC_STATUS_DETAILS, details);
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
    let short = cut_noting(&text, MAX_MESSAGE_BYTES, decoded.len());
    Some(percent_encode(short.as_bytes()))
}

/// The `grpc-status-details-bin` value for a trailers-only refusal without details (its
/// field and reason, see [`super::error_details`]); None for any other response.
fn refusal_details(headers: &HeaderMap) -> Option<HeaderValue> {
    if headers.contains_key(GRPC_STATUS_DETAILS) {
        return None;
    }
    let code = Code::from_bytes(headers.get(GRPC_STATUS)?.as_bytes());
    let message = headers
        .get(GRPC_MESSAGE)
        .map(|v| String::from_utf8_lossy(&percent_decode(v.as_bytes())).into_owned())
        .unwrap_or_default();
    let details = super::error_details::encoded(code, &message)?;
    let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
    HeaderValue::from_str(&encoded).ok()
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

    mod details {
        use std::convert::Infallible;
        use std::future::{ready, Ready};

        use tonic::Status;
        use tonic_types::{ErrorDetails, StatusExt};
        use tower_layer::Layer;
        use tower_service::Service;

        use super::*;
        use crate::error::Error;

        /// A handler that answers `status`.
        struct Answer(Status);

        impl Service<http::Request<()>> for Answer {
            type Response = http::Response<tonic::body::BoxBody>;
            type Error = Infallible;
            type Future = Ready<Result<Self::Response, Infallible>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                ready(Ok(self.0.clone().into_http()))
            }
        }

        /// The response to a call answered by `status`, through the layer.
        async fn through_the_edge(status: Status) -> http::Response<tonic::body::BoxBody> {
            let mut edge = ShortErrorsLayer.layer(Answer(status));
            edge.call(http::Request::new(())).await.unwrap()
        }

        /// The status a client reads from that response.
        async fn as_received(status: Status) -> Status {
            Status::from_header_map(through_the_edge(status).await.headers()).expect("a status")
        }

        fn field(s: &Status) -> Option<String> {
            let violations = s.get_details_bad_request()?.field_violations;
            assert_eq!(violations.len(), 1, "{violations:?}");
            Some(violations[0].field.clone())
        }

        fn reason(s: &Status) -> Option<(String, String)> {
            s.get_details_error_info().map(|i| (i.reason, i.domain))
        }

        #[tokio::test]
        async fn a_handlers_refusal_carries_its_field_and_reason() {
            let s = as_received(Status::invalid_argument("node_count: must be at least 1")).await;
            assert_eq!(s.code(), tonic::Code::InvalidArgument);
            assert_eq!(s.message(), "node_count: must be at least 1");
            assert_eq!(field(&s).as_deref(), Some("node_count"));
            let violation = &s.get_details_bad_request().unwrap().field_violations[0];
            assert_eq!(violation.description, "must be at least 1");
            assert_eq!(
                reason(&s),
                Some(("INVALID_ARGUMENT".into(), "gpufleet".into()))
            );
        }

        #[tokio::test]
        async fn a_domain_error_carries_them_too() {
            let e = Error::Precondition(
                "acceptance.min_bus_bandwidth_gbps: must be between 0 and 100000 Gbit/s".into(),
            );
            let s = as_received(e.into()).await;
            assert_eq!(s.code(), tonic::Code::FailedPrecondition);
            assert_eq!(
                field(&s).as_deref(),
                Some("acceptance.min_bus_bandwidth_gbps")
            );
            assert_eq!(reason(&s).unwrap().0, "FAILED_PRECONDITION");
            let s = as_received(Error::Invalid("tenant_id: required".into()).into()).await;
            assert_eq!(field(&s).as_deref(), Some("tenant_id"));
            let s = as_received(Status::already_exists("name: 'a' is taken")).await;
            assert_eq!(
                (field(&s).as_deref(), reason(&s).unwrap().0.as_str()),
                (Some("name"), "ALREADY_EXISTS")
            );
            let s = as_received(Status::out_of_range("page_size: at most 1000")).await;
            assert_eq!(
                (field(&s).as_deref(), reason(&s).unwrap().0.as_str()),
                (Some("page_size"), "OUT_OF_RANGE")
            );
        }

        #[tokio::test]
        async fn a_message_naming_no_field_gets_a_reason_and_no_field() {
            let message = "needs 24 H100-80GB GPUs, quota of tenant 'team' leaves 16";
            let s = as_received(Status::failed_precondition(message)).await;
            assert_eq!(s.message(), message);
            assert_eq!(field(&s), None);
            assert_eq!(reason(&s).unwrap().0, "FAILED_PRECONDITION");
        }

        #[tokio::test]
        async fn rewording_keeps_the_field() {
            for message in [
                "node_count: needs 3 A100-80GB nodes, 2 are free",
                "node_count: only 2 A100-80GB nodes are free; 3 were asked for",
            ] {
                let s = as_received(Status::failed_precondition(message)).await;
                assert_eq!(s.message(), message);
                assert_eq!(field(&s).as_deref(), Some("node_count"), "{message}");
            }
        }

        #[tokio::test]
        async fn a_status_with_details_keeps_them() {
            let own = Status::with_error_details(
                tonic::Code::InvalidArgument,
                "node_count: must be at least 1",
                ErrorDetails::with_bad_request_violation("storage_gib", "theirs"),
            );
            let s = as_received(own).await;
            assert_eq!(field(&s).as_deref(), Some("storage_gib"));
            assert_eq!(reason(&s), None);
        }

        #[tokio::test]
        async fn other_statuses_and_answers_get_no_details() {
            for status in [
                Status::not_found("tenant 'x' not found"),
                Status::internal("name: state database error"),
                Status::unauthenticated("token: unknown"),
                Status::aborted("node_count: node n1 was taken meanwhile; retrying"),
            ] {
                let response = through_the_edge(status.clone()).await;
                assert!(
                    !response.headers().contains_key(GRPC_STATUS_DETAILS),
                    "{status:?}"
                );
            }
            // An answer (its status comes in the trailers) is left as it is.
            let mut edge = ShortErrorsLayer.layer(Fine);
            let response = edge.call(http::Request::new(())).await.unwrap();
            assert!(response.headers().is_empty());
        }

        /// A handler that answers with a message (no status in the headers).
        struct Fine;

        impl Service<http::Request<()>> for Fine {
            type Response = http::Response<()>;
            type Error = Infallible;
            type Future = Ready<Result<http::Response<()>, Infallible>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                ready(Ok(http::Response::new(())))
            }
        }

        #[tokio::test]
        async fn a_long_refusal_is_cut_and_its_details_stay_small() {
            let long = format!("mig_layout: {}", "1g.10gb=7, é ".repeat(5000));
            let response = through_the_edge(Status::invalid_argument(long.clone())).await;
            let header_bytes: usize = response
                .headers()
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum();
            // Under HTTP/2's usual 16 KiB header list limit, with room to spare.
            assert!(header_bytes < 12 * 1024, "{header_bytes} bytes of headers");
            let s = Status::from_header_map(response.headers()).unwrap();
            assert!(s.message().starts_with("mig_layout: 1g.10gb=7, é"));
            assert!(s
                .message()
                .ends_with(&format!("… (message cut: {} bytes in all)", long.len())));
            assert_eq!(field(&s).as_deref(), Some("mig_layout"));
            let violation = &s.get_details_bad_request().unwrap().field_violations[0];
            assert!(violation.description.len() <= crate::message_cut::MAX_CUT_MESSAGE_BYTES);
            assert!(s.message().ends_with(&violation.description));
            assert_eq!(violation.description.matches("(message cut:").count(), 1);
        }
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
