-- One row per usage event, keyed like the event itself: (request_id, kind, attempt).
-- Inserts use ON CONFLICT DO NOTHING, so redelivery and stream replay never double count.
-- Token counts and times are BIGINT (signed 64-bit); booleans are INTEGER 0/1.
CREATE TABLE IF NOT EXISTS usage_events (
    request_id          TEXT    NOT NULL, -- UUIDv7, lowercase hyphenated
    kind                TEXT    NOT NULL, -- 'upstream' | 'charge'
    attempt             BIGINT  NOT NULL, -- upstream call number; 0 for 'charge'
    ts_ms               BIGINT  NOT NULL, -- event time, ms since the Unix epoch
    tenant              TEXT,
    key_id              TEXT,
    model               TEXT    NOT NULL,
    target              TEXT,
    upstream_model      TEXT,
    prompt_tokens       BIGINT  NOT NULL,
    cached_tokens       BIGINT  NOT NULL,
    cache_write_tokens  BIGINT  NOT NULL,
    completion_tokens   BIGINT  NOT NULL,
    reasoning_tokens    BIGINT  NOT NULL,
    estimated           INTEGER NOT NULL, -- 0 | 1
    status              TEXT    NOT NULL, -- 'ok' | 'error' | 'cancelled'
    error_class         TEXT,             -- snake_case ErrorClass when status = 'error'
    ttft_ms             BIGINT,
    latency_ms          BIGINT  NOT NULL,
    fallbacks           BIGINT  NOT NULL,
    cache_hit           INTEGER NOT NULL, -- 0 | 1
    raw                 TEXT    NOT NULL, -- the event's original JSON
    ingested_at_ms      BIGINT  NOT NULL, -- when billing stored the row, ms since the Unix epoch
    PRIMARY KEY (request_id, kind, attempt)
);

CREATE INDEX IF NOT EXISTS usage_events_ts ON usage_events (ts_ms);
CREATE INDEX IF NOT EXISTS usage_events_tenant_ts ON usage_events (tenant, ts_ms);
