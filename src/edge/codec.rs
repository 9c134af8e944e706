//! The gRPC codec of `RateLimitService`: prost's, except that a request that does not decode
//! (malformed protobuf, a string field that is not UTF-8) is answered INVALID_ARGUMENT, the
//! caller's mistake, where prost's codec says INTERNAL, a server fault that Envoy's and the
//! dashboards' error rates would blame on floodgate.
//!
//! Such a request never reaches the handler, so the codec counts it itself, for
//! `floodgate_requests_total{code="INVALID_ARGUMENT"}` ([`metrics::record_undecodable`]).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::metrics;

/// prost's codec with an undecodable request answered INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// prost's decoder, whose failures are the caller's.
#[derive(Debug)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            metrics::record_undecodable();
            Status::invalid_argument(format!("the message does not decode: {}", status.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
