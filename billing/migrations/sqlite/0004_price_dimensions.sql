-- Price dimensions (docs/pricing.md): 1-hour cache writes (a subset of cache_write_tokens), audio
-- input/output (subsets of prompt/completion tokens), the service tier that served the call
-- ('priority' | 'flex'; NULL = standard), and what had no price ('unpriced': comma-separated
-- components such as 'model', 'cache_write_1h', 'service_tier'; NULL = everything priced).
ALTER TABLE usage_events ADD COLUMN cache_write_1h_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_events ADD COLUMN audio_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_events ADD COLUMN audio_output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_events ADD COLUMN service_tier TEXT;
ALTER TABLE usage_events ADD COLUMN unpriced TEXT;
