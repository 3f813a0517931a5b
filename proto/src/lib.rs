//! The gpufleet control-plane API (`gpufleet.v1`), shared by the backend (servers)
//! and the Terraform provider (clients).

pub mod v1 {
    tonic::include_proto!("gpufleet.v1");
}

pub mod limits;

/// The metadata key that carries the bearer token on every call.
pub const AUTHORIZATION: &str = "authorization";

/// Formats the `authorization` metadata value for a token.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
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
