//! Prometheus metrics: `--metrics-listen ADDR` (`GPUFLEET_METRICS_LISTEN`) on `serve` and
//! on `node` serves the text exposition format at `GET /metrics` (off by default). What is
//! measured belongs to each program (the control plane's and the node agent's `metrics`);
//! this is the endpoint and the encoding they share, and who may scrape it ([`Access`], or
//! the program itself by the bearer token presented: [`listen_by_token`]). At most
//! `MAX_SCRAPES_AT_ONCE` scrapes render at a time, one more is answered 503; behind
//! [`listen_by_token`] the program bounds its renders itself, per caller (it answers
//! [`Unrendered::Busy`]), so that one caller's flood cannot take another's slots.
//!
//! Encoding is the `prometheus` crate's; the HTTP side is the axum/hyper that tonic brings.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus::proto::MetricFamily;
use prometheus::Encoder;

/// Who may scrape an endpoint.
#[derive(Clone)]
pub enum Access {
    /// Anyone who reaches the address (the node agent's per-GPU metrics of its own host).
    Open,
    /// Only a request with `Authorization: Bearer <token>`; any other gets 401 and no data
    /// (nothing is rendered for it). `hint` ends the 401's body: how to get the token.
    Bearer { token: String, hint: &'static str },
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Open => f.write_str("Open"),
            Access::Bearer { hint, .. } => {
                write!(f, "Bearer {{ token: <hidden>, hint: {hint:?} }}")
            }
        }
    }
}

impl Access {
    /// Whether a request with these headers may scrape.
    #[cfg(test)]
    fn allows(&self, headers: &http::HeaderMap) -> bool {
        match self {
            Access::Open => true,
            Access::Bearer { token, .. } => {
                bearer(headers).is_some_and(|given| same(given.as_bytes(), token.as_bytes()))
            }
        }
    }
}

/// Equality whose time does not depend on where the bytes first differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a scrape is answered: the text, `None` for a refused token (401, no data), or
/// why there is none.
pub type Rendered = Result<Option<String>, Unrendered>;

/// Why a scrape got no text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrendered {
    /// Its caller's slots are all rendering (503: a scraper retries at its next interval).
    Busy(String),
    /// Rendering failed (500).
    Failed(String),
}

impl From<String> for Unrendered {
    fn from(e: String) -> Self {
        Unrendered::Failed(e)
    }
}

type Renderer = Arc<
    dyn Fn(Option<String>) -> std::pin::Pin<Box<dyn Future<Output = Rendered> + Send>>
        + Send
        + Sync,
>;

/// Scrapes rendered at once; one more is answered 503 at once (a scraper retries at its
/// next interval), so no caller can pile up renders.
const MAX_SCRAPES_AT_ONCE: usize = 8;

/// Binds `addr` (port 0 picks a free port) and serves `GET /metrics` until `stop` turns
/// true; every scrape that `access` allows calls `render`. Returns the address bound,
/// logged on stderr (stdout stays the command's own).
pub async fn listen<F, Fut>(
    addr: SocketAddr,
    what: &'static str,
    access: Access,
    render: F,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    let needs = match access {
        Access::Open => "",
        Access::Bearer { .. } => " (bearer token required)",
    };
    let hint = match &access {
        Access::Bearer { hint, .. } => *hint,
        Access::Open => "",
    };
    let renderer: Renderer = Arc::new(move |token: Option<String>| {
        let allowed = match &access {
            Access::Open => true,
            Access::Bearer {
                token: expected, ..
            } => token
                .as_deref()
                .is_some_and(|given| same(given.as_bytes(), expected.as_bytes())),
        };
        let render = render.clone();
        Box::pin(async move {
            if !allowed {
                return Ok(None);
            }
            render().await.map(Some).map_err(Unrendered::Failed)
        })
    });
    let at_once = Some(MAX_SCRAPES_AT_ONCE);
    serve(addr, what, needs, hint, renderer, at_once, stop).await
}

/// Like [`listen`], but what a scrape sees is decided by its bearer token: `render` gets
/// the token presented (a request without one is refused first) and answers `Ok(None)`
/// for a token it does not take, which is a 401 with no data like any refusal. `render`
/// bounds how many render at once, by whom ([`Unrendered::Busy`]): no shared bound here.
pub async fn listen_by_token<F, Fut>(
    addr: SocketAddr,
    what: &'static str,
    hint: &'static str,
    render: F,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Rendered> + Send + 'static,
{
    let renderer: Renderer = Arc::new(move |token: Option<String>| {
        let render = render.clone();
        Box::pin(async move {
            match token {
                Some(t) => render(t).await,
                None => Ok(None),
            }
        })
    });
    serve(
        addr,
        what,
        " (bearer token required; it decides the view)",
        hint,
        renderer,
        None,
        stop,
    )
    .await
}

/// The bearer token of a request, when it carries one of printable ASCII within the
/// longest token any gpufleet program issues.
fn bearer(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| {
            !t.is_empty() && t.len() <= MAX_TOKEN_CHARS && t.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(str::to_string)
}

/// The longest bearer token looked at (gpufleet's tokens are far shorter).
const MAX_TOKEN_CHARS: usize = 512;

async fn serve(
    addr: SocketAddr,
    what: &'static str,
    needs: &'static str,
    hint: &'static str,
    render: Renderer,
    at_once: Option<usize>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    use axum::response::IntoResponse;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen: cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let at_once = at_once.map(|n| (n, Arc::new(tokio::sync::Semaphore::new(n))));
    let handler = move |headers: http::HeaderMap| {
        let render = render.clone();
        let at_once = at_once.clone();
        async move {
            let _permit = match at_once {
                Some((n, slots)) => match slots.try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) => {
                        return (
                            http::StatusCode::SERVICE_UNAVAILABLE,
                            format!("more than {n} scrapes at once; try again\n"),
                        )
                            .into_response()
                    }
                },
                None => None,
            };
            match render(bearer(&headers)).await {
                Ok(Some(text)) => (
                    [(http::header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                    text,
                )
                    .into_response(),
                Ok(None) => (
                    http::StatusCode::UNAUTHORIZED,
                    [(
                        http::header::WWW_AUTHENTICATE,
                        "Bearer realm=\"gpufleet metrics\"",
                    )],
                    format!("missing or invalid bearer token: {hint}\n"),
                )
                    .into_response(),
                Err(Unrendered::Busy(why)) => {
                    (http::StatusCode::SERVICE_UNAVAILABLE, why + "\n").into_response()
                }
                Err(Unrendered::Failed(e)) => {
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
    tracing::info!("serving {what} Prometheus metrics on http://{bound}/metrics{needs}");
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

#[cfg(test)]
mod tests {
    use super::Access;

    fn headers(value: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(v) = value {
            h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_bearer_endpoint_takes_its_token_only() {
        let access = Access::Bearer {
            token: "gfm_secret".into(),
            hint: "",
        };
        assert!(access.allows(&headers(Some("Bearer gfm_secret"))));
        for refused in [
            None,
            Some("Bearer gfm_secre"),
            Some("Bearer gfm_secret2"),
            Some("Bearer "),
            Some("bearer gfm_secret"),
            Some("Basic gfm_secret"),
            Some("gfm_secret"),
        ] {
            assert!(!access.allows(&headers(refused)), "{refused:?}");
        }
        assert!(Access::Open.allows(&headers(None)));
        assert!(!format!("{access:?}").contains("gfm_secret"));
    }
}
