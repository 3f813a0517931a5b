//! A connection, or a transaction, of either engine, as store functions take it.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::placeholders;
use crate::value::{self, FromValue, ToValue, Value};

/// Which engine a [`Conn`] runs on, for the few statements whose SQL must differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// The statements a PostgreSQL connection has prepared, by their text: a statement
/// given as text is prepared (a round trip to the server) and then run (another); one
/// prepared before is only run. Prepared statements belong to the connection, and live
/// through its transactions, rolled back or not. At most [`MAX_STATEMENTS`]: past that
/// the cache starts again (the store has a few hundred statements).
#[derive(Default)]
pub(crate) struct Statements(RefCell<HashMap<String, postgres::Statement>>);

/// How many prepared statements a connection keeps.
const MAX_STATEMENTS: usize = 1024;

impl Statements {
    fn get(
        &self,
        client: &mut impl postgres::GenericClient,
        sql: &str,
    ) -> Result<postgres::Statement, postgres::Error> {
        if let Some(stmt) = self.0.borrow().get(sql) {
            return Ok(stmt.clone());
        }
        let stmt = client.prepare(sql)?;
        let mut cache = self.0.borrow_mut();
        if cache.len() >= MAX_STATEMENTS {
            cache.clear();
        }
        cache.insert(sql.to_string(), stmt.clone());
        Ok(stmt)
    }
}

/// A PostgreSQL client, or one of its transactions, with its connection's prepared
/// statements; in a cell, as postgres' calls take `&mut` and a [`Conn`] is shared and
/// copied as a `&rusqlite::Connection` is.
pub(crate) struct Pg<C, S> {
    pub(crate) cell: RefCell<C>,
    pub(crate) statements: S,
}

impl<C, S: std::borrow::Borrow<Statements>> Pg<C, S> {
    pub(crate) fn new(client: C, statements: S) -> Self {
        Pg {
            cell: RefCell::new(client),
            statements,
        }
    }
}

/// What [`Conn`] asks of a [`Pg`] (`postgres::GenericClient` is not object safe).
pub(crate) trait PgCell {
    fn run(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, postgres::Error>;
    fn rows(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error>;
    /// Statements without parameters, by the simple query protocol.
    fn batch(&self, sql: &str) -> Result<(), postgres::Error>;
}

impl<C: postgres::GenericClient, S: std::borrow::Borrow<Statements>> PgCell for Pg<C, S> {
    fn run(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let mut client = self.cell.borrow_mut();
        let stmt = self.statements.borrow().get(&mut *client, sql)?;
        client.execute(&stmt, params)
    }
    fn rows(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        let mut client = self.cell.borrow_mut();
        let stmt = self.statements.borrow().get(&mut *client, sql)?;
        client.query(&stmt, params)
    }
    fn batch(&self, sql: &str) -> Result<(), postgres::Error> {
        self.cell.borrow_mut().batch_execute(sql)
    }
}

/// A connection or an open transaction: statements run on it as they come. Copied
/// freely; it borrows what it runs on.
#[derive(Clone, Copy)]
pub struct Conn<'a> {
    inner: Inner<'a>,
}

#[derive(Clone, Copy)]
enum Inner<'a> {
    Sqlite(&'a rusqlite::Connection),
    Postgres(&'a (dyn PgCell + 'a)),
}

/// What a store function takes: a [`Conn`], or a rusqlite connection or transaction
/// (its callers that still speak rusqlite pass theirs unchanged).
pub trait AsConn {
    fn as_conn(&self) -> Conn<'_>;
}

impl AsConn for Conn<'_> {
    fn as_conn(&self) -> Conn<'_> {
        *self
    }
}

impl AsConn for rusqlite::Connection {
    fn as_conn(&self) -> Conn<'_> {
        Conn::sqlite(self)
    }
}

impl AsConn for rusqlite::Transaction<'_> {
    fn as_conn(&self) -> Conn<'_> {
        Conn::sqlite(self)
    }
}

impl AsConn for rusqlite::Savepoint<'_> {
    fn as_conn(&self) -> Conn<'_> {
        Conn::sqlite(self)
    }
}

/// A row read: its columns' values, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    /// Column `index` as `T`; an error names the column and why it does not fit.
    pub fn get<T: FromValue>(&self, index: usize) -> Result<T> {
        let v = self.values.get(index).ok_or_else(|| Error::Column {
            index,
            reason: format!("the row has {} columns", self.values.len()),
        })?;
        T::from_value(v).map_err(|reason| Error::Column { index, reason })
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The columns' values, in order (a copy of a whole row to another engine).
    pub fn into_values(self) -> Vec<Value> {
        self.values
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

fn values(params: &[&dyn ToValue]) -> Result<Vec<Value>> {
    params.iter().map(|p| p.to_value()).collect()
}

impl<'a> Conn<'a> {
    /// An SQLite connection or transaction (`rusqlite::Transaction` derefs to it).
    pub fn sqlite(conn: &'a rusqlite::Connection) -> Self {
        Conn {
            inner: Inner::Sqlite(conn),
        }
    }

    pub(crate) fn postgres(client: &'a (dyn PgCell + 'a)) -> Self {
        Conn {
            inner: Inner::Postgres(client),
        }
    }

    pub fn engine(&self) -> Engine {
        match self.inner {
            Inner::Sqlite(_) => Engine::Sqlite,
            Inner::Postgres(_) => Engine::Postgres,
        }
    }

    /// Runs a statement that returns no rows; how many rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize> {
        let params = values(params)?;
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.prepare_cached(sql)?.execute(rusqlite::params_from_iter(
                params.into_iter().map(rusqlite::types::Value::from),
            ))?),
            Inner::Postgres(c) => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as _).collect();
                let n = c.run(&placeholders::to_postgres(sql), &refs)?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            }
        }
    }

    /// Runs several statements without parameters (a schema's), in order.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(c) => Ok(c.batch(sql)?),
        }
    }

    /// Every row a query returns.
    pub fn query(&self, sql: &str, params: &[&dyn ToValue]) -> Result<Vec<Row>> {
        let params = values(params)?;
        match &self.inner {
            Inner::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let columns = stmt.column_count();
                let mut rows = stmt.query(rusqlite::params_from_iter(
                    params.into_iter().map(rusqlite::types::Value::from),
                ))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let values = (0..columns)
                        .map(|i| r.get_ref(i).map(Value::from))
                        .collect::<rusqlite::Result<_>>()?;
                    out.push(Row { values });
                }
                Ok(out)
            }
            Inner::Postgres(c) => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as _).collect();
                let rows = c.rows(&placeholders::to_postgres(sql), &refs)?;
                rows.iter()
                    .map(|r| {
                        let values = (0..r.len())
                            .map(|i| value::from_postgres(r, i))
                            .collect::<Result<_>>()?;
                        Ok(Row { values })
                    })
                    .collect()
            }
        }
    }

    /// The first row a query returns, read by `f`; [`Error::NoRows`] when there is none.
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        self.query_opt(sql, params, f)?.ok_or(Error::NoRows)
    }

    /// The first row a query returns, read by `f`, if there is one.
    pub fn query_opt<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<Option<T>> {
        self.query(sql, params)?.first().map(f).transpose()
    }

    /// Every row a query returns, each read by `f`.
    pub fn query_map<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        f: impl FnMut(&Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.query(sql, params)?.iter().map(f).collect()
    }
}
