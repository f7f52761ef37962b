//! One declaration per table. [`table!`] takes a table's columns, in order, and makes from them the
//! row struct (`sqlx::FromRow`), the column list, the decoding of a row into its entity and the
//! binds of a write, so nothing else names the columns one by one.
//!
//! **Adding a column**: add it in a new migration for both backends and to the entity, then add one
//! line to the table's `table!` in `inbound_routes.rs`, `consumers.rs` or `upstreams.rs`:
//! `column: StoredType,` when the entity field has the column's name and type, else
//! `column as field: StoredType = Codec,` with the [`Codec`] that turns the field into the stored
//! value and back ([`Json`] for lists, maps and objects, [`Word`] for enums).
//!
//! Both schemas have the same columns and portable types, and SQLite accepts PostgreSQL's `$1`
//! placeholders, so each statement is written once for both backends.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Database;
use sqlx::query::Query;

use super::StoreError;

/// A table: its name, its columns and how a row becomes its entity. Made by [`table!`].
pub(crate) trait Table: Send + Unpin + Sized {
    /// What a row holds, as the rest of the host sees it.
    type Entity: Send + Sync;
    const NAME: &'static str;
    /// Every column, in declaration order; the first is the key.
    const COLUMNS: &'static str;
    /// The first column.
    const KEY: &'static str;

    /// The entity, or [`StoreError::Corrupt`] naming the row and column that cannot be read.
    fn decode(self) -> Result<Self::Entity, StoreError>;

    /// `SELECT <columns> FROM <table> <rest>`, `rest` being the `WHERE`/`ORDER BY` clauses.
    fn select(rest: &str) -> String {
        format!("SELECT {} FROM {} {rest}", Self::COLUMNS, Self::NAME)
    }

    /// `INSERT INTO <table> (<columns>) VALUES ($1, …)`, for [`Bind::bind`].
    fn insert() -> String {
        insert_sql(Self::NAME, Self::COLUMNS)
    }

    /// `UPDATE <table> SET <column> = $2, … WHERE <key> = $1`, for [`Bind::bind`].
    fn update() -> String {
        update_sql(Self::NAME, Self::COLUMNS)
    }
}

/// The binds of a write ([`Table::insert`], [`Table::update`]) on database `DB`: every column of
/// the entity, in declaration order. Made by [`table!`].
pub(crate) trait Bind<DB: Database>: Table {
    fn bind<'q>(
        entity: &Self::Entity,
        query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    ) -> Query<'q, DB, <DB as Database>::Arguments<'q>>;
}

/// How an entity field of type `T` is kept in its column.
pub(crate) trait Codec<T> {
    /// The column's type on the Rust side.
    type Stored;
    fn encode(value: &T) -> Self::Stored;
    /// Why the stored value is not a `T`, when it is not.
    fn decode(stored: Self::Stored) -> Result<T, String>;
}

/// The field is stored as it is.
pub(crate) struct Plain;

impl<T: Clone> Codec<T> for Plain {
    type Stored = T;

    fn encode(value: &T) -> T {
        value.clone()
    }

    fn decode(stored: T) -> Result<T, String> {
        Ok(stored)
    }
}

/// The field is stored as JSON text.
pub(crate) struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    type Stored = String;

    fn encode(value: &T) -> String {
        to_json(value)
    }

    fn decode(stored: String) -> Result<T, String> {
        serde_json::from_str(&stored).map_err(|e| e.to_string())
    }
}

/// An optional field is stored as JSON text, or `NULL` when it is `None`.
pub(crate) struct NullableJson;

impl<T: Serialize + DeserializeOwned> Codec<Option<T>> for NullableJson {
    type Stored = Option<String>;

    fn encode(value: &Option<T>) -> Option<String> {
        value.as_ref().map(to_json)
    }

    fn decode(stored: Option<String>) -> Result<Option<T>, String> {
        stored.map(<Json as Codec<T>>::decode).transpose()
    }
}

/// An enum is stored as its JSON string without quotes (`openai_compat`, `if-different-protocol`).
pub(crate) struct Word;

impl<T: Serialize + DeserializeOwned> Codec<T> for Word {
    type Stored = String;

    fn encode(value: &T) -> String {
        match serde_json::to_value(value) {
            Ok(serde_json::Value::String(s)) => s,
            _ => String::new(),
        }
    }

    fn decode(stored: String) -> Result<T, String> {
        serde_json::from_value(serde_json::Value::String(stored)).map_err(|e| e.to_string())
    }
}

pub(crate) fn to_json(value: &impl Serialize) -> String {
    // Serialising maps of strings, lists and JSON values cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// Declares a table; see the [module documentation](self). The entity must have a field for every
/// column, named like the column unless `column as field` says otherwise:
///
/// ```ignore
/// table! {
///     /// An `upstreams` row.
///     UpstreamRow: Upstream = "upstreams" {
///         id: String,
///         group_name as group: String,
///         capabilities: Option<String> = NullableJson,
///     }
/// }
/// ```
macro_rules! table {
    ($(#[$meta:meta])* $row:ident: $entity:ident = $name:literal { $($columns:tt)* }) => {
        $crate::store::table::table!(@column [$(#[$meta])* $row, $entity, $name] [] $($columns)*);
    };
    // Each column is normalised to `(column, field, stored type, codec)`.
    (@column $head:tt [$($done:tt)*] $col:ident as $field:ident: $ty:ty = $codec:ty $(, $($rest:tt)*)?) => {
        $crate::store::table::table!(@column $head [$($done)* ($col, $field, $ty, $codec)] $($($rest)*)?);
    };
    (@column $head:tt [$($done:tt)*] $col:ident as $field:ident: $ty:ty $(, $($rest:tt)*)?) => {
        $crate::store::table::table!(@column $head [$($done)* ($col, $field, $ty, $crate::store::table::Plain)] $($($rest)*)?);
    };
    (@column $head:tt [$($done:tt)*] $col:ident: $ty:ty = $codec:ty $(, $($rest:tt)*)?) => {
        $crate::store::table::table!(@column $head [$($done)* ($col, $col, $ty, $codec)] $($($rest)*)?);
    };
    (@column $head:tt [$($done:tt)*] $col:ident: $ty:ty $(, $($rest:tt)*)?) => {
        $crate::store::table::table!(@column $head [$($done)* ($col, $col, $ty, $crate::store::table::Plain)] $($($rest)*)?);
    };
    (@column [$(#[$meta:meta])* $row:ident, $entity:ident, $name:literal]
        [($key:ident, $key_field:ident, $key_ty:ty, $key_codec:ty) $(($col:ident, $field:ident, $ty:ty, $codec:ty))*]) => {
        $(#[$meta])*
        #[derive(sqlx::FromRow)]
        pub(crate) struct $row {
            pub $key: $key_ty,
            $(pub $col: $ty,)*
        }

        impl $crate::store::table::Table for $row {
            type Entity = $entity;
            const NAME: &'static str = $name;
            const COLUMNS: &'static str = concat!(stringify!($key) $(, ", ", stringify!($col))*);
            const KEY: &'static str = stringify!($key);

            fn decode(self) -> Result<$entity, $crate::store::StoreError> {
                use $crate::store::table::Codec;
                let key = self.$key.clone();
                let corrupt = |column: &str, message: String| $crate::store::StoreError::Corrupt {
                    table: $name,
                    id: key.clone(),
                    message: format!("{column}: {message}"),
                };
                Ok($entity {
                    $key_field: <$key_codec as Codec<_>>::decode(self.$key)
                        .map_err(|e| corrupt(stringify!($key), e))?,
                    $($field: <$codec as Codec<_>>::decode(self.$col)
                        .map_err(|e| corrupt(stringify!($col), e))?,)*
                })
            }
        }

        impl<DB: sqlx::Database> $crate::store::table::Bind<DB> for $row
        where
            $key_ty: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
            $($ty: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,)*
        {
            fn bind<'q>(
                entity: &$entity,
                query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
            ) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>> {
                use $crate::store::table::Codec;
                query
                    .bind(<$key_codec as Codec<_>>::encode(&entity.$key_field))
                    $(.bind(<$codec as Codec<_>>::encode(&entity.$field)))*
            }
        }
    };
}

pub(crate) use table;

/// `$1, $2, … $n`.
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `INSERT INTO table (columns) VALUES ($1…)`.
pub(crate) fn insert_sql(table: &str, columns: &str) -> String {
    let n = columns.split(',').count();
    format!(
        "INSERT INTO {table} ({columns}) VALUES ({})",
        placeholders(n)
    )
}

/// `UPDATE table SET c2 = $2, … WHERE c1 = $1` (the first column is the key).
pub(crate) fn update_sql(table: &str, columns: &str) -> String {
    let mut columns = columns.split(',').map(str::trim);
    let key = columns.next().unwrap_or("id");
    let sets: Vec<String> = columns
        .enumerate()
        .map(|(i, c)| format!("{c} = ${}", i + 2))
        .collect();
    format!("UPDATE {table} SET {} WHERE {key} = $1", sets.join(", "))
}

/// A unique-index violation becomes `conflict`; anything else a database error.
pub(crate) fn unique_or(
    backend: &'static str,
    e: sqlx::Error,
    conflict: impl FnOnce() -> StoreError,
) -> StoreError {
    if e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
    {
        conflict()
    } else {
        StoreError::Database { backend, source: e }
    }
}

pub(crate) fn not_found(entity: &'static str, id: &str) -> StoreError {
    StoreError::NotFound {
        entity,
        id: id.to_owned(),
    }
}

pub(crate) fn conflict(field: &str, message: String) -> StoreError {
    StoreError::Conflict {
        field: Some(field.to_owned()),
        message,
    }
}

pub(crate) fn name_conflict(what: &str, name: &str) -> StoreError {
    conflict("name", format!("name: a {what} named `{name}` exists"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_helpers_number_their_placeholders() {
        assert_eq!(
            insert_sql("t", "id, a, b"),
            "INSERT INTO t (id, a, b) VALUES ($1, $2, $3)"
        );
        assert_eq!(
            update_sql("t", "id, a, b"),
            "UPDATE t SET a = $2, b = $3 WHERE id = $1"
        );
    }
}
