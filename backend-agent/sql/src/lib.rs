//! The store's two engines behind one interface (issue 41): the embedded SQLite of one
//! machine, and PostgreSQL for replicas that share one database.
//!
//! A store function takes a [`Conn`] and runs the same statement text on either engine:
//! statements are written with SQLite's numbered placeholders (`?1`), which are rewritten
//! to PostgreSQL's (`$1`) for it; values cross as [`Value`]s, and rows come back as
//! [`Row`]s of them, so that an `i64` column reads the same from `INTEGER` and `BIGINT`.
//! Where the engines' SQL must differ, the caller asks [`Conn::engine`].
//!
//! [`Database`] owns a connection and runs a write in a transaction that is serializable
//! on both engines: SQLite's `BEGIN IMMEDIATE` (one writer at a time), PostgreSQL's
//! `SERIALIZABLE`, which a write that raced another may fail; such a write is run again
//! from its start, a bounded number of times (`database::MAX_ATTEMPTS`).

pub mod conn;
pub mod database;
pub mod error;
pub mod placeholders;
pub mod pool;
pub mod savepoint;
pub mod tls;
pub mod value;

#[cfg(feature = "test-server")]
pub mod test_server;

pub use conn::{AsConn, Conn, Engine, Row};
pub use database::Database;
pub use error::{Error, Result};
pub use pool::Pool;
pub use savepoint::Savepoint;
pub use value::{FromValue, ToValue, Value};

/// A statement's parameters: `params![a, b]` is `&[&a as &dyn ToValue, &b]`.
#[macro_export]
macro_rules! params {
    () => { &[] as &[&dyn $crate::ToValue] };
    ($($p:expr),+ $(,)?) => { &[$(&$p as &dyn $crate::ToValue),+] as &[&dyn $crate::ToValue] };
}
