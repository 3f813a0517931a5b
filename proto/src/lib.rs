//! The gpufleet control-plane API (`gpufleet.v1`), shared by the backend (servers)
//! and the Terraform provider (clients).

// Generated code: a stream message's oneof holds a work order beside small messages; one
// such value at a time is in flight per message, so its size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub mod v1 {
    tonic::include_proto!("gpufleet.v1");
    // The servers, compiled apart with `codec::ServerCodec` (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/servers/gpufleet.v1.rs"));
}

/// The descriptors of both proto files as `protoc` compiled them (a `FileDescriptorSet`):
/// tests/tests/version_skew.rs compares them with the previous release's, whose every
/// field must keep its number and type.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpufleet.v1.fds"));

pub mod codec;
pub mod error_info;
pub mod limits;
pub mod money;

/// The metadata key that carries the bearer token on every call.
pub const AUTHORIZATION: &str = "authorization";

/// Set (to "1") on an UNAVAILABLE answer of a call the control plane did not run at all
/// (a replica that does not lead and could not pass it on): a client may send any call
/// again, not only one that is safe to run twice.
pub const NOT_RUN: &str = "x-gpufleet-not-run";

/// Formats the `authorization` metadata value for a token.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The one client interceptor of every gpufleet client (provider, admin CLI, tests): adds
/// `authorization: Bearer <token>` to each call.
#[derive(Clone, Debug)]
pub struct BearerAuth(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl BearerAuth {
    /// For `token`; None when it cannot travel in a header (not printable ASCII).
    pub fn new(token: &str) -> Option<BearerAuth> {
        bearer(token).parse().ok().map(|v| BearerAuth(Some(v)))
    }

    /// No token: the backend answers UNAUTHENTICATED.
    pub fn none() -> BearerAuth {
        BearerAuth(None)
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// Converts between protobuf timestamps and Unix seconds (the API has one-second resolution).
pub mod timestamp {
    pub use prost_types::Timestamp;

    pub fn from_unix(seconds: i64) -> Timestamp {
        Timestamp { seconds, nanos: 0 }
    }

    pub fn to_unix(ts: &Timestamp) -> i64 {
        ts.seconds
    }
}
