//! `switchyard report`: reports read from the usage ledger (nothing is written to it besides
//! pending migrations, which opening a ledger applies).
//!
//! - `report daily [--date YYYY-MM-DD] [--format table|csv|json|html]`: one UTC day grouped by
//!   tenant, model and target, with the reconciliation of charge and upstream rows.
//! - `report import-usage --file export.csv [--date-from D] [--date-to D] [--format table|json]`:
//!   a provider's usage export compared with the ledger's upstream rows per day and model.
//!
//! The ledger is `--database-url`, else the config's `billing.database_url`, else SQLite at
//! `<data_dir>/ledger.db` (the default of `switchyard billing` and `switchyard up`).

use clap::{Args, Subcommand, ValueEnum};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use switchyard_billing::report::utc_day_bounds;
use switchyard_billing::{Ledger, daily_report, import_usage_diff, parse_usage_export};

/// `switchyard report …`.
#[derive(Args)]
pub(crate) struct ReportArgs {
    #[command(subcommand)]
    command: ReportCommand,
}

#[derive(Subcommand)]
enum ReportCommand {
    /// One UTC day: requests, tokens by billing type, cost, charge and margin (USD) per tenant,
    /// model and target, plus the discrepancies between charge and upstream rows.
    Daily(DailyArgs),
    /// Compare a provider usage export (CSV: date,model,input_tokens,output_tokens,cost_usd) with
    /// the ledger's upstream rows, per UTC day and upstream model (tokens and USD).
    ImportUsage(ImportArgs),
}

/// Which ledger to read.
#[derive(Args)]
struct LedgerArgs {
    /// sqlx database URL (default: the config's billing.database_url, else SQLite at
    /// <data_dir>/ledger.db).
    #[arg(long, env = "SWITCHYARD_DATABASE_URL")]
    database_url: Option<String>,
    /// YAML config file, for data_dir and billing.database_url (default: the built-in config).
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory whose `ledger.db` to read (overrides the config's `data_dir`, as for
    /// `switchyard up --data-dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DailyFormat {
    /// Aligned text for terminals.
    Table,
    /// One header row, one row per group (USD with 6 decimals).
    Csv,
    /// The whole report; USD as decimal strings with 12 decimals.
    Json,
    /// One self-contained page with inline SVG charts.
    Html,
}

#[derive(Clone, Copy, ValueEnum)]
enum ImportFormat {
    /// Aligned text for terminals.
    Table,
    /// The whole comparison; USD as decimal strings with 12 decimals.
    Json,
}

#[derive(Args)]
struct DailyArgs {
    /// The UTC day, YYYY-MM-DD (default: today, UTC).
    #[arg(long)]
    date: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = DailyFormat::Table)]
    format: DailyFormat,
    /// Write to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    ledger: LedgerArgs,
}

#[derive(Args)]
struct ImportArgs {
    /// The provider's usage export (CSV with a header row).
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// First UTC day compared, YYYY-MM-DD (default: the export's first date).
    #[arg(long)]
    date_from: Option<String>,
    /// Last UTC day compared, inclusive, YYYY-MM-DD (default: the export's last date).
    #[arg(long)]
    date_to: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ImportFormat::Table)]
    format: ImportFormat,
    /// Write to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    ledger: LedgerArgs,
}

/// Runs `switchyard report …`; the error is the message to print.
pub(crate) async fn run(args: ReportArgs) -> Result<(), String> {
    match args.command {
        ReportCommand::Daily(a) => {
            let date = a.date.clone().unwrap_or_else(today_utc);
            // Reject a bad date before touching the database.
            utc_day_bounds(&date).map_err(|e| e.to_string())?;
            let ledger = open_ledger(&a.ledger).await?;
            let report = daily_report(&ledger, &date).await;
            ledger.close().await;
            let report = report.map_err(|e| e.to_string())?;
            let text = match a.format {
                DailyFormat::Table => report.to_table(),
                DailyFormat::Csv => report.to_csv(),
                DailyFormat::Json => report.to_json().map_err(|e| e.to_string())? + "\n",
                DailyFormat::Html => report.to_html(),
            };
            emit(a.output.as_deref(), &text)
        }
        ReportCommand::ImportUsage(a) => {
            for date in [&a.date_from, &a.date_to].into_iter().flatten() {
                utc_day_bounds(date).map_err(|e| e.to_string())?;
            }
            let text = crate::read_text(&a.file)?;
            let export =
                parse_usage_export(&text).map_err(|e| format!("{}: {e}", a.file.display()))?;
            let ledger = open_ledger(&a.ledger).await?;
            let diff = import_usage_diff(
                &ledger,
                &export,
                a.date_from.as_deref(),
                a.date_to.as_deref(),
            )
            .await;
            ledger.close().await;
            let diff = diff.map_err(|e| e.to_string())?;
            let text = match a.format {
                ImportFormat::Table => diff.to_table(),
                ImportFormat::Json => diff.to_json().map_err(|e| e.to_string())? + "\n",
            };
            emit(a.output.as_deref(), &text)
        }
    }
}

/// The ledger URL (see the module docs); an existing SQLite file is required, so a mistyped path
/// is an error instead of a new empty ledger.
fn ledger_url(args: &LedgerArgs) -> Result<String, String> {
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => {
            let mut c = crate::config::load(args.config.as_deref()).map_err(|e| e.to_string())?;
            if let Some(d) = &args.data_dir {
                c.data_dir = d.display().to_string();
            }
            c.billing.database_url.clone().unwrap_or_else(|| {
                format!("sqlite://{}/ledger.db", c.data_dir.trim_end_matches('/'))
            })
        }
    };
    if let Some(path) = sqlite_file(&url)
        && !Path::new(path).is_file()
    {
        return Err(format!(
            "no ledger at {path} (start `switchyard up` or `switchyard billing` first, or pass \
             --database-url / --data-dir / --config)"
        ));
    }
    Ok(url)
}

/// The file a `sqlite:` URL names; `None` for other URLs and in-memory databases.
fn sqlite_file(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split_once('?').map_or(rest, |(p, _)| p);
    (!path.is_empty() && path != ":memory:" && !rest.contains("mode=memory")).then_some(path)
}

async fn open_ledger(args: &LedgerArgs) -> Result<Ledger, String> {
    let url = ledger_url(args)?;
    Ledger::connect(&url)
        .await
        .map_err(|e| format!("opening ledger: {e}"))
}

/// Writes `text` to `output`, or to standard output (a closed pipe is not an error).
fn emit(output: Option<&Path>, text: &str) -> Result<(), String> {
    match output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.to_string()),
                _ => Ok(()),
            }
        }
    }
}

/// Today's UTC date, `YYYY-MM-DD`.
fn today_utc() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sqlite_file_of_urls() {
        assert_eq!(
            sqlite_file("sqlite://data/ledger.db"),
            Some("data/ledger.db")
        );
        assert_eq!(
            sqlite_file("sqlite:///abs/l.db?mode=rwc"),
            Some("/abs/l.db")
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://u@h/db"), None);
    }

    #[test]
    fn missing_default_ledger_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let args = LedgerArgs {
            database_url: Some(format!("sqlite://{}/nope.db", dir.path().display())),
            config: None,
            data_dir: None,
        };
        assert!(ledger_url(&args).unwrap_err().contains("no ledger at"));
        assert!(!dir.path().join("nope.db").exists());
    }

    #[test]
    fn data_dir_names_the_ledger_of_that_dir() {
        let dir = tempfile::tempdir().unwrap();
        let args = LedgerArgs {
            database_url: None,
            config: None,
            data_dir: Some(dir.path().to_path_buf()),
        };
        let want = format!("{}/ledger.db", dir.path().display());
        assert!(
            ledger_url(&args)
                .unwrap_err()
                .contains(&format!("no ledger at {want}"))
        );
        std::fs::write(&want, b"").unwrap();
        assert_eq!(ledger_url(&args).unwrap(), format!("sqlite://{want}"));
    }
}
