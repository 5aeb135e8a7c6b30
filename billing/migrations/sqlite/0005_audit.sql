-- The audit log (docs/audit.md): one row per request, written from the request's 'charge' event
-- in the same transaction as its usage_events row (ON CONFLICT DO NOTHING: redelivery adds none).
-- Rows older than audit.retention_days are deleted by billing in batches of 1,000
-- (this table only; the usage tables are never touched).
CREATE TABLE IF NOT EXISTS audit_log (
    request_id          TEXT    NOT NULL PRIMARY KEY, -- UUIDv7, lowercase hyphenated
    ts_ms               BIGINT  NOT NULL, -- the charge event's time (request end), ms since the Unix epoch
    front_door          TEXT,             -- openai | anthropic | responses | embeddings | batch
    key_id              TEXT,
    tenant              TEXT,
    model               TEXT    NOT NULL,
    target              TEXT,
    upstream_model      TEXT,
    status              TEXT    NOT NULL, -- 'ok' | 'error' | 'cancelled'
    http_status         BIGINT,
    error_class         TEXT,
    finish_reason       TEXT,
    fallbacks           BIGINT  NOT NULL,
    attempts            TEXT    NOT NULL, -- JSON array of failed attempts
    prompt_tokens       BIGINT  NOT NULL,
    completion_tokens   BIGINT  NOT NULL,
    cached_tokens       BIGINT  NOT NULL,
    charge_usd          TEXT,             -- exact decimal, USD; NULL = unpriced
    ttft_ms             BIGINT,
    latency_ms          BIGINT  NOT NULL,
    overhead_ms         BIGINT,
    cache_hit           INTEGER NOT NULL, -- 0 | 1
    client_ip           TEXT,
    user_agent          TEXT,
    client_request_id   TEXT,             -- the client's own x-request-id, when well-formed
    request_body        TEXT,             -- captured, redacted, size-capped; NULL = not captured
    response_body       TEXT
);

CREATE INDEX IF NOT EXISTS audit_log_ts ON audit_log (ts_ms, request_id);
CREATE INDEX IF NOT EXISTS audit_log_key_ts ON audit_log (key_id, ts_ms);
CREATE INDEX IF NOT EXISTS audit_log_tenant_ts ON audit_log (tenant, ts_ms);
CREATE INDEX IF NOT EXISTS audit_log_model_ts ON audit_log (model, ts_ms);
