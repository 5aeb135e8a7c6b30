//! The OpenAI front door: Chat Completions request parsing and response writing.

pub mod request;
pub mod response;
