//! The request side of the connection bounds: a tower layer that finds each request's
//! connection (by the peer address tonic puts in its extensions) and marks the request as
//! started, and as ended when its response body ends or is dropped. A stream (a node
//! agent's session) is in flight for as long as it lasts, so it is never idle. Each request
//! carries an [`Identity`] of its connection, for authentication to mark.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::body::BoxBody;
use tonic::codegen::Bytes;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

use super::{Activity, Identity, Table};

#[derive(Clone)]
pub struct ActivityLayer {
    table: Arc<Table>,
}

impl ActivityLayer {
    pub fn new(table: Arc<Table>) -> Self {
        Self { table }
    }
}

impl<S> tower_layer::Layer<S> for ActivityLayer {
    type Service = Marked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Marked {
            inner,
            table: self.table.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Marked<S> {
    inner: S,
    table: Arc<Table>,
}

/// The peer address of the connection a request came on, plain or under TLS.
pub fn remote_addr<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    let ext = request.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

impl<S> tower_service::Service<http::Request<BoxBody>> for Marked<S>
where
    S: tower_service::Service<http::Request<BoxBody>, Response = http::Response<BoxBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<BoxBody>) -> Self::Future {
        // Connections that do not come through the table (none today) are not tracked.
        let activity = remote_addr(&request).and_then(|addr| self.table.activity(&addr));
        if let Some(a) = &activity {
            request.extensions_mut().insert(Identity::new(a.clone()));
        }
        let guard = activity.map(InFlight::start);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| {
                    tonic::body::boxed(Tracked {
                        inner: body,
                        _guard: guard,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A request in flight on its connection until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        activity.request_started();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that keeps its request in flight until it ends or is dropped.
struct Tracked {
    inner: BoxBody,
    _guard: InFlight,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
