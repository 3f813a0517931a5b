//! Requests cut short: a gRPC request body that ends inside a message (its 5-byte prefix
//! announced more bytes than came before the stream ended) is the caller's malformed
//! request, INVALID_ARGUMENT, like bytes that do not decode (`gpufleet_proto::codec`).
//! tonic's decoder would answer INTERNAL ("Unexpected EOF decoding stream.") and count it
//! as an internal error. This layer follows the framing of each request body as it passes
//! and ends such a body with that status instead; everything else passes untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::body::BoxBody;
use tonic::codegen::Bytes;
use tonic::Status;

/// The gRPC prefix of each message: a compression flag and a big-endian length.
const PREFIX: usize = 5;

#[derive(Clone, Copy, Debug, Default)]
pub struct RequestFramingLayer;

impl<S> tower_layer::Layer<S> for RequestFramingLayer {
    type Service = RequestFraming<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestFraming { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestFraming<S> {
    inner: S,
}

impl<S> tower_service::Service<http::Request<BoxBody>> for RequestFraming<S>
where
    S: tower_service::Service<http::Request<BoxBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<BoxBody>) -> Self::Future {
        self.inner
            .call(request.map(|body| tonic::body::boxed(Framed::new(body))))
    }
}

/// Where a body is in its framing.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Framing {
    prefix: [u8; PREFIX],
    /// Bytes of the current prefix seen (0 between messages).
    prefix_seen: usize,
    /// The current message's length, and how many of its bytes are still to come.
    length: u32,
    to_come: u32,
}

impl Framing {
    fn advance(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.to_come > 0 {
                let n = (self.to_come as usize).min(data.len());
                self.to_come -= n as u32;
                data = &data[n..];
                continue;
            }
            let n = (PREFIX - self.prefix_seen).min(data.len());
            self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&data[..n]);
            self.prefix_seen += n;
            data = &data[n..];
            if self.prefix_seen == PREFIX {
                let length = [
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ];
                self.length = u32::from_be_bytes(length);
                self.to_come = self.length;
                self.prefix_seen = 0;
            }
        }
    }

    /// Why a body that ended here was cut short; None when it ended between messages.
    fn cut_short(&self) -> Option<String> {
        if self.prefix_seen > 0 {
            Some(format!(
                "the request ends inside a message's 5-byte prefix ({} bytes of it came)",
                self.prefix_seen
            ))
        } else if self.to_come > 0 {
            Some(format!(
                "the request ends inside a message: its prefix says {} bytes, {} came",
                self.length,
                self.length - self.to_come
            ))
        } else {
            None
        }
    }
}

/// A request body whose framing is followed.
struct Framed {
    inner: BoxBody,
    framing: Framing,
    /// The cut was reported: the body is over.
    ended: bool,
}

impl Framed {
    fn new(inner: BoxBody) -> Self {
        Self {
            inner,
            framing: Framing::default(),
            ended: false,
        }
    }
}

impl Body for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.framing.advance(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(
                    self.framing
                        .cut_short()
                        .map(|why| Err(Status::invalid_argument(why))),
                )
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        // A body cut short still has its error to tell.
        self.ended || (self.inner.is_end_stream() && self.framing.cut_short().is_none())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(chunks: &[&[u8]]) -> Framing {
        let mut f = Framing::default();
        for c in chunks {
            f.advance(c);
        }
        f
    }

    #[test]
    fn a_body_is_cut_short_only_inside_a_message() {
        // Two whole messages (3 bytes, then empty), split anywhere.
        let whole: &[u8] = &[0, 0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 0, 0];
        for split in 0..whole.len() {
            let (a, b) = whole.split_at(split);
            assert_eq!(framed(&[a, b]).cut_short(), None, "split at {split}");
        }
        assert_eq!(
            framed(&[&[0, 0, 0, 0, 10, 1, 2, 3]]).cut_short().unwrap(),
            "the request ends inside a message: its prefix says 10 bytes, 3 came"
        );
        assert!(framed(&[&[0, 0, 0]])
            .cut_short()
            .unwrap()
            .contains("5-byte prefix (3 bytes of it came)"));
        assert_eq!(framed(&[]).cut_short(), None);
    }
}
