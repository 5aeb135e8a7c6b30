//! The budget store's side of a rebuild from the ledger (the ledger side is
//! `switchyard_billing::budget_rebuild`).
//!
//! A lost `SY_BUDGETS` bucket comes back empty, and ingress may create entries in it (settling
//! live requests from zero) before billing has rebuilt it. So a rebuild does not skip an entry
//! that exists: it adds the ledger's spend from before the bucket was created to every entry not
//! yet [`Spend::from_ledger`], once (the flag is set in the same compare-and-set write). Charges
//! after the bucket's creation were settled into it live and are not added again. A request in
//! flight across the loss whose charge row is dated before the bucket's creation but settled
//! into the new entry counts twice: over-counted, never under (refused earlier, never
//! overspent). The bucket records the creation time it was rebuilt for under [`REBUILT_KEY`],
//! so billing's start-up knows whether this bucket still needs it.

use crate::spend::Spend;
use crate::store::{BudgetStore, Unavailable};
use serde::{Deserialize, Serialize};
use switchyard_kv::{Stored, load};
use switchyard_schemas::now_ms;

/// The entry recording which bucket (by creation time) was rebuilt from the ledger.
pub const REBUILT_KEY: &str = "_rebuilt";

/// What a seed did to one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seeded {
    /// The entry was absent (or overwritten): written with the ledger's spend.
    Written,
    /// The entry existed without the ledger's earlier spend: added to it.
    Merged,
    /// The entry already had it: unchanged.
    Kept,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rebuilt {
    bucket_created_ms: u64,
}

impl BudgetStore {
    /// When the bucket (its stream) was created, ms since the epoch: the ledger's charges before
    /// it are not in any entry an ingress created.
    pub async fn created_ms(&self) -> Result<u64, Unavailable> {
        let status = self
            .kv()?
            .status()
            .await
            .map_err(|e| Unavailable(e.to_string()))?;
        let ns = status.info.created.unix_timestamp_nanos();
        Ok(u64::try_from(ns / 1_000_000).unwrap_or(0))
    }

    /// The bucket creation time the last completed rebuild was for (`None`: never rebuilt).
    pub async fn rebuilt_for(&self) -> Result<Option<u64>, Unavailable> {
        match load::<Rebuilt>(self.kv()?, REBUILT_KEY).await {
            Ok((_, Stored::Value(r))) => Ok(Some(r.bucket_created_ms)),
            Ok(_) => Ok(None),
            Err(e) => Err(Unavailable::from(&e)),
        }
    }

    /// Records that the bucket created at `bucket_created_ms` was rebuilt from the ledger.
    pub async fn mark_rebuilt(&self, bucket_created_ms: u64) -> Result<(), Unavailable> {
        let json = serde_json::to_vec(&Rebuilt { bucket_created_ms })
            .map_err(|e| Unavailable(e.to_string()))?;
        self.kv()?
            .put(REBUILT_KEY, json.into())
            .await
            .map_err(|e| Unavailable(e.to_string()))?;
        Ok(())
    }

    /// Seeds entry `key` (`key.<id>`, `tenant.<id>`, `balance.<tenant>`) from the ledger:
    /// `all` (every charge of the current windows) where the entry is absent; `earlier` (the
    /// charges dated before the bucket's creation) added to an entry an ingress created; an
    /// entry already seeded, or any existing entry without `merge`, is kept. `overwrite` writes
    /// `all` whatever is there (dropping the open reservations: run it with ingress stopped).
    pub async fn seed(
        &self,
        key: &str,
        all: &Spend,
        earlier: &Spend,
        overwrite: bool,
        merge: bool,
    ) -> Result<Seeded, Unavailable> {
        let now = now_ms();
        let mut seeded = Seeded::Kept;
        self.update(key, |stored| {
            seeded = Seeded::Kept;
            let (new, how) = match stored {
                Some(s) if !overwrite && (s.from_ledger || !merge) => return Ok(None),
                Some(s) if !overwrite => {
                    let mut s = s.at(now);
                    s.absorb(&earlier.clone().at(now));
                    (s, Seeded::Merged)
                }
                _ => (all.clone().at(now), Seeded::Written),
            };
            seeded = how;
            Ok(Some(Spend {
                from_ledger: true,
                ..new
            }))
        })
        .await?;
        Ok(seeded)
    }
}
