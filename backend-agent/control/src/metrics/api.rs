//! The API's request metrics: a tower layer around the gRPC server's routes that counts
//! every request by method and gRPC status code (`gpufleet_api_requests_total`) and times it
//! to its response headers (`gpufleet_api_request_seconds`).
//!
//! The code is the response headers' `grpc-status` (where tonic puts a handler's error),
//! else `OK`: a unary call that succeeded, or a stream that started (a stream's later
//! failure travels in its trailers and is not counted again).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::counters::COUNTERS;

/// Counts and times every request of the service it wraps.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApiMetricsLayer;

impl<S> tower_layer::Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ApiMetrics<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for ApiMetrics<S>
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
        let method = method_label(request.uri().path());
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map(code_name)
                    .unwrap_or("OK"),
                Err(_) => "TRANSPORT_ERROR",
            };
            COUNTERS
                .api_seconds
                .with_label_values(&[&method])
                .observe(started.elapsed().as_secs_f64());
            COUNTERS
                .api_requests
                .with_label_values(&[&method, code])
                .inc();
            result
        })
    }
}

/// `gpufleet.v1.Service/Method` for the API's own methods; anything else (a path a client
/// made up) is `other`, so clients cannot make up label values.
fn method_label(path: &str) -> String {
    let name = path.trim_start_matches('/');
    let known = name.strip_prefix("gpufleet.v1.").is_some_and(|rest| {
        let mut parts = rest.split('/');
        matches!(
            (parts.next(), parts.next(), parts.next()),
            (Some(service), Some(method), None)
                if is_identifier(service) && is_identifier(method)
                    && service.ends_with("Service")
        )
    });
    if known {
        name.to_string()
    } else {
        "other".into()
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The gRPC status code's canonical name.
fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_the_apis_own_or_other() {
        assert_eq!(
            method_label("/gpufleet.v1.TenantService/CreateTenant"),
            "gpufleet.v1.TenantService/CreateTenant"
        );
        assert_eq!(method_label("/gpufleet.v1.TenantService/a/b"), "other");
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), "other");
        assert_eq!(method_label("/gpufleet.v1.Evil{x}Service/M"), "other");
        assert_eq!(code_name(5), "NOT_FOUND");
        assert_eq!(code_name(99), "UNKNOWN");
    }
}
