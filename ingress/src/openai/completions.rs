//! The legacy OpenAI text completions door, `POST /v1/completions` (OpenAI API reference,
//! "Completions" → "Create completion"), mapped onto chat: `prompt` (a string, or an array of one
//! string) becomes one user message, and the answer is written as `text_completion` objects —
//! one JSON object, or SSE chunks with `choices[].text` ending in `data: [DONE]`.
//!
//! Translated: `model`, `prompt`, `max_tokens` (default 16, as the API), `temperature`,
//! `top_p`, `n` (1 to the chat door's maximum: one `choices[]` entry per choice, `index` 0..n-1,
//! each streamed choice ending with its own `finish_reason` chunk, as the legacy API), `stop`, `stream`, `stream_options.include_usage`, `seed`, the penalties,
//! `user`, `logit_bias` (OpenAI upstreams only). Accepted at their no-op values only (a 400
//! otherwise): `echo: false`, `best_of: 1`, `logprobs: null`/`0`, `suffix: null`/`""`.

use crate::AppState;
use crate::error::ApiError;
use crate::front_door::{self, FrontDoor, ReplyMeta, StreamEncode};
use crate::openai::request;
use crate::openai::response::{DONE, UsageOut};
use crate::route::{Aggregate, Inbound};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_schemas::{FinishReason, FrameBody, Usage, now_ms};

/// The handler.
pub async fn completions(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    front_door::serve(OpenAiCompletions, app, &ctx, &headers, &body).await
}

/// The legacy completions protocol.
#[derive(Debug, Clone, Copy)]
pub struct OpenAiCompletions;

/// Fields copied unchanged into the chat body.
const SAME: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "logit_bias",
];

/// The completions body as a Chat Completions body (see the module docs).
fn chat_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let mut obj = request::json_body(body)?;
    obj.retain(|_, v| !v.is_null());
    let prompt = match obj.remove("prompt") {
        Some(Value::String(p)) => p,
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_owned()
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "`prompt` must be a string or an array of one string: several prompts per request are not supported yet.",
                Some("prompt".into()),
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "`prompt` must be a string (token-id prompts are not supported).",
                Some("prompt".into()),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                "You must provide a prompt.",
                Some("prompt".into()),
            ));
        }
    };
    let no_op = |k: &str, v: &Value| match k {
        "echo" => v == &json!(false),
        "best_of" => v == &json!(1),
        "logprobs" => v == &json!(0),
        "suffix" => v == &json!(""),
        _ => false,
    };
    let mut chat = Map::new();
    for (k, v) in obj {
        if SAME.contains(&k.as_str()) {
            chat.insert(k, v);
        } else if no_op(&k, &v) {
        } else if ["echo", "best_of", "logprobs", "suffix"].contains(&k.as_str()) {
            return Err(ApiError::invalid(
                format!("`{k}` = {v} is not supported by Switchyard yet."),
                Some(k),
            ));
        } else {
            return Err(ApiError::invalid(
                format!("Unrecognized request argument supplied: {k}"),
                Some(k),
            ));
        }
    }
    chat.entry("max_tokens").or_insert(json!(16));
    chat.insert(
        "messages".into(),
        json!([{"role": "user", "content": prompt}]),
    );
    Ok(chat)
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

fn meta(m: &ReplyMeta) -> Meta {
    Meta {
        id: format!("cmpl-{}", m.request_id.simple()),
        created: now_ms() / 1000,
        model: m.model.clone(),
        include_usage: m.include_usage,
    }
}

impl Meta {
    fn object(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": choices})
    }

    fn object_with_usage(&self, choices: Value, usage: Usage) -> Result<Value, ApiError> {
        let mut v = self.object(choices);
        v["usage"] = UsageOut::json(usage)?;
        Ok(v)
    }

    fn chunk(&self, index: u32, text: &str, finish: Option<FinishReason>) -> Bytes {
        let choice = json!([{"text": text, "index": index, "logprobs": null,
            "finish_reason": finish.map(FinishReason::as_str)}]);
        sse(&self.object(choice))
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl FrontDoor for OpenAiCompletions {
    type Stream = CompletionStream;

    fn parse(&self, body: &[u8]) -> Result<Inbound, ApiError> {
        let chat = serde_json::to_vec(&Value::Object(chat_body(body)?))
            .map_err(|e| ApiError::encoding("the chat body", &e))?;
        let p = request::parse(&chat)?;
        Ok(p.into_inbound())
    }

    fn stream(&self, m: &ReplyMeta) -> CompletionStream {
        CompletionStream {
            meta: meta(m),
            usage: None,
            choice: 0,
            choices_ended: false,
        }
    }

    fn aggregate(&self, m: &ReplyMeta, agg: &Aggregate) -> Result<Value, ApiError> {
        // Choice 0 is the aggregate itself, choices 1.. its `more_choices` (`n > 1`).
        let choices: Vec<Value> = std::iter::once(agg)
            .chain(&agg.more_choices)
            .enumerate()
            .map(|(index, c)| {
                json!({"text": c.text, "index": index, "logprobs": null,
                    "finish_reason": c.finish.as_str()})
            })
            .collect();
        meta(m).object_with_usage(Value::Array(choices), agg.usage.unwrap_or_default())
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }
}

/// `text_completion` chunks of one streamed answer.
pub struct CompletionStream {
    meta: Meta,
    usage: Option<Usage>,
    /// The choice the next text belongs to (`choice` frames switch it; 0 unless `n > 1`).
    choice: u32,
    /// Choices ended with their own finish chunks (`choice_end` frames): `end` adds none.
    choices_ended: bool,
}

impl StreamEncode for CompletionStream {
    fn start(&mut self, _out: &mut VecDeque<Bytes>) {}

    fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>) {
        match frame {
            FrameBody::Text { text } => out.push_back(self.meta.chunk(self.choice, &text, None)),
            FrameBody::Usage { usage } => self.usage = Some(usage),
            FrameBody::Choice { index } => self.choice = index,
            FrameBody::ChoiceEnd {
                index,
                finish_reason,
            } => {
                self.choice = index;
                self.choices_ended = true;
                out.push_back(self.meta.chunk(index, "", Some(finish_reason)));
            }
            FrameBody::End { finish_reason } => {
                if !self.choices_ended {
                    out.push_back(self.meta.chunk(self.choice, "", Some(finish_reason)));
                }
                if self.meta.include_usage {
                    let usage = self.usage.unwrap_or_default();
                    out.push_back(match self.meta.object_with_usage(json!([]), usage) {
                        Ok(v) => sse(&v),
                        Err(e) => crate::openai::response::error_event(&e),
                    });
                }
                out.push_back(Bytes::from_static(DONE));
            }
            FrameBody::Error { error, .. } => {
                out.push_back(crate::openai::response::error_event(&error.into()));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn maps_onto_chat() {
        let c = chat_body(
            br#"{"model":"m","prompt":["Say this"],"echo":false,"stop":"\n","suffix":null}"#,
        )
        .unwrap();
        assert_eq!(
            Value::Object(c),
            json!({"model": "m", "stop": "\n", "max_tokens": 16,
                "messages": [{"role": "user", "content": "Say this"}]})
        );
        let e = chat_body(br#"{"model":"m","prompt":"x","echo":true}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
        let e = chat_body(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
