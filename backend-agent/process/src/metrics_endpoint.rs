//! Prometheus metrics: `--metrics-listen ADDR` (`GPUFLEET_METRICS_LISTEN`) on `serve` and
//! on `node` serves the text exposition format at `GET /metrics` (off by default). What is
//! measured belongs to each program (the control plane's and the node agent's `metrics`);
//! this is the endpoint and the encoding they share.
//!
//! Encoding is the `prometheus` crate's; the HTTP side is the axum/hyper that tonic brings.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use prometheus::proto::MetricFamily;
use prometheus::Encoder;

/// Binds `addr` (port 0 picks a free port) and serves `GET /metrics` until `stop` turns
/// true; every scrape calls `render`. Returns the address bound, logged on stderr (stdout
/// stays the command's own).
pub async fn listen<F, Fut>(
    addr: SocketAddr,
    what: &'static str,
    render: F,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    use axum::response::IntoResponse;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen: cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let handler = move || {
        let render = render.clone();
        async move {
            match render().await {
                Ok(text) => (
                    [(http::header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                    text,
                )
                    .into_response(),
                Err(e) => {
                    tracing::error!(error = %e, "cannot render the metrics");
                    (http::StatusCode::INTERNAL_SERVER_ERROR, e).into_response()
                }
            }
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(handler));
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    tracing::info!("serving {what} Prometheus metrics on http://{bound}/metrics");
    Ok(bound)
}

/// The text exposition of `families`, sorted by name.
pub fn encode(mut families: Vec<MetricFamily>) -> Result<String, String> {
    families.sort_by(|a, b| a.get_name().cmp(b.get_name()));
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&families, &mut buf)
        .map_err(|e| format!("encoding the metrics: {e}"))?;
    String::from_utf8(buf).map_err(|e| format!("encoding the metrics: {e}"))
}

/// A gauge family with `labels`, registered in `registry` (names are fixed in code, so a
/// failure is a programming error).
pub fn gauge_vec(
    registry: &prometheus::Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::GaugeVec {
    let g = prometheus::GaugeVec::new(prometheus::Opts::new(name, help), labels)
        .expect("a valid gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("a gauge registered once");
    g
}
