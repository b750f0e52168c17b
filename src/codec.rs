//! The codec of `auth.v1.AuthService`'s server: prost's, except for a request that
//! does not decode.
//!
//! prost's codec answers a malformed message with INTERNAL and the parser's text
//! ("failed to decode Protobuf message: LoginRequest.password: invalid string
//! value…"): the wrong code (the client's fault, not the server's, so it must not
//! count as an internal error in metrics and alerts) and more than the client needs
//! to know about the server. This one answers INVALID_ARGUMENT with one generic
//! message and keeps the parser's text for a debug log line. It owns nothing else:
//! the size limit is tonic's (OUT_OF_RANGE, before any decoding), and encoding is
//! prost's unchanged. `build.rs` generates the server on it; the generated client
//! keeps prost's codec.

use tonic::{
    Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// What the client is told when its request does not decode.
pub const MALFORMED_REQUEST: &str = "malformed request message";

/// A [`Codec`] encoding `T` (responses) and decoding `U` (requests) with prost.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.0.decoder())
    }
}

/// prost's decoder with a decode failure turned into INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|parser| {
            // The parser's text names fields and values of the request: debug only.
            tracing::debug!(error = parser.message(), "malformed request message");
            malformed()
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

fn malformed() -> Status {
    Status::invalid_argument(MALFORMED_REQUEST)
}
