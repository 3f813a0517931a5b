//! The servers' codec: protobuf like tonic's own, except that a request that does not
//! decode (a string that is not UTF-8, a truncated message, a wrong wire type, nesting
//! past prost's recursion limit) is INVALID_ARGUMENT, the caller's fault, where tonic
//! answers INTERNAL. It fails before any handler runs, so before authentication too.
//! Clients keep tonic's codec: a response that does not decode is the server's fault.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, ProstCodec};
use tonic::Status;

/// [`ProstCodec`] with requests that do not decode answered INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ServerCodec<T, U> {
    inner: ProstCodec<T, U>,
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for ServerCodec<T, U> {
    fn default() -> Self {
        Self {
            inner: ProstCodec::default(),
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for ServerCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = RequestDecoder<<ProstCodec<T, U> as Codec>::Decoder>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.inner.decoder())
    }
}

/// A decoder whose failures are the request's.
#[derive(Debug)]
pub struct RequestDecoder<D>(D);

impl<D: Decoder<Error = Status>> Decoder for RequestDecoder<D> {
    type Item = D::Item;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        // Prost's decoder fails only on bytes that are not the message.
        self.0
            .decode(buf)
            .map_err(|s| Status::invalid_argument(s.message()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
