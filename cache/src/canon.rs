//! Canonical form of a request: what the exact key hashes, what scopes the semantic layer, and
//! which text is embedded.
//!
//! The canonical request is JSON with object keys sorted at every depth and message text trimmed;
//! it holds everything that changes the answer: the route (model), every message (roles, text,
//! image references, names, tool calls, tool call ids), tools, `tool_choice` and every sampling and
//! output-shaping parameter (`temperature`, `top_p`, `max_tokens`, `stop`, `n`, `seed`,
//! `presence_penalty`, `frequency_penalty`, `response_format`, `parallel_tool_calls`). Left out:
//! `stream` and `stream_options` (the same answer is replayed either way) and `user` (an abuse
//! tracking id that does not change the answer).
//!
//! * **exact key** = SHA-256 of the canonical request;
//! * **scope** = SHA-256 of the canonical request with the text of the final user message replaced
//!   by a placeholder: two requests are semantic candidates only when everything but that text is
//!   identical (system prompt, the whole earlier conversation, tools, parameters);
//! * **query** = the final user message's text, the only thing the semantic layer compares.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchyard_schemas::cache::CacheKey;
use switchyard_schemas::request::{Content, ContentPart, Message, Role};

/// The keys of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// Hex SHA-256 of the canonical request: the entry key.
    pub exact: String,
    /// Hex SHA-256 of the canonical request without the final user text.
    pub scope: String,
    /// The final user message's text, when the request ends with a text-only user message.
    pub query: Option<String>,
    /// User messages in the conversation.
    pub user_turns: usize,
}

/// `v` serialized with the keys of every object in sorted order, without copying it.
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, &Sorted(v))?;
                }
                map.end()
            }
            Value::Array(a) => s.collect_seq(a.iter().map(Sorted)),
            other => other.serialize(s),
        }
    }
}

/// Feeds serialized bytes to SHA-256 (no intermediate string).
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Text-only content as one trimmed string; otherwise the parts (text trimmed).
fn content_value(c: &Content) -> Result<Value, serde_json::Error> {
    Ok(match c {
        Content::Text(t) => Value::String(t.trim().to_owned()),
        Content::Parts(parts) => {
            if parts.iter().all(|p| matches!(p, ContentPart::Text { .. })) {
                Value::String(c.text().trim().to_owned())
            } else {
                serde_json::to_value(parts)?
            }
        }
    })
}

fn message_value(m: &Message, content: Value) -> Result<Value, serde_json::Error> {
    let mut v = json!({"role": m.role, "content": content});
    if let Some(n) = &m.name {
        v["name"] = json!(n);
    }
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = serde_json::to_value(&m.tool_calls)?;
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    Ok(v)
}

/// Hex SHA-256 of `v` as compact JSON with sorted keys (what earlier versions hashed through a
/// sorted copy and a string, so stored keys stay valid).
fn hash(v: &Value) -> Result<String, serde_json::Error> {
    let mut h = Hashing(Sha256::new());
    serde_json::to_writer(&mut h, &Sorted(v))?;
    Ok(hex::encode(h.0.finalize()))
}

/// The final user message's text, when the conversation ends with a text-only user message.
fn final_query(messages: &[Message]) -> Option<String> {
    let last = messages.last()?;
    if last.role != Role::User {
        return None;
    }
    // An encoding failure here also fails the exact key (same content), so `None` hides nothing.
    match content_value(last.content.as_ref()?).ok()? {
        Value::String(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// Computes the keys of `key`. Fails when a part cannot be encoded as JSON: a part left out
/// (`null`, empty) could make two different requests share a key.
pub fn canonical(key: &CacheKey) -> Result<Canonical, serde_json::Error> {
    let query = final_query(&key.messages);
    let (exact, scope) = hashes(key, Some(query.is_some()))?;
    Ok(Canonical {
        exact,
        scope: scope.unwrap_or_default(),
        query,
        user_turns: key.messages.iter().filter(|m| m.role == Role::User).count(),
    })
}

/// [`Canonical::exact`] alone (one hash instead of two): what ingress's key set checks.
pub fn exact_key(key: &CacheKey) -> Result<String, serde_json::Error> {
    hashes(key, None).map(|(exact, _)| exact)
}

/// The exact key, and the scope key when `scope` says whether to blank the final user text.
fn hashes(
    key: &CacheKey,
    scope: Option<bool>,
) -> Result<(String, Option<String>), serde_json::Error> {
    let mut params = serde_json::to_value(&key.params)?;
    if let Value::Object(m) = &mut params {
        m.remove("user");
    }
    let n = key.messages.len();
    let messages = |blank_last: bool| -> Result<Vec<Value>, serde_json::Error> {
        key.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let content = if blank_last && i + 1 == n {
                    json!({"$query": true})
                } else {
                    m.content
                        .as_ref()
                        .map(content_value)
                        .transpose()?
                        .unwrap_or(Value::Null)
                };
                message_value(m, content)
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let doc = |msgs: Vec<Value>| {
        let mut d = json!({
            "v": 1,
            "route": key.route,
            "messages": msgs,
            "tools": key.tools,
            "tool_choice": key.tool_choice,
            "params": params,
        });
        // Only when set, so anonymous (auth off) keys hash as before.
        if let (Some(t), Some(o)) = (&key.tenant, d.as_object_mut()) {
            o.insert("tenant".into(), json!(t));
        }
        d
    };
    let exact = hash(&doc(messages(false)?))?;
    let scope = match scope {
        Some(blank_last) => Some(hash(&doc(messages(blank_last)?))?),
        None => None,
    };
    Ok((exact, scope))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(v: serde_json::Value) -> CacheKey {
        serde_json::from_value(v).unwrap()
    }

    fn canonical(key: &CacheKey) -> Canonical {
        super::canonical(key).unwrap()
    }

    /// How keys were hashed before: a sorted copy, then a string.
    fn hash_of_sorted_copy(v: &Value) -> String {
        fn sorted(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let mut keys: Vec<&String> = m.keys().collect();
                    keys.sort();
                    Value::Object(
                        keys.into_iter()
                            .map(|k| (k.clone(), sorted(&m[k])))
                            .collect(),
                    )
                }
                Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
                other => other.clone(),
            }
        }
        hex::encode(Sha256::digest(serde_json::to_string(&sorted(v)).unwrap()))
    }

    #[test]
    fn keys_hash_as_they_did_through_a_sorted_copy() {
        let v =
            json!({"z": [{"b": 1, "a": "\u{e9}\"x"}, null], "a": {"y": 2.5, "x": true}, "m": []});
        assert_eq!(hash(&v).unwrap(), hash_of_sorted_copy(&v));
        assert_eq!(
            hash(&json!({"b": 1, "a": 2})).unwrap(),
            "d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772"
        );
    }

    fn base() -> serde_json::Value {
        json!({"route": "a", "messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "How do I reset my password?"}],
            "params": {"temperature": 0.0, "max_tokens": 16}})
    }

    #[test]
    fn equal_requests_equal_keys_and_whitespace_and_parts_do_not_matter() {
        let a = canonical(&key(base()));
        let mut v = base();
        v["messages"][1]["content"] =
            json!([{"type": "text", "text": "  How do I reset my password?\n"}]);
        v["params"]["user"] = json!("u-1");
        let b = canonical(&key(v));
        assert_eq!(a, b);
        assert_eq!(a.query.as_deref(), Some("How do I reset my password?"));
        assert_eq!(a.user_turns, 1);
        assert_eq!(a.exact.len(), 64);
        assert_eq!(super::exact_key(&key(base())).unwrap(), a.exact);
    }

    #[test]
    #[allow(clippy::type_complexity)]
    fn everything_that_changes_the_answer_changes_the_keys() {
        let a = canonical(&key(base()));
        let edits: Vec<Box<dyn Fn(&mut serde_json::Value)>> = vec![
            Box::new(|v| v["route"] = json!("b")),
            Box::new(|v| v["params"]["max_tokens"] = json!(400)),
            Box::new(|v| v["params"]["temperature"] = json!(0.5)),
            Box::new(|v| v["params"]["seed"] = json!(7)),
            Box::new(|v| v["params"]["stop"] = json!(["END"])),
            Box::new(|v| v["params"]["response_format"] = json!({"type": "json_object"})),
            Box::new(|v| v["messages"][0]["content"] = json!("Be verbose.")),
            Box::new(|v| v["tools"] = json!([{"type": "function", "function": {"name": "f"}}])),
            Box::new(|v| v["tool_choice"] = json!("none")),
            Box::new(|v| v["tenant"] = json!("acme")),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut v = base();
            edit(&mut v);
            let b = canonical(&key(v));
            assert_ne!(a.exact, b.exact, "edit {i}");
            assert_ne!(a.scope, b.scope, "edit {i}");
        }
        // Only the final user text differs: same scope, different exact key.
        let mut v = base();
        v["messages"][1]["content"] = json!("How can I reset my password?");
        let b = canonical(&key(v));
        assert_ne!(a.exact, b.exact);
        assert_eq!(a.scope, b.scope);
    }

    #[test]
    fn history_is_part_of_the_scope() {
        let mut v = base();
        let msgs = v["messages"].as_array_mut().unwrap();
        msgs.insert(1, json!({"role": "user", "content": "I use Gmail."}));
        msgs.insert(2, json!({"role": "assistant", "content": "OK."}));
        let a = canonical(&key(v.clone()));
        v["messages"][1]["content"] = json!("I use Outlook.");
        let b = canonical(&key(v));
        assert_ne!(a.scope, b.scope);
        assert_eq!(a.user_turns, 2);
    }

    #[test]
    fn no_query_when_the_last_message_is_not_user_text() {
        let mut v = base();
        v["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "Sure"}));
        assert_eq!(canonical(&key(v)).query, None);
    }
}
