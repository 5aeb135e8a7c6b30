//! Multi-row inserts, shared by the ledger's tables (`usage_events`, `ledger_lines`) and the
//! audit log: [`insert_columns!`] declares a table's columns next to the values bound to them,
//! [`statement_sizes`] splits a run of rows into power-of-two statements, and [`StatementTexts`]
//! holds each size's statement text, built once per backend.

use crate::row::Backend;

/// A query on the ledger's [`AnyPool`](sqlx::AnyPool) with its binds.
pub(crate) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Declares the columns of a multi-row insert into `$table` once, each next to the value it
/// gets: `const $head` (`INSERT INTO $table (columns) VALUES `, for [`StatementTexts`]),
/// `const $count` (values per row) and `fn $bind`, which binds one row's values in column
/// order.
macro_rules! insert_columns {
    (
        $table:ident, $head:ident, $count:ident,
        fn $bind:ident<$lt:lifetime>($($arg:ident: $arg_ty:ty),* $(,)?) {
            $first:ident: $first_value:expr $(, $column:ident: $value:expr)* $(,)?
        }
    ) => {
        #[doc = concat!("Head of the multi-row `", stringify!($table), "` insert; [`",
            stringify!($count), "`] values per row follow.")]
        const $head: &str = concat!(
            "INSERT INTO ",
            stringify!($table),
            " (",
            stringify!($first),
            $(", ", stringify!($column),)*
            ") VALUES "
        );
        #[doc = concat!("Values bound per `", stringify!($table), "` row.")]
        const $count: usize = [stringify!($first) $(, stringify!($column))*].len();
        #[doc = concat!("Binds the values of one `", stringify!($table), "` row to `query`.")]
        fn $bind<$lt>(
            query: $crate::multi_row::AnyQuery<$lt>,
            $($arg: $arg_ty),*
        ) -> $crate::multi_row::AnyQuery<$lt> {
            query.bind($first_value) $(.bind($value))*
        }
    };
}
pub(crate) use insert_columns;

/// The statement sizes a run of `n` rows is split into: `max` (a power of two) while at least
/// that many are left, then the binary digits of the rest, largest first (e.g. 500 with max 256:
/// 256, 128, 64, 32, 16, 4). Only power-of-two sizes occur, so each connection prepares and
/// caches at most log2(`max`) + 1 statement texts per table instead of one per batch size.
pub(crate) fn statement_sizes(mut n: usize, max: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if n == 0 {
            return None;
        }
        let size = if n >= max {
            max
        } else {
            1 << (usize::BITS - 1 - n.leading_zeros())
        };
        n -= size;
        Some(size)
    })
}

/// `head` + `rows` groups of `columns` placeholders + `tail`. PostgreSQL gets numbered
/// placeholders (`$1, $2, …`); SQLite gets anonymous ones (`?`, bound in order), because naming a
/// SQLite parameter by number costs a scan of the statement's parameter list (sqlx looks each one
/// up), which made a 12,288-parameter statement take a second to bind.
pub(crate) fn multi_row_sql(
    backend: Backend,
    head: &str,
    columns: usize,
    rows: usize,
    tail: &str,
) -> String {
    use std::fmt::Write as _;
    let mut sql = String::with_capacity(head.len() + tail.len() + rows * columns * 8);
    sql.push_str(head);
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..columns {
            if c > 0 {
                sql.push_str(", ");
            }
            match backend {
                Backend::Postgres => {
                    let _ = write!(sql, "${}", r * columns + c + 1);
                }
                Backend::Sqlite => sql.push('?'),
            }
        }
        sql.push(')');
    }
    sql.push_str(tail);
    sql
}

/// The statement texts of one multi-row insert, built once (the largest is ~100 KB): `texts[i]`
/// is the statement for `2^i` rows, up to `max` rows (a power of two).
pub(crate) struct StatementTexts {
    backend: Backend,
    head: &'static str,
    columns: usize,
    tail: &'static str,
    texts: Vec<String>,
}

impl StatementTexts {
    pub(crate) fn build(
        backend: Backend,
        head: &'static str,
        columns: usize,
        max: usize,
        tail: &'static str,
    ) -> Self {
        let texts = (0..=max.trailing_zeros())
            .map(|i| multi_row_sql(backend, head, columns, 1 << i, tail))
            .collect();
        Self {
            backend,
            head,
            columns,
            tail,
            texts,
        }
    }

    /// The statement for `rows` rows: prebuilt for the sizes [`statement_sizes`] yields, built
    /// on the spot for any other.
    pub(crate) fn get(&self, rows: usize) -> std::borrow::Cow<'_, str> {
        match self.texts.get(rows.trailing_zeros() as usize) {
            Some(sql) if rows.is_power_of_two() => std::borrow::Cow::Borrowed(sql),
            _ => multi_row_sql(self.backend, self.head, self.columns, rows, self.tail).into(),
        }
    }
}

/// A value per [`Backend`], each built on first use (for the statement texts of a `static`).
pub(crate) struct PerBackend<T> {
    postgres: std::sync::OnceLock<T>,
    sqlite: std::sync::OnceLock<T>,
}

impl<T> PerBackend<T> {
    /// Nothing built yet.
    pub(crate) const fn new() -> Self {
        Self {
            postgres: std::sync::OnceLock::new(),
            sqlite: std::sync::OnceLock::new(),
        }
    }

    /// `backend`'s value, built by `init(backend)` the first time.
    pub(crate) fn get(&self, backend: Backend, init: impl FnOnce(Backend) -> T) -> &T {
        let cell = match backend {
            Backend::Postgres => &self.postgres,
            Backend::Sqlite => &self.sqlite,
        };
        cell.get_or_init(|| init(backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_sizes_are_powers_of_two() {
        let sizes = |n, max| statement_sizes(n, max).collect::<Vec<_>>();
        assert_eq!(sizes(500, 256), vec![256, 128, 64, 32, 16, 4]);
        assert_eq!(sizes(1000, 512), vec![512, 256, 128, 64, 32, 8]);
        assert_eq!(sizes(600, 256), vec![256, 256, 64, 16, 8]);
        assert_eq!(sizes(1, 256), vec![1]);
        assert!(sizes(0, 256).is_empty());
        let pg = Backend::Postgres;
        assert_eq!(
            multi_row_sql(pg, "I ", 2, 2, " T"),
            "I ($1, $2), ($3, $4) T"
        );
        assert_eq!(
            multi_row_sql(Backend::Sqlite, "I ", 2, 2, " T"),
            "I (?, ?), (?, ?) T"
        );
        let texts = StatementTexts::build(pg, "I ", 1, 4, "");
        assert_eq!(texts.texts.len(), 3);
        assert_eq!(texts.get(4), "I ($1), ($2), ($3), ($4)");
        assert_eq!(texts.get(3), "I ($1), ($2), ($3)");
        assert_eq!(texts.get(8), multi_row_sql(pg, "I ", 1, 8, ""));
    }
}
