//! An accepted TCP stream that holds its place in the connection table and ends itself
//! when it overstays: no request within the first-request deadline, none in flight for
//! the idle time, or evicted for a newcomer (which wakes it). Ending is a read error, on which the HTTP/2 server drops the connection
//! (and with it the place).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::{Admission, Limits};

pub struct Guarded {
    stream: TcpStream,
    admission: Admission,
    limits: Arc<Limits>,
    /// When to look at the connection's activity again.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Why it was ended, once it was (counted once, then every read fails alike).
    ended: Option<super::Overstayed>,
}

impl Guarded {
    pub fn new(stream: TcpStream, admission: Admission, limits: Arc<Limits>) -> Self {
        let first = tokio::time::Instant::now() + limits.first_request_within;
        Self {
            stream,
            admission,
            limits,
            timer: Box::pin(tokio::time::sleep_until(first)),
            ended: None,
        }
    }

    /// Err when the connection has overstayed; else the timer is armed for the next look.
    fn still_welcome(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.admission.activity.wake_on_eviction(cx.waker());
        loop {
            if let Some(why) = self.ended {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    match why {
                        super::Overstayed::NoRequest => {
                            "no request within the first-request deadline"
                        }
                        super::Overstayed::Idle => "idle past the idle-connection timeout",
                        super::Overstayed::Evicted => {
                            "closed for a newcomer: no caller on it proved who it is"
                        }
                    },
                ));
            }
            match self
                .admission
                .activity
                .verdict(&self.limits, Instant::now())
            {
                Err(why) => {
                    // An eviction is counted when it is decided.
                    if why != super::Overstayed::Evicted {
                        crate::counters::connection_closed(why.label());
                    }
                    self.ended = Some(why);
                }
                Ok(next) => {
                    let next = tokio::time::Instant::from_std(next);
                    if self.timer.deadline() != next {
                        self.timer.as_mut().reset(next);
                    }
                    // Pending registers the waker; Ready means `next` has passed already.
                    if self.timer.as_mut().poll(cx).is_pending() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Pending => match this.still_welcome(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            ready => ready,
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The TCP stream's own connect info, so that requests still carry the peer's address
/// and, under TLS, its certificates (`TlsConnectInfo<TcpConnectInfo>`).
impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
