//! Provider adapters, one file per provider family.
pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod classify;
pub mod gemini;
pub mod openai;
pub mod openai_responses;
pub(crate) mod shared;
#[cfg(test)]
pub(crate) mod test_support;
