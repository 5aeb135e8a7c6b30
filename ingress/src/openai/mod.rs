//! The OpenAI front door: Chat Completions request parsing and response writing, and the legacy
//! text completions door.

pub mod completions;
pub mod request;
pub mod response;
