-- Prepaid tenant balances (docs/budgets.md, "Prepaid balances"): one row per top-up, keyed by the
-- top-up id (client-supplied or generated), so a repeated top-up request adds nothing. The
-- deductions are the tenant's 'charge' rows in usage_events from its first top-up on.
CREATE TABLE IF NOT EXISTS balance_topups (
    id          TEXT    NOT NULL PRIMARY KEY,
    tenant      TEXT    NOT NULL,
    amount_usd  TEXT    NOT NULL, -- exact decimal, USD, > 0
    note        TEXT,
    ts_ms       BIGINT  NOT NULL  -- when recorded, ms since the Unix epoch
);

CREATE INDEX IF NOT EXISTS balance_topups_tenant_ts ON balance_topups (tenant, ts_ms);
