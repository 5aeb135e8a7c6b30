-- Money: exact decimal strings (rust_decimal), USD. NULL cost = the model is not in the catalog.
-- usage_events.cost_usd is the cost price for 'upstream' rows and the charge for 'charge' rows.
ALTER TABLE usage_events ADD COLUMN cost_usd TEXT;

-- One line per billing type of a priced event (new_input, cached_input, cache_write, output, reasoning).
CREATE TABLE IF NOT EXISTS ledger_lines (
    request_id      TEXT   NOT NULL,
    kind            TEXT   NOT NULL,
    attempt         BIGINT NOT NULL,
    billing_type    TEXT   NOT NULL,
    tokens          BIGINT NOT NULL,
    unit_price_usd  TEXT   NOT NULL, -- per 1M tokens, after tier and batch discount
    amount_usd      TEXT   NOT NULL,
    PRIMARY KEY (request_id, kind, attempt, billing_type)
);
