//! What both ends of the node agent protocol share beyond its generated messages: the
//! inventory conversions (`inventory`), the words of check results both read (`checks`), the name rule (`names`), the protocol's version and the skew both ends accept
//! (`protocol_version`), the TLS set-up of the channel (`tls`) and the small CA that issues its certificates (`pki`) and revokes them (`revocation`), and the API server's reloadable TLS (`server_tls`). It knows nothing
//! of either end's state.

pub mod checks;
pub mod inventory;
pub mod names;
pub mod order_kind;
pub mod pki;
pub mod protocol_version;
pub mod revocation;
pub mod server_tls;
pub mod tls;
pub mod volumes;
