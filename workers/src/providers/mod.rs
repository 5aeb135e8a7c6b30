//! Provider adapters, one file per provider family.
pub mod anthropic;
pub mod openai;
