//! `switchyard pricing`: the pricing catalog's admin actions (docs/pricing.md).
//!
//! - `pricing check [--config FILE]`: every configured target whose upstream model has no cost
//!   price, or lacks a component its provider bills (Anthropic: the 1-hour cache write; OpenAI
//!   audio models: audio tokens), and every model without a sale price or whose sale price lacks
//!   such a component; prints `nothing missing …` and exits 0 when all are priced, else
//!   one line per gap and exits 1.
//! - `pricing import FILE [--out OUT] [--as-of DATE] [--base CATALOG] [--model ID]…`: reads a
//!   price list in LiteLLM's `model_prices_and_context_window.json` shape (offline) and writes a
//!   catalog YAML ([`switchyard_schemas::pricing_import`]).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use switchyard_schemas::config::{GatewayConfig, ProviderKind};
use switchyard_schemas::pricing::{Catalog, PriceCard};
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

/// The optional price components a target's usage can carry, with why: Anthropic bills 1-hour
/// cache writes apart (Anthropic docs, "Prompt caching"); OpenAI's audio models bill audio tokens
/// apart (OpenAI pricing page, "Audio tokens"). A card without one of them leaves that part of a
/// request unpriced (`unpriced_component`).
fn components(provider: &ProviderKind, upstream_model: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    if matches!(provider, ProviderKind::Anthropic) {
        out.push(("cache_write_1h", "1-hour cache writes"));
    }
    let m = upstream_model.to_ascii_lowercase();
    if matches!(provider, ProviderKind::Openai | ProviderKind::AzureOpenai)
        && (m.contains("audio") || m.contains("realtime"))
    {
        out.push(("audio_input", "audio input tokens"));
        out.push(("audio_output", "audio output tokens"));
    }
    out
}

/// Whether `card` prices `component` (one of [`components`]).
fn prices(card: &PriceCard, component: &str) -> bool {
    match component {
        "cache_write_1h" => card.cache_write_1h.is_some(),
        "audio_input" => card.audio_input.is_some(),
        "audio_output" => card.audio_output.is_some(),
        _ => true,
    }
}

/// The gaps of `config`'s targets and models in `catalog`, targets first, in config order: a
/// target's upstream model without a cost card or without a component its provider bills; a
/// model without a sale card (or `charge_at` fallback), or whose sale card lacks a component one
/// of its targets bills.
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
        for (component, what) in components(&t.provider, &t.upstream_model) {
            if !prices(card, component) {
                gaps.push(Gap {
                    subject: subject.clone(),
                    what: format!("no {component} price ({what})"),
                });
            }
        }
    }
    for m in &config.models {
        let subject = format!("model {}", m.id);
        if !catalog.sale_priced(&m.id, config.unpriced.as_ref()) {
            gaps.push(Gap {
                subject,
                what: "no sale price (standard:)".into(),
            });
            continue;
        }
        let Some(card) = catalog.standard.get(&m.id) else {
            continue; // Charged at the `charge_at` fallback model's card.
        };
        let mut seen = Vec::new();
        for t in config.targets.iter().filter(|t| m.targets.contains(&t.id)) {
            for (component, what) in components(&t.provider, &t.upstream_model) {
                if !prices(card, component) && !seen.contains(&component) {
                    seen.push(component);
                    gaps.push(Gap {
                        subject: subject.clone(),
                        what: format!(
                            "no {component} sale price ({what}, billed by target {})",
                            t.id
                        ),
                    });
                }
            }
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
            let text = crate::read_text(&file)?;
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
    fn components_a_provider_bills_are_checked_on_cost_and_sale_cards() {
        let config: GatewayConfig = serde_yaml_ng::from_str(
            "targets:\n\
             - {id: claude, provider: anthropic, base_url: 'builtin:mock', upstream_model: claude-t}\n\
             - {id: voice, provider: openai, base_url: 'builtin:mock', upstream_model: gpt-4o-audio-t}\n\
             - {id: text, provider: openai, base_url: 'builtin:mock', upstream_model: gpt-t}\n\
             models:\n\
             - {id: m/claude, targets: [claude]}\n\
             - {id: m/voice, targets: [voice, text]}\n",
        )
        .unwrap();
        let catalog = Catalog::parse(
            "test",
            "currency: USD\n\
             upstream:\n\
             \x20 claude-t: {input: 3, output: 15}\n\
             \x20 gpt-4o-audio-t: {input: 2.5, output: 10, audio_input: 40}\n\
             \x20 gpt-t: {input: 2, output: 8}\n\
             standard:\n\
             \x20 m/claude: {input: 3, output: 15, cache_write_1h: 6}\n\
             \x20 m/voice: {input: 2.5, output: 10}\n",
        )
        .unwrap();
        let lines: Vec<_> = missing(&config, &catalog)
            .into_iter()
            .map(|g| format!("{}: {}", g.subject, g.what))
            .collect();
        assert_eq!(
            lines,
            [
                "target claude (upstream model claude-t): no cache_write_1h price (1-hour cache writes)",
                "target voice (upstream model gpt-4o-audio-t): no audio_output price (audio output tokens)",
                "model m/voice: no audio_input sale price (audio input tokens, billed by target voice)",
                "model m/voice: no audio_output sale price (audio output tokens, billed by target voice)",
            ]
        );
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(t.starts_with("20"), "{t}");
    }
}
