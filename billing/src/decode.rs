//! Usage stream payloads → ledger rows. A payload is one JSON [`UsageEvent`] or a JSON array of
//! them (`switchyard_publish::batch`); each event's `raw` column keeps the bytes it arrived as
//! (an array is cut into its elements, which are parsed one by one), so no event is encoded
//! again on the way into the ledger.

use crate::row::UsageRow;
use switchyard_schemas::UsageEvent;
use switchyard_schemas::usage::BudgetOwed;

/// A `charge` event's unwritten budget settlement: its request id and what it owes.
pub(crate) type Owed = Option<(String, BudgetOwed)>;

/// Parses and checks one payload into rows, each with its owed settlement; the error says why
/// the payload can never be stored (one bad event makes the whole message unstorable: producers
/// never batch an event they could not encode).
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<(UsageRow, Owed)>, String> {
    let text = std::str::from_utf8(payload).map_err(|e| format!("bad JSON: {e}"))?;
    let items = if text.trim_start().starts_with('[') {
        array_items(text).ok_or("bad JSON: not an array of events")?
    } else {
        vec![text]
    };
    items
        .into_iter()
        .map(|item| {
            let event: UsageEvent =
                serde_json::from_str(item).map_err(|e| format!("bad JSON: {e}"))?;
            let owed = (event.budget_owed.clone()).map(|o| (event.request_id.to_string(), o));
            let row = UsageRow::from_event(event, Some(item)).map_err(|e| e.to_string())?;
            Ok((row, owed))
        })
        .collect()
}

/// The element texts of the JSON array `text`, whitespace around each trimmed; `None` when
/// `text` is not one array with its elements separated by commas. Only the structure is read
/// here (strings, escapes, nesting); each element is parsed on its own afterwards, which
/// rejects anything else that is not JSON.
fn array_items(text: &str) -> Option<Vec<&str>> {
    let body = text.trim_start();
    let open = text.len() - body.len();
    let mut items = Vec::new();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut start = open + 1;
    for (i, b) in text.bytes().enumerate().skip(open + 1) {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b',' | b']' if depth == 0 => {
                let item = text.get(start..i)?.trim();
                // `[]` is an empty batch; an empty element anywhere else is not JSON.
                if item.is_empty() && !(b == b']' && items.is_empty()) {
                    return None;
                }
                if !item.is_empty() {
                    items.push(item);
                }
                if b == b']' {
                    return text.get(i + 1..)?.trim().is_empty().then_some(items);
                }
                start = i + 1;
            }
            b']' | b'}' => depth = depth.checked_sub(1)?,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use switchyard_schemas::usage::UsageKind;

    #[test]
    fn arrays_are_cut_into_their_elements() {
        assert_eq!(array_items("[]"), Some(vec![]));
        assert_eq!(array_items(" [ ] "), Some(vec![]));
        assert_eq!(
            array_items(r#"[{"a":"x,]}\"[{"}, {"b":[1,{"c":2}]} ]"#),
            Some(vec![r#"{"a":"x,]}\"[{"}"#, r#"{"b":[1,{"c":2}]}"#])
        );
        for bad in ["[", "[{}", "[{},]", "[,{}]", "[{}] x", "[{}}]", r#"["]"#] {
            assert_eq!(array_items(bad), None, "{bad}");
        }
    }

    #[test]
    fn raw_is_the_received_element() {
        let event =
            |n: u128| UsageEvent::new(uuid::Uuid::from_u128(n), UsageKind::Upstream, 1, "m");
        let one = serde_json::to_string(&event(1)).unwrap();
        let two = serde_json::to_string(&event(2)).unwrap();
        let payload = format!("[{one},\n  {two}]");
        let rows = decode(payload.as_bytes()).unwrap();
        let raws: Vec<&str> = rows.iter().map(|(r, _)| r.raw.as_str()).collect();
        assert_eq!(raws, [one.as_str(), two.as_str()]);
        assert_eq!(decode(one.as_bytes()).unwrap()[0].0.raw, one);
        assert!(decode(format!("[{one} {two}]").as_bytes()).is_err());
        assert!(decode(b"[{\"x\":1}]").is_err());
    }
}
