//! `GET /dashboard`: the live dashboard page (one self-contained HTML file, `dashboard.html`:
//! inline CSS and JS, hand-drawn SVG charts, no CDN), and the browser sign-in in front of it
//! (docs/dashboard.md, "Signing in").
//!
//! A browser cannot send `Authorization: Bearer`, so the admin key is exchanged once for a
//! cookie: the sign-in form (`POST /dashboard/login`, form field `key`) or `GET
//! /dashboard?key=…` (for scripts and headless browsers; answered with a 303 to `/dashboard`,
//! so the key leaves the address bar and history) checks the key like the admin API does and
//! sets `switchyard_admin` (`HttpOnly`, `SameSite=Strict`, `Path=/`, `Max-Age` 12 h, `Secure`
//! when the request came through TLS per `X-Forwarded-Proto: https`). The cookie holds a signed
//! session token, never the key ([`session_token`]): `v1.<expiry, Unix s>.<MAC>.<admin key id>`,
//! the MAC an HMAC-SHA256 keyed by the admin key's SHA-256, so every replica checks it without
//! shared session state, and removing or rotating the admin key signs its browsers out at once.
//! It is accepted on exactly one admin
//! route, `GET /admin/dashboard.json` (read-only, so a cross-site request forged with it could
//! change nothing). `POST /dashboard/logout` clears it. Every page carries a Content Security
//! Policy that allows no other origin (`connect-src 'self'`), no framing and no referrer.

use super::resolve;
use crate::AppState;
use axum::Router;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;

/// The session cookie's name.
pub(super) const COOKIE: &str = "switchyard_admin";
/// The session cookie's lifetime, seconds (12 h).
pub(super) const COOKIE_MAX_AGE_S: u64 = 12 * 3600;
/// The dashboard page.
const PAGE: &str = include_str!("dashboard.html");
/// Every page's Content Security Policy: inline script and style of this page only, data from
/// this origin only.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; form-action 'self'; base-uri 'none'; \
                   frame-ancestors 'none'";

/// `/dashboard`, `/dashboard/login` and `/dashboard/logout` (outside `/admin`: they do their
/// own key checks).
pub fn page_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/dashboard", get(dashboard))
        .route("/dashboard/login", post(login))
        .route("/dashboard/logout", post(logout))
}

/// The sign-in form's body.
#[derive(Debug, serde::Deserialize)]
pub(super) struct LoginForm {
    key: String,
}

/// The session token in the request's `switchyard_admin` cookie, if any.
pub(super) fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| percent_decode(value))
        .filter(|k| !k.is_empty())
}

/// Clock difference tolerated between the replica that issued a session and the one checking
/// it, seconds.
const CLOCK_SKEW_S: u64 = 300;
/// Domain separation of the session MAC (a MAC for nothing else can be replayed as one).
const SESSION_CONTEXT: &str = "switchyard-dashboard-session";

/// A dashboard session token for admin key `id` (whose SHA-256 hex is `key_sha256`), valid until
/// `expires_s` (Unix seconds): `v1.<expires_s>.<MAC>.<id>`, the MAC an HMAC-SHA256 (RFC 2104)
/// keyed by `key_sha256` over the context, the expiry and the id, base64url without padding.
/// The key itself is not in it and cannot be recovered from it.
pub(super) fn session_token(id: &str, key_sha256: &str, expires_s: u64) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    let mac = session_mac(id, key_sha256, expires_s)
        .finalize()
        .into_bytes();
    let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac);
    format!("v1.{expires_s}.{mac}.{id}")
}

fn session_mac(id: &str, key_sha256: &str, expires_s: u64) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac as _;
    // HMAC takes a key of any length, so this cannot fail.
    let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(key_sha256.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(format!("{SESSION_CONTEXT}\n{expires_s}\n{id}").as_bytes());
    mac
}

/// A parsed session token (see [`session_token`]); [`Session::valid`] checks it.
pub(super) struct Session<'a> {
    id: &'a str,
    expires_s: u64,
    mac: Vec<u8>,
}

impl<'a> Session<'a> {
    /// The token's parts; `None` when it is not a `v1` token.
    pub(super) fn parse(token: &'a str) -> Option<Self> {
        use base64::Engine as _;
        let mut parts = token.splitn(4, '.');
        let (version, expires, mac, id) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        (version == "v1" && !id.is_empty()).then_some(())?;
        let expires_s: u64 = expires.parse().ok()?;
        // One spelling per token (no `+1000` or `01000` for `1000`).
        (expires_s.to_string() == expires).then_some(())?;
        Some(Self {
            id,
            expires_s,
            mac: base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(mac)
                .ok()?,
        })
    }

    /// The admin key id the token names.
    pub(super) fn id(&self) -> &str {
        self.id
    }

    /// Whether the token was issued for the key hashing to `key_sha256` (MAC compared in
    /// constant time), has not expired at `now_s`, and expires no later than a session issued
    /// now would (plus [`CLOCK_SKEW_S`] between replicas).
    pub(super) fn valid(&self, key_sha256: &str, now_s: u64) -> bool {
        use hmac::Mac as _;
        now_s < self.expires_s
            && self.expires_s <= now_s + COOKIE_MAX_AGE_S + CLOCK_SKEW_S
            && session_mac(self.id, key_sha256, self.expires_s)
                .verify_slice(&self.mac)
                .is_ok()
    }
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn dashboard(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let exchanged = uri.query().and_then(|q| {
        let uri: axum::http::Uri = format!("/?{q}").parse().ok()?;
        let axum::extract::Query(pairs) =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri).ok()?;
        pairs.into_iter().find(|(k, _)| k == "key").map(|(_, v)| v)
    });
    if let Some(key) = exchanged {
        return sign_in(&app, &headers, &key);
    }
    match cookie_session(&headers).map(|t| super::resolve_session(&app, &t)) {
        Some(Some(caller)) if caller.tenant.is_none() => {
            page(StatusCode::OK, PAGE.to_owned(), None)
        }
        Some(_) => page(
            StatusCode::UNAUTHORIZED,
            login_page(
                "Your session has expired or its admin key is no longer valid; sign in again.",
            ),
            Some(clear_cookie()),
        ),
        None => page(StatusCode::OK, login_page(""), None),
    }
}

async fn login(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    match form {
        Ok(Form(f)) => sign_in(&app, &headers, &f.key),
        Err(_) => page(
            StatusCode::BAD_REQUEST,
            login_page("Send the admin key as the form field `key`."),
            None,
        ),
    }
}

async fn logout() -> Response {
    let mut r = redirect();
    r.headers_mut().insert(header::SET_COOKIE, clear_cookie());
    r
}

/// Checks `key` and answers with the cookie and a 303 to `/dashboard`, or the form again.
fn sign_in(app: &AppState, headers: &HeaderMap, key: &str) -> Response {
    let key = key.trim();
    match resolve(app, key) {
        Some(caller) if caller.tenant.is_none() => {
            let token = session_token(
                &caller.id,
                &switchyard_schemas::tenancy::sha256_hex(key),
                unix_now_s() + COOKIE_MAX_AGE_S,
            );
            let mut r = redirect();
            if let Ok(v) = HeaderValue::from_str(&session_cookie(&token, tls(headers))) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Some(_) => page(
            StatusCode::FORBIDDEN,
            login_page(
                "This admin key is limited to one tenant; the dashboard needs a gateway-wide \
                 admin key.",
            ),
            None,
        ),
        None => page(
            StatusCode::UNAUTHORIZED,
            login_page("That is not a valid admin key."),
            None,
        ),
    }
}

/// Whether the client reached us over TLS (a TLS-terminating proxy sets `X-Forwarded-Proto`).
fn tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value holding session `token`.
pub(super) fn session_cookie(token: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict{}",
        percent_encode(token),
        if secure { "; Secure" } else { "" }
    )
}

fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("switchyard_admin=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
}

fn redirect() -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/dashboard"));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

fn page(status: StatusCode, html: String, cookie: Option<HeaderValue>) -> Response {
    let mut r = (status, html).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(c) = cookie {
        h.insert(header::SET_COOKIE, c);
    }
    r
}

/// The sign-in form with `message` (fixed text, never caller input) above it.
fn login_page(message: &str) -> String {
    let note = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"err\" id=\"login-error\">{message}</p>")
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>Switchyard dashboard: sign in</title><style>\
body{{font:15px system-ui,sans-serif;background:#f4f6f8;color:#1d2733;display:flex;\
justify-content:center;align-items:center;min-height:100vh;margin:0}}\
form{{background:#fff;padding:28px 32px;border-radius:10px;box-shadow:0 1px 4px #0002;width:360px}}\
h1{{font-size:19px;margin:0 0 14px}}label{{display:block;margin-bottom:6px;color:#4a5868}}\
input{{width:100%;box-sizing:border-box;padding:9px;font:inherit;border:1px solid #b8c2cc;\
border-radius:6px}}button{{margin-top:14px;padding:9px 18px;font:inherit;border:0;\
border-radius:6px;background:#2463eb;color:#fff;cursor:pointer}}.err{{color:#b42318}}\
p.hint{{color:#6b7785;font-size:13px}}</style></head><body>\
<form method=\"post\" action=\"/dashboard/login\" id=\"login\"><h1>Switchyard dashboard</h1>{note}\
<label for=\"key\">Admin key (<code>admin.keys</code>)</label>\
<input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
<button type=\"submit\">Sign in</button><p class=\"hint\">A signed 12-hour session (not the key) \
is kept in an HttpOnly cookie; use TLS in front of the gateway.</p></form></body></html>"
    )
}

/// `s` with every byte outside `A-Z a-z 0-9 - . _ ~` as `%XX` (a valid cookie value for any id).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The inverse of [`percent_encode`]; `None` for a malformed escape or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_cookie_round_trips_any_token() {
        for key in ["sk-admin-0123", "a b;c=d,e\"f%", "ключ"] {
            let set = session_cookie(key, false);
            let value = set.split(';').next().unwrap();
            let mut h = HeaderMap::new();
            h.insert(
                header::COOKIE,
                HeaderValue::from_str(&format!("other=1; {value}")).unwrap(),
            );
            assert_eq!(cookie_session(&h).as_deref(), Some(key));
        }
        assert_eq!(
            session_cookie("k", true),
            "switchyard_admin=k; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict; Secure"
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("switchyard_admin=%Z1"),
        );
        assert_eq!(cookie_session(&h), None);
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("switchyard_admin="),
        );
        assert_eq!(cookie_session(&h), None);
    }

    #[test]
    fn a_session_token_names_its_admin_and_holds_no_key() {
        let hash = switchyard_schemas::tenancy::sha256_hex("sk-admin-0123");
        let token = session_token("ops-eu", &hash, 1_000);
        assert!(
            token.starts_with("v1.1000.") && token.ends_with(".ops-eu"),
            "{token}"
        );
        assert!(!token.contains("sk-admin-0123") && !token.contains(&hash));
        let s = Session::parse(&token).unwrap();
        assert_eq!(s.id(), "ops-eu");
        assert!(s.valid(&hash, 999));
        // Expired at its expiry second; another key (rotated) or a changed claim fails.
        assert!(!s.valid(&hash, 1_000));
        assert!(!s.valid(
            &switchyard_schemas::tenancy::sha256_hex("sk-admin-other"),
            999
        ));
        let later = token.replacen("v1.1000.", "v1.9000.", 1);
        assert!(!Session::parse(&later).unwrap().valid(&hash, 999));
        let other_id = format!("{}.ops2", token.rsplit_once(".ops-eu").unwrap().0);
        assert!(!Session::parse(&other_id).unwrap().valid(&hash, 999));
        // No session lives longer than one issued now would (12 h plus the clock skew).
        let edge = 999 + COOKIE_MAX_AGE_S + CLOCK_SKEW_S;
        assert!(
            Session::parse(&session_token("ops", &hash, edge))
                .unwrap()
                .valid(&hash, 999)
        );
        let far = session_token("ops", &hash, edge + 1);
        assert!(!Session::parse(&far).unwrap().valid(&hash, 999));
        let padded = token.replacen("v1.1000.", "v1.01000.", 1);
        for bad in [
            "",
            "v1",
            "v2.1000.AAAA.ops",
            "v1.x.AAAA.ops",
            "v1.+1000.AAAA.ops",
            &padded,
            "v1.1000.%%.ops",
            "v1.1000.AAAA.",
        ] {
            assert!(Session::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_page_is_self_contained() {
        // No CDN: the gateway may run offline, and the CSP would block it anyway.
        for needle in [
            "src=\"http",
            "href=\"http",
            "src=\"//",
            "href=\"//",
            "url(",
            "@import",
        ] {
            assert!(!PAGE.contains(needle), "dashboard.html references {needle}");
        }
        assert!(PAGE.contains("/admin/dashboard.json"));
    }
}
