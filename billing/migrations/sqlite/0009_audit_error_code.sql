-- The error code a request refused before admission got (docs/audit.md, "Refused requests"):
-- OpenAI `error.code` (model_not_found, …) or else `error.type` (authentication_error, …).
ALTER TABLE audit_log ADD COLUMN error_code TEXT;
