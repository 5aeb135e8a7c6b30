-- Batch jobs (OpenAI Batch API, Anthropic Message Batches): the batch a request was an item of.
-- Its rows are priced at the catalog's batch rate and reported apart.
ALTER TABLE usage_events ADD COLUMN batch_id TEXT;
CREATE INDEX IF NOT EXISTS usage_events_batch ON usage_events (batch_id);
