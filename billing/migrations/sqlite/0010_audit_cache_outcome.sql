-- The answer cache's outcome of a request (docs/audit.md, "Cache outcome"): hit, semantic-hit,
-- miss, bypass or off; NULL for rows written before it and requests that never reached the cache.
ALTER TABLE audit_log ADD COLUMN cache_outcome TEXT;
