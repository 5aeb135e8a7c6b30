-- Why generation stopped, in OpenAI's vocabulary: 'stop', 'length', 'tool_calls', or
-- 'content_filter' (a provider's safety system withheld the answer: OpenAI content_filter,
-- Anthropic refusal, Gemini SAFETY / PROHIBITED_CONTENT / ..., Bedrock content_filtered /
-- guardrail_intervened). NULL when the call or request ended without an end (error, cancel)
-- and on rows stored before this column existed.
ALTER TABLE usage_events ADD COLUMN finish_reason TEXT;
