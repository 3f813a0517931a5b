//! Values between the store and either engine. Both engines' integers are 64-bit here
//! (SQLite's `INTEGER`, PostgreSQL's `BIGINT`), reals are `f64`, and booleans are stored
//! as integers 0 and 1 on SQLite; reading checks the range, so a `u32` never wraps.

use bytes::BytesMut;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use crate::error::{Error, Result};

/// One parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// A Rust value a statement takes as a parameter.
pub trait ToValue {
    fn to_value(&self) -> Result<Value>;
}

/// A Rust value a column reads as.
pub trait FromValue: Sized {
    fn from_value(v: &Value) -> Result<Self, String>;
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Result<Value> {
                i64::try_from(*self)
                    .map(Value::Integer)
                    .map_err(|_| Error::Parameter(format!("{self} does not fit a 64-bit integer")))
            }
        }
        impl FromValue for $t {
            fn from_value(v: &Value) -> Result<Self, String> {
                match v {
                    Value::Integer(i) => <$t>::try_from(*i)
                        .map_err(|_| format!("{i} does not fit {}", stringify!($t))),
                    other => Err(format!("{other:?} is not an integer")),
                }
            }
        }
    )*};
}
integers!(i64, i32, i16, u8, u16, u32, u64, usize);

impl ToValue for bool {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Integer(i64::from(*self)))
    }
}
impl FromValue for bool {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Integer(0) => Ok(false),
            Value::Integer(1) => Ok(true),
            other => Err(format!("{other:?} is not a boolean (0 or 1)")),
        }
    }
}

impl ToValue for f64 {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Real(*self))
    }
}
impl FromValue for f64 {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Real(r) => Ok(*r),
            // SQLite stores a whole real as an integer when its column has no type.
            Value::Integer(i) => Ok(*i as f64),
            other => Err(format!("{other:?} is not a number")),
        }
    }
}

impl ToValue for str {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Text(self.to_string()))
    }
}
impl ToValue for String {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Text(self.clone()))
    }
}
impl FromValue for String {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            other => Err(format!("{other:?} is not text")),
        }
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Blob(self.clone()))
    }
}
impl ToValue for [u8] {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Blob(self.to_vec()))
    }
}
impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Blob(b) => Ok(b.clone()),
            other => Err(format!("{other:?} is not a blob")),
        }
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Result<Value> {
        match self {
            Some(v) => v.to_value(),
            None => Ok(Value::Null),
        }
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Result<Value> {
        (**self).to_value()
    }
}

impl ToValue for Value {
    fn to_value(&self) -> Result<Value> {
        Ok(self.clone())
    }
}
impl FromValue for Value {
    fn from_value(v: &Value) -> Result<Self, String> {
        Ok(v.clone())
    }
}

impl From<rusqlite::types::ValueRef<'_>> for Value {
    fn from(v: rusqlite::types::ValueRef<'_>) -> Self {
        use rusqlite::types::ValueRef;
        match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(r) => Value::Real(r),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        }
    }
}

impl From<Value> for rusqlite::types::Value {
    fn from(v: Value) -> Self {
        use rusqlite::types::Value as V;
        match v {
            Value::Null => V::Null,
            Value::Integer(i) => V::Integer(i),
            Value::Real(r) => V::Real(r),
            Value::Text(t) => V::Text(t),
            Value::Blob(b) => V::Blob(b),
        }
    }
}

/// A parameter to PostgreSQL, encoded as the type the server inferred for it: an integer
/// binds to `BIGINT`, `INTEGER`, `SMALLINT` (range-checked), `BOOLEAN` (0 or 1) or a
/// float column; text to any text type.
impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::BOOL => match i {
                    0 | 1 => (*i == 1).to_sql(ty, out),
                    _ => Err(format!("{i} is not a boolean (0 or 1)").into()),
                },
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                _ => Err(format!("an integer for a {ty} column").into()),
            },
            Value::Real(r) => match *ty {
                Type::FLOAT8 => r.to_sql(ty, out),
                Type::FLOAT4 => (*r as f32).to_sql(ty, out),
                _ => Err(format!("a real for a {ty} column").into()),
            },
            Value::Text(t) => t.as_str().to_sql(ty, out),
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in to_sql, where the value's kind is known.
        true
    }

    to_sql_checked!();
}

/// A PostgreSQL column's value as a [`Value`], by its type.
pub(crate) fn from_postgres(row: &postgres::Row, i: usize) -> Result<Value> {
    let ty = row.columns()[i].type_().clone();
    let column = |e: postgres::Error| Error::Column {
        index: i,
        reason: e.to_string(),
    };
    let v = match ty {
        // A function that returns nothing (pg_advisory_xact_lock).
        Type::VOID => None,
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)
            .map_err(column)?
            .map(Value::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)
            .map_err(column)?
            .map(|v| Value::Integer(v.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)
            .map_err(column)?
            .map(|v| Value::Integer(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)
            .map_err(column)?
            .map(|v| Value::Integer(v.into())),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(i)
            .map_err(column)?
            .map(Value::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)
            .map_err(column)?
            .map(|v| Value::Real(v.into())),
        Type::BYTEA => row
            .try_get::<_, Option<Vec<u8>>>(i)
            .map_err(column)?
            .map(Value::Blob),
        _ => row
            .try_get::<_, Option<String>>(i)
            .map_err(|e| Error::Column {
                index: i,
                reason: format!("type {ty} is not read here: {e}"),
            })?
            .map(Value::Text),
    };
    Ok(v.unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_range_checked_both_ways() {
        assert_eq!(7u32.to_value().unwrap(), Value::Integer(7));
        assert!(u64::MAX.to_value().is_err());
        assert_eq!(u32::from_value(&Value::Integer(5)), Ok(5));
        assert!(u32::from_value(&Value::Integer(-1)).is_err());
        assert!(i32::from_value(&Value::Integer(i64::MAX)).is_err());
        assert!(i64::from_value(&Value::Text("1".into())).is_err());
    }

    #[test]
    fn null_is_none_and_booleans_are_0_or_1() {
        assert_eq!(Option::<i64>::from_value(&Value::Null), Ok(None));
        assert_eq!(Option::<i64>::from_value(&Value::Integer(3)), Ok(Some(3)));
        assert!(i64::from_value(&Value::Null).is_err());
        assert_eq!(bool::from_value(&Value::Integer(1)), Ok(true));
        assert!(bool::from_value(&Value::Integer(2)).is_err());
        assert_eq!(None::<String>.to_value().unwrap(), Value::Null);
    }
}
