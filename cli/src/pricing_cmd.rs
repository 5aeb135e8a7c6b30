//! `switchyard pricing`: the pricing catalog's admin actions (docs/pricing.md).
//!
//! - `pricing check [--config FILE]`: every configured target whose upstream model has no cost
//!   price, or lacks a component its provider bills (Anthropic: the 1-hour cache write), and every
//!   model without a sale price; prints `nothing missing …` and exits 0 when all are priced, else
//!   one line per gap and exits 1.
//! - `pricing import FILE [--out OUT] [--as-of DATE] [--base CATALOG] [--model ID]…`: reads a
//!   price list in LiteLLM's `model_prices_and_context_window.json` shape (offline) and writes a
//!   catalog YAML ([`switchyard_schemas::pricing_import`]).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use switchyard_schemas::config::{GatewayConfig, ProviderKind};
use switchyard_schemas::pricing::Catalog;
use switchyard_schemas::pricing_import::{import_litellm, to_yaml};

/// `switchyard pricing …`.
#[derive(Args)]
pub(crate) struct PricingArgs {
    #[command(subcommand)]
    command: PricingCommand,
}

#[derive(Subcommand)]
enum PricingCommand {
    /// List configured targets whose upstream model lacks a price or a priced component, and
    /// models without a sale price (exit 1 when any).
    Check {
        /// YAML config file (default: the built-in demo config).
        #[arg(long, env = "SWITCHYARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Convert a LiteLLM `model_prices_and_context_window.json` into a catalog YAML.
    Import {
        /// The LiteLLM JSON file.
        file: PathBuf,
        /// Where to write the catalog (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The snapshot date recorded as `as_of` (ISO 8601, default: today, UTC).
        #[arg(long)]
        as_of: Option<String>,
        /// A catalog to merge into: its `standard:` sale prices and its `upstream:` entries the
        /// import does not carry are kept; imported entries replace same-named ones.
        #[arg(long)]
        base: Option<PathBuf>,
        /// Import only these upstream model ids (repeatable; default: every chat model).
        #[arg(long = "model")]
        models: Vec<String>,
    },
}

/// One gap [`missing`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gap {
    /// `target <id> (upstream model <m>)` or `model <id>`.
    pub subject: String,
    /// What is missing, e.g. `no cost price` or `no cache_write_1h price`.
    pub what: String,
}

/// The gaps of `config`'s targets and models in `catalog`, targets first, in config order.
pub(crate) fn missing(config: &GatewayConfig, catalog: &Catalog) -> Vec<Gap> {
    let mut gaps = Vec::new();
    for t in &config.targets {
        let subject = format!("target {} (upstream model {})", t.id, t.upstream_model);
        let Some(card) = catalog.upstream.get(&t.upstream_model) else {
            gaps.push(Gap {
                subject,
                what: "no cost price".into(),
            });
            continue;
        };
        // Anthropic bills 1-hour cache writes apart (Anthropic docs, "Prompt caching").
        let bills_1h = matches!(t.provider, ProviderKind::Anthropic);
        if bills_1h && card.cache_write_1h.is_none() {
            gaps.push(Gap {
                subject,
                what: "no cache_write_1h price (1-hour cache writes)".into(),
            });
        }
    }
    for m in &config.models {
        if !catalog.sale_priced(&m.id, config.unpriced.as_ref()) {
            gaps.push(Gap {
                subject: format!("model {}", m.id),
                what: "no sale price (standard:)".into(),
            });
        }
    }
    gaps
}

/// Runs `switchyard pricing …`.
pub(crate) fn run(args: PricingArgs) -> Result<(), String> {
    match args.command {
        PricingCommand::Check { config } => {
            let c = switchyard::config::load(config.as_deref()).map_err(|e| e.to_string())?;
            let catalog = Catalog::load(c.pricing_file.as_deref()).map_err(|e| e.to_string())?;
            let gaps = missing(&c, &catalog);
            if gaps.is_empty() {
                println!(
                    "nothing missing: {} targets and {} models priced (catalog {}, as of {})",
                    c.targets.len(),
                    c.models.len(),
                    c.pricing_file.as_deref().unwrap_or("<bundled>"),
                    catalog.as_of.as_deref().unwrap_or("-")
                );
                return Ok(());
            }
            for g in &gaps {
                println!("{}: {}", g.subject, g.what);
            }
            Err(format!("{} price(s) missing", gaps.len()))
        }
        PricingCommand::Import {
            file,
            out,
            as_of,
            base,
            models,
        } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("reading {}: {e}", file.display()))?;
            let as_of = as_of.unwrap_or_else(today);
            let imported = import_litellm(&text, Some(&as_of)).map_err(|e| e.to_string())?;
            let mut catalog = match &base {
                Some(b) => {
                    Catalog::load(Some(&b.display().to_string())).map_err(|e| e.to_string())?
                }
                None => Catalog::empty(),
            };
            catalog.as_of = Some(as_of.clone());
            let mut taken = 0;
            for (model, card) in imported.catalog.upstream {
                if models.is_empty() || models.contains(&model) {
                    catalog.upstream.insert(model, card);
                    taken += 1;
                }
            }
            let header = format!(
                "Switchyard pricing catalog imported from {} (LiteLLM shape) on {as_of}.\n\
                 Prices are USD per 1,000,000 tokens; see docs/pricing.md.",
                file.display()
            );
            let yaml = to_yaml(&catalog, &header);
            // What was written must load as a catalog.
            Catalog::parse("<import>", &yaml).map_err(|e| e.to_string())?;
            match out {
                Some(p) => {
                    std::fs::write(&p, yaml).map_err(|e| format!("writing {}: {e}", p.display()))?
                }
                None => print!("{yaml}"),
            }
            eprintln!(
                "imported {taken} model(s), skipped {} entr(y/ies) that are not chat models with token prices",
                imported.skipped
            );
            Ok(())
        }
    }
}

/// Today's UTC date, `YYYY-MM-DD` (the report's formatter).
fn today() -> String {
    switchyard_billing::report::utc_date(switchyard_schemas::now_ms())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn default_config_has_nothing_missing() {
        let c = switchyard::config::load(None).unwrap();
        assert_eq!(missing(&c, &Catalog::bundled().unwrap()), vec![]);
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(t.starts_with("20"), "{t}");
    }
}
