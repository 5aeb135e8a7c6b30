//! The billing service's error type.

use async_nats::jetstream::{
    consumer::StreamError, context::CreateStreamError, stream::ConsumerError,
};

/// Everything that can go wrong in billing: database, migrations, JetStream setup, bad events.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    /// The ledger URL is neither `sqlite:` nor `postgres://` / `postgresql://`.
    #[error("unsupported ledger url `{0}`: expected sqlite://<path> or postgres://...")]
    UnsupportedUrl(String),
    /// Creating the SQLite file's parent directory failed.
    #[error("creating ledger directory: {0}")]
    Io(#[from] std::io::Error),
    /// A database query or connection failed.
    #[error("ledger database: {0}")]
    Db(#[from] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[error("ledger migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A usage event cannot be stored as-is (a count beyond `i64::MAX`, a NUL in a string).
    #[error("usage event {request_id}/{kind}/{attempt} not storable: {reason}")]
    InvalidEvent {
        /// The event's request id.
        request_id: uuid::Uuid,
        /// The event's kind (`upstream` / `charge`).
        kind: &'static str,
        /// The event's attempt number.
        attempt: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// A ledger row does not map back to a [`switchyard_schemas::UsageEvent`].
    #[error("corrupt ledger row: {0}")]
    CorruptRow(String),
    /// Creating or looking up the usage stream failed.
    #[error("usage stream: {0}")]
    Stream(#[from] CreateStreamError),
    /// Creating or looking up the durable billing consumer failed.
    #[error("billing consumer: {0}")]
    Consumer(#[from] ConsumerError),
    /// Starting the pull message stream of the billing consumer failed.
    #[error("billing consumer messages: {0}")]
    Messages(#[from] StreamError),
    /// Migrating the legacy usage stream (`SY_USAGE`, limits retention) failed.
    #[error("usage stream migration: {0}")]
    Migration(String),
    /// The budget store (`SY_BUDGETS`) could not be read or written.
    #[error("budget store: {0}")]
    Budgets(String),
    /// Subscribing the usage query subject failed.
    #[error("usage query subscription: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}
