//! Input validation shared by every front door (and the one parser of `data:` URLs, shared by
//! the provider adapters): the checks a request's tools, tool results and images pass before
//! anything is sent upstream.
//!
//! Each check returns the problem as a sentence; the caller names the field in its own error
//! shape (the OpenAI doors `Invalid 'tools[0].function.name': …`, the Anthropic door
//! `tools[0].name: …`). [`check_conversation`] runs every check over the normalised messages
//! and tools and names fields by their normalised (Chat Completions) path.
//!
//! Protocol facts:
//! - function names: `^[a-zA-Z0-9_-]{1,64}$` (OpenAI API reference, "Create chat completion",
//!   `tools[].function.name`: "a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum
//!   length of 64"; Anthropic "Tool use", `name`: `^[a-zA-Z0-9_-]{1,64}$`);
//! - `parameters` / `input_schema`: a JSON Schema object whose `type`, if given, is `object`
//!   (OpenAI: "schema must be a JSON Schema of 'type: \"object\"'"; Anthropic requires
//!   `input_schema.type: "object"`);
//! - images: OpenAI and Anthropic accept `image/png`, `image/jpeg`, `image/gif` and
//!   `image/webp` (OpenAI "Images and vision", Anthropic "Vision"); the magic numbers are those
//!   of the formats' specifications (PNG signature `89 50 4E 47 0D 0A 1A 0A`, JPEG SOI
//!   `FF D8 FF`, `GIF87a`/`GIF89a`, RIFF `RIFF....WEBP`); `data:` URLs per RFC 2397.
//!
//! The gateway itself never fetches an image URL: every adapter passes a web URL to the provider
//! (OpenAI `image_url`, Anthropic `url` source, Gemini `fileData`) or refuses it (Bedrock takes
//! bytes only). URLs naming a loopback, private, link-local or otherwise non-public address
//! (also as a literal in any form the WHATWG URL parser reads, e.g. `http://2130706433/`) or a
//! local-only host name (`localhost`, `*.localhost`, `*.local`, `*.internal`) are refused anyway,
//! so a self-hosted upstream on the operator's network (which does fetch URLs) is never pointed
//! at an internal service. Host names are not resolved here.

use crate::request::{Content, ContentPart, Message, Role, Tool};
use base64::Engine as _;
use serde_json::Value;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest tool name providers accept (characters).
pub const TOOL_NAME_MAX: usize = 64;

/// Longest client-supplied string echoed whole in an error message (characters); longer ones are
/// cut with `…` (see [`echo`]).
pub const ECHO_MAX: usize = 96;

/// An invalid field: its path (normalised, e.g. `messages[1].tool_call_id`) and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Path of the offending field.
    pub param: String,
    /// What is wrong with it, as a sentence.
    pub message: String,
}

/// `s` for an error message: whole up to [`ECHO_MAX`] characters, else its first
/// [`ECHO_MAX`] characters and `…`.
pub fn echo(s: &str) -> Cow<'_, str> {
    match s.char_indices().nth(ECHO_MAX) {
        None => Cow::Borrowed(s),
        Some((cut, _)) => Cow::Owned(format!("{}…", &s[..cut])),
    }
}

/// A tool's `type` is `function`.
pub fn tool_kind(kind: &str) -> Result<(), String> {
    if kind == "function" {
        Ok(())
    } else {
        Err(format!(
            "tool type `{}` is not supported: expected `function`.",
            echo(kind)
        ))
    }
}

/// A function name matches `^[a-zA-Z0-9_-]{1,64}$`.
pub fn tool_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= TOOL_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{}` does not match the pattern '^[a-zA-Z0-9_-]{{1,64}}$'.",
            echo(name)
        ))
    }
}

/// A function's `parameters` (absent, or a JSON Schema object whose `type`, if given, is
/// `object`, and whose `properties`, if given, is an object).
pub fn tool_parameters(parameters: Option<&Value>) -> Result<(), String> {
    let Some(p) = parameters.filter(|p| !p.is_null()) else {
        return Ok(());
    };
    let Value::Object(o) = p else {
        return Err("must be a JSON Schema object.".into());
    };
    match o.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => {
            return Err(format!(
                "the schema must be of `\"type\": \"object\"`, got `{}`.",
                echo(&other.to_string())
            ));
        }
    }
    match o.get("properties") {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err("`properties` must be an object.".into()),
    }
}

/// A tool result names the call it answers (`tool_call_id`, Anthropic `tool_use_id`).
pub fn tool_call_id(id: Option<&str>) -> Result<(), String> {
    match id {
        Some(id) if !id.trim().is_empty() => Ok(()),
        _ => Err("a tool result must name the call it answers (a non-empty id).".into()),
    }
}

/// The image formats every vision provider accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// `image/png`.
    Png,
    /// `image/jpeg`.
    Jpeg,
    /// `image/gif`.
    Gif,
    /// `image/webp`.
    Webp,
}

impl ImageFormat {
    /// The format a media type names (case-insensitive; `image/jpg` reads as JPEG).
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        match media_type.trim().to_ascii_lowercase().as_str() {
            "image/png" => Some(Self::Png),
            "image/jpeg" | "image/jpg" => Some(Self::Jpeg),
            "image/gif" => Some(Self::Gif),
            "image/webp" => Some(Self::Webp),
            _ => None,
        }
    }

    /// The canonical media type, e.g. `image/png`.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
        }
    }

    /// The format the bytes' magic number shows, if any of these.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A]) {
            Some(Self::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Self::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Self::Gif)
        } else if bytes.len() >= 12
            && bytes.starts_with(b"RIFF")
            && bytes.get(8..12) == Some(b"WEBP")
        {
            Some(Self::Webp)
        } else {
            None
        }
    }
}

/// A base64 `data:` URL split into its parts (RFC 2397: `data:<media type>;base64,<data>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataUrl<'a> {
    /// The declared media type, e.g. `image/png` (never empty).
    pub media_type: &'a str,
    /// The base64 payload, undecoded.
    pub data: &'a str,
}

/// `url` as a base64 `data:` URL (scheme case-insensitive), or `None` when it is not one.
/// Syntax only: see [`image_url`] for the checks of the media type and the bytes.
pub fn parse_data_url(url: &str) -> Option<DataUrl<'_>> {
    let rest = url
        .get(..5)
        .filter(|s| s.eq_ignore_ascii_case("data:"))
        .and_then(|_| url.get(5..))?;
    let (meta, data) = rest.split_once(',')?;
    let media_type = meta
        .strip_suffix(";base64")
        .or_else(|| meta.strip_suffix(";BASE64"))?;
    // Parameters such as `;charset=…` before `;base64` are not part of the type.
    let media_type = media_type.split(';').next().unwrap_or(media_type).trim();
    (!media_type.is_empty()).then_some(DataUrl { media_type, data })
}

/// Media types an inline document ([`ContentPart::File`]) may have: what both OpenAI (Chat
/// Completions file parts) and Anthropic (`document` blocks with a base64 source) take.
pub const FILE_MEDIA_TYPES: &[&str] = &["application/pdf"];

/// An inline document: a base64 `data:` URL of a [`FILE_MEDIA_TYPES`] type with a non-empty
/// payload (the gateway never fetches a document).
pub fn file_data(url: &str) -> Result<(), String> {
    let d = parse_data_url(url).ok_or(
        "file data must be a data:<media type>;base64,<data> URL (file_id is not supported).",
    )?;
    if !FILE_MEDIA_TYPES.contains(&d.media_type.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "file data of type `{}` is not supported: expected one of {}.",
            echo(d.media_type),
            FILE_MEDIA_TYPES.join(", ")
        ));
    }
    if d.data.trim().is_empty() {
        return Err("file data is empty.".into());
    }
    Ok(())
}

/// Whether the URL is a `data:` URL (scheme case-insensitive).
pub fn is_data_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
}

/// An image URL every door accepts: `https://` or `http://` to a public host, or a base64
/// `data:` URL of an allowed image type whose bytes are of that type.
pub fn image_url(url: &str) -> Result<(), String> {
    if is_data_url(url) {
        return data_image(url).map(|_| ());
    }
    let parsed =
        url::Url::parse(url).map_err(|e| format!("`{}` is not a valid URL: {e}.", echo(url)))?;
    match parsed.scheme() {
        "https" | "http" => {}
        other => {
            return Err(format!(
                "image URLs must use https, http or data; `{}:` is not allowed.",
                echo(other)
            ));
        }
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("image URLs must not carry credentials.".into());
    }
    match parsed.host() {
        None => Err("image URLs must name a host.".into()),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let local = d == "localhost"
                || [".localhost", ".local", ".internal"]
                    .iter()
                    .any(|s| d.ends_with(s));
            if local {
                Err(format!(
                    "image URLs must name a public host; `{}` is local.",
                    echo(&d)
                ))
            } else {
                Ok(())
            }
        }
        Some(url::Host::Ipv4(ip)) => public_ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => public_ip(IpAddr::V6(ip)),
    }
}

/// The decoded bytes and format of a `data:` image URL, checked: an allowed media type, valid
/// base64 and bytes whose magic number is that type's.
pub fn data_image(url: &str) -> Result<(ImageFormat, Vec<u8>), String> {
    let d = parse_data_url(url)
        .ok_or("image data URLs must be `data:<media type>;base64,<data>`.".to_owned())?;
    let declared = ImageFormat::from_media_type(d.media_type).ok_or_else(|| {
        format!(
            "image media type `{}` is not supported: use image/png, image/jpeg, image/gif or image/webp.",
            echo(d.media_type)
        )
    })?;
    let bytes = base64_engine()
        .decode(d.data.trim())
        .map_err(|e| format!("the image data is not valid base64: {e}."))?;
    match ImageFormat::sniff(&bytes) {
        Some(f) if f == declared => Ok((declared, bytes)),
        Some(f) => Err(format!(
            "the image data is {}, not the declared {}.",
            f.media_type(),
            declared.media_type()
        )),
        None => Err(format!(
            "the image data is not a {} image.",
            declared.media_type()
        )),
    }
}

/// Standard base64, padding optional (clients differ).
fn base64_engine() -> base64::engine::GeneralPurpose {
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    )
}

/// An address on the public internet (not loopback, private, link-local, shared, documentation,
/// multicast, broadcast or unspecified; IPv4-mapped and -compatible IPv6 judged as IPv4).
fn public_ip(ip: IpAddr) -> Result<(), String> {
    let public = match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    };
    if public {
        Ok(())
    } else {
        Err(format!(
            "image URLs must name a public address; `{ip}` is loopback, private or link-local."
        ))
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space, RFC 6598
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, RFC 6890
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, RFC 2544
        || a >= 240) // reserved, RFC 1112
}

fn public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4() {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible; also ::1 → 0.0.0.1).
        return !ip.is_loopback() && public_v4(v4);
    }
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local, RFC 4193
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || first == 0x2001 && ip.segments()[1] == 0x0db8 // documentation
        || first == 0x0064 && ip.segments()[1] == 0xff9b) // NAT64 (embeds IPv4)
}

/// Every check over normalised messages and tools, naming the first bad field by its
/// normalised path: tools (`tools[i].type`, `tools[i].function.name`,
/// `tools[i].function.parameters`), tool results (`messages[i].tool_call_id`), assistant tool
/// calls (`messages[i].tool_calls[j].function.name`) and images
/// (`messages[i].content[j].image_url.url`).
pub fn check_conversation(messages: &[Message], tools: &[Tool]) -> Result<(), Invalid> {
    let bad = |param: String, message: String| Invalid { param, message };
    for (i, t) in tools.iter().enumerate() {
        tool_kind(&t.kind).map_err(|m| bad(format!("tools[{i}].type"), m))?;
        tool_name(&t.function.name).map_err(|m| bad(format!("tools[{i}].function.name"), m))?;
        tool_parameters(t.function.parameters.as_ref())
            .map_err(|m| bad(format!("tools[{i}].function.parameters"), m))?;
    }
    for (i, m) in messages.iter().enumerate() {
        if m.role == Role::Tool {
            tool_call_id(m.tool_call_id.as_deref())
                .map_err(|e| bad(format!("messages[{i}].tool_call_id"), e))?;
        }
        for (j, c) in m.tool_calls.iter().enumerate() {
            if c.id.trim().is_empty() {
                return Err(bad(
                    format!("messages[{i}].tool_calls[{j}].id"),
                    "a tool call needs a non-empty id.".into(),
                ));
            }
            tool_name(&c.function.name)
                .map_err(|e| bad(format!("messages[{i}].tool_calls[{j}].function.name"), e))?;
        }
        if let Some(Content::Parts(parts)) = &m.content {
            for (j, p) in parts.iter().enumerate() {
                match p {
                    ContentPart::ImageUrl { image_url: u } => image_url(&u.url)
                        .map_err(|e| bad(format!("messages[{i}].content[{j}].image_url.url"), e))?,
                    ContentPart::File { file } => match (&file.file_url, &file.file_id) {
                        (_, Some(id)) if id.trim().is_empty() => {
                            return Err(bad(
                                format!("messages[{i}].content[{j}].file.file_id"),
                                "`file_id` must not be empty.".into(),
                            ));
                        }
                        (_, Some(_)) => {}
                        (Some(url), None) => image_url(url).map_err(|e| {
                            bad(format!("messages[{i}].content[{j}].file.file_url"), e)
                        })?,
                        (None, None) => file_data(&file.file_data).map_err(|e| {
                            bad(format!("messages[{i}].content[{j}].file.file_data"), e)
                        })?,
                    },
                    ContentPart::Text { .. } => {}
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A 1×1 PNG.
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

    #[test]
    fn tool_names_and_schemas() {
        assert!(tool_name("get_weather-2").is_ok());
        assert!(tool_name(&"a".repeat(64)).is_ok());
        for bad in ["", "a b", "x.y", "名前", &"a".repeat(65)] {
            assert!(tool_name(bad).is_err(), "{bad}");
        }
        assert!(tool_parameters(None).is_ok());
        assert!(tool_parameters(Some(&serde_json::json!({}))).is_ok());
        assert!(tool_parameters(Some(&serde_json::json!({"type": "object"}))).is_ok());
        assert!(tool_parameters(Some(&serde_json::json!("string"))).is_err());
        assert!(tool_parameters(Some(&serde_json::json!({"type": "string"}))).is_err());
        assert!(tool_parameters(Some(&serde_json::json!({"properties": []}))).is_err());
        assert!(tool_kind("function").is_ok() && tool_kind("garbage").is_err());
    }

    #[test]
    fn image_urls() {
        assert!(image_url("https://example.com/cat.png").is_ok());
        assert!(image_url("http://93.184.216.34/cat.png").is_ok());
        assert!(image_url(&format!("data:image/png;base64,{PNG}")).is_ok());
        assert!(image_url(&format!("DATA:image/PNG;base64,{PNG}")).is_ok());
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/x.png",
            "gopher://x",
            "http://localhost/x.png",
            "http://api.localhost/x.png",
            "http://127.0.0.1/x",
            "http://2130706433/x",
            "http://0x7f.1/x",
            "http://10.1.2.3/x",
            "http://172.16.0.1/x",
            "http://192.168.1.1/x",
            "http://169.254.169.254/latest/meta-data/",
            "http://0.0.0.0/x",
            "http://100.64.0.1/x",
            "http://[::1]/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://[fe80::1]/x",
            "http://[fd00::1]/x",
            "http://metadata.google.internal/x",
            "https://user:pw@example.com/x.png",
            "not a url",
            "data:image/png;base64,AA",
            "data:image/svg+xml;base64,PHN2Zz4=",
            "data:text/html;base64,PGgxPg==",
            "data:image/png,rawbytes",
            "data:image/png;base64,!!!!",
            "data:image/jpeg;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
        ] {
            assert!(image_url(bad).is_err(), "{bad}");
        }
        let e = image_url("data:image/jpeg;base64,iVBORw0KGgoAAAAN").unwrap_err();
        assert_eq!(
            e,
            "the image data is image/png, not the declared image/jpeg."
        );
    }

    #[test]
    fn sniffing() {
        assert_eq!(ImageFormat::sniff(b"GIF89a..."), Some(ImageFormat::Gif));
        assert_eq!(
            ImageFormat::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(
            ImageFormat::sniff(b"RIFF\0\0\0\0WEBPVP8 "),
            Some(ImageFormat::Webp)
        );
        assert_eq!(ImageFormat::sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(ImageFormat::sniff(b""), None);
    }

    #[test]
    fn data_url_syntax() {
        let d = parse_data_url("data:image/png;base64,AAAA").unwrap();
        assert_eq!((d.media_type, d.data), ("image/png", "AAAA"));
        assert!(parse_data_url("data:;base64,AAAA").is_none());
        assert!(parse_data_url("data:image/png,AAAA").is_none());
        assert!(parse_data_url("https://x").is_none());
        assert!(parse_data_url("dat").is_none());
        assert!(parse_data_url("daté:x").is_none());
    }

    #[test]
    fn echo_truncates_on_a_char_boundary() {
        assert_eq!(echo("short"), "short");
        let long = "é".repeat(500);
        let e = echo(&long);
        assert_eq!(e.chars().count(), ECHO_MAX + 1);
        assert!(e.ends_with('…'));
    }
}
