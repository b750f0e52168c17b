//! The one executor type the store's statements run on, whichever the backend: a
//! [`Statement`] (its text and its arguments), run on a [`Conn`] (one connection,
//! inside the transaction its backend holds) or on [`Conns`] (a backend's pool: a
//! connection leased for one statement, bounded), gives [`Row`]s read by column.
//! The operations of `users`, `session`, `admin`, `factor` are plain functions over
//! these, written once for SQLite and PostgreSQL; the arguments are bound with the
//! same Rust types on both (`i64`, `&str`, `String`, `Option<&str>`).

use super::{
    connection::{Connections, Lease, within},
    error::StoreError,
};
use sqlx::{
    Decode, PgConnection, Postgres, Row as _, Sqlite, SqliteConnection, Type,
    postgres::{PgArguments, PgRow},
    query::Query,
    sqlite::{SqliteArguments, SqliteRow},
};

/// A query on SQLite, its text static.
pub(super) type SqliteQuery = Query<'static, Sqlite, SqliteArguments>;
type PgQuery = Query<'static, Postgres, PgArguments>;

/// One argument of a statement, bound as the Rust type it holds.
#[derive(Debug, Clone)]
pub(super) enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    Owned(String),
    MaybeText(Option<&'a str>),
    MaybeInt(Option<i64>),
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(value)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(value)
    }
}

impl From<String> for Arg<'_> {
    fn from(value: String) -> Self {
        Arg::Owned(value)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::MaybeText(value)
    }
}

impl Arg<'_> {
    /// `query` with this argument as its next.
    pub(super) fn bind_sqlite(self, query: SqliteQuery) -> SqliteQuery {
        match self {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::Owned(v) => query.bind(v),
            Arg::MaybeText(v) => query.bind(v),
            Arg::MaybeInt(v) => query.bind(v),
        }
    }

    fn bind_postgres(self, query: PgQuery) -> PgQuery {
        match self {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::Owned(v) => query.bind(v),
            Arg::MaybeText(v) => query.bind(v),
            Arg::MaybeInt(v) => query.bind(v),
        }
    }
}

/// A statement's text and its arguments, `$1` first.
#[derive(Debug, Clone)]
pub(super) struct Statement<'a> {
    sql: &'static str,
    args: Vec<Arg<'a>>,
}

impl<'a> Statement<'a> {
    pub(super) fn new(sql: &'static str) -> Self {
        Self {
            sql,
            args: Vec::new(),
        }
    }

    /// This statement with `value` as its next argument.
    pub(super) fn bind(mut self, value: impl Into<Arg<'a>>) -> Self {
        self.args.push(value.into());
        self
    }

    /// This statement with `values` as its next arguments.
    pub(super) fn bind_all(mut self, values: impl IntoIterator<Item = Arg<'a>>) -> Self {
        self.args.extend(values);
        self
    }

    fn sqlite(self) -> SqliteQuery {
        (self.args.into_iter()).fold(sqlx::query(self.sql), |q, arg| arg.bind_sqlite(q))
    }

    fn postgres(self) -> PgQuery {
        (self.args.into_iter()).fold(sqlx::query(self.sql), |q, arg| arg.bind_postgres(q))
    }
}

/// What a column may be read as, on both backends.
pub(super) trait Value:
    for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

impl<T> Value for T where
    T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

/// A row read, of either backend.
pub(super) enum Row {
    Sqlite(SqliteRow),
    Postgres(PgRow),
}

impl Row {
    /// The value of `column`.
    pub(super) fn get<T: Value>(&self, column: &str) -> Result<T, sqlx::Error> {
        match self {
            Row::Sqlite(row) => row.try_get(column),
            Row::Postgres(row) => row.try_get(column),
        }
    }

    /// The value of the first column (a scalar query's).
    pub(super) fn first<T: Value>(&self) -> Result<T, sqlx::Error> {
        match self {
            Row::Sqlite(row) => row.try_get(0),
            Row::Postgres(row) => row.try_get(0),
        }
    }
}

/// One connection of either backend, inside the transaction its backend holds (the
/// SQLite writer's batch, a PostgreSQL transaction) or leased for one statement.
pub(super) enum Conn<'c> {
    Sqlite(&'c mut SqliteConnection),
    Postgres(&'c mut PgConnection),
}

impl Conn<'_> {
    /// Runs `statement`; how many rows it changed.
    pub(super) async fn execute(&mut self, statement: Statement<'_>) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => statement.sqlite().execute(&mut **c).await?.rows_affected(),
            Conn::Postgres(c) => (statement.postgres().execute(&mut **c).await?).rows_affected(),
        })
    }

    /// The row `statement` finds, if any.
    pub(super) async fn fetch_optional(
        &mut self,
        statement: Statement<'_>,
    ) -> Result<Option<Row>, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                (statement.sqlite().fetch_optional(&mut **c).await?).map(Row::Sqlite)
            }
            Conn::Postgres(c) => {
                (statement.postgres().fetch_optional(&mut **c).await?).map(Row::Postgres)
            }
        })
    }

    /// The one row `statement` answers.
    pub(super) async fn fetch_one(&mut self, statement: Statement<'_>) -> Result<Row, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => Row::Sqlite(statement.sqlite().fetch_one(&mut **c).await?),
            Conn::Postgres(c) => Row::Postgres(statement.postgres().fetch_one(&mut **c).await?),
        })
    }

    /// Every row `statement` finds.
    pub(super) async fn fetch_all(
        &mut self,
        statement: Statement<'_>,
    ) -> Result<Vec<Row>, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                let rows = statement.sqlite().fetch_all(&mut **c).await?;
                rows.into_iter().map(Row::Sqlite).collect()
            }
            Conn::Postgres(c) => {
                let rows = statement.postgres().fetch_all(&mut **c).await?;
                rows.into_iter().map(Row::Postgres).collect()
            }
        })
    }

    /// The first column of each row `statement` finds (a scalar query's).
    pub(super) async fn fetch_column<T: Value>(
        &mut self,
        statement: Statement<'_>,
    ) -> Result<Vec<T>, sqlx::Error> {
        (self.fetch_all(statement).await?.iter())
            .map(Row::first)
            .collect()
    }
}

/// A backend's pool (SQLite's read-only connections, PostgreSQL's pool): each
/// statement runs on a connection leased for it, bounded by the pool's limit; the
/// connection goes back once the statement has an answer (`connection`).
#[derive(Clone, Copy)]
pub(super) enum Conns<'a> {
    Sqlite(&'a Connections<Sqlite>),
    Postgres(&'a Connections<Postgres>),
}

/// A leased connection of either backend.
enum Leased {
    Sqlite(Lease<Sqlite>),
    Postgres(Lease<Postgres>),
}

impl Leased {
    fn conn(&mut self) -> Conn<'_> {
        match self {
            Leased::Sqlite(lease) => Conn::Sqlite(lease),
            Leased::Postgres(lease) => Conn::Postgres(lease),
        }
    }

    fn finish(self) {
        match self {
            Leased::Sqlite(lease) => lease.finish(),
            Leased::Postgres(lease) => lease.finish(),
        }
    }
}

impl Conns<'_> {
    async fn lease(self) -> Result<(Leased, std::time::Duration), StoreError> {
        Ok(match self {
            Conns::Sqlite(c) => (Leased::Sqlite(c.lease().await?), c.limit()),
            Conns::Postgres(c) => (Leased::Postgres(c.lease().await?), c.limit()),
        })
    }

    /// Runs `statement`; how many rows it changed.
    pub(super) async fn execute(self, statement: Statement<'_>) -> Result<u64, StoreError> {
        let (mut lease, limit) = self.lease().await?;
        let changed = within(limit, lease.conn().execute(statement)).await?;
        lease.finish();
        Ok(changed?)
    }

    /// The row `statement` finds, if any.
    pub(super) async fn fetch_optional(
        self,
        statement: Statement<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let (mut lease, limit) = self.lease().await?;
        let row = within(limit, lease.conn().fetch_optional(statement)).await?;
        lease.finish();
        Ok(row?)
    }

    /// The one row `statement` answers.
    pub(super) async fn fetch_one(self, statement: Statement<'_>) -> Result<Row, StoreError> {
        let (mut lease, limit) = self.lease().await?;
        let row = within(limit, lease.conn().fetch_one(statement)).await?;
        lease.finish();
        Ok(row?)
    }

    /// Every row `statement` finds.
    pub(super) async fn fetch_all(self, statement: Statement<'_>) -> Result<Vec<Row>, StoreError> {
        let (mut lease, limit) = self.lease().await?;
        let rows = within(limit, lease.conn().fetch_all(statement)).await?;
        lease.finish();
        Ok(rows?)
    }
}
