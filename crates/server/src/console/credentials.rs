//! How a browser's credentials reach the API, and how far a view link reaches.
//!
//! - **The console's cookie.** Logging in to the console stores the caller's token in
//!   an HTTP-only, `SameSite=Strict` cookie; on a request that carries no
//!   `Authorization` header, the cookie's token becomes its bearer token — but only
//!   when the request comes from this server's own pages (its `Origin`, when sent, is
//!   this host; its `Sec-Fetch-Site`, when sent, is `same-origin` or `none`). A page of
//!   another site cannot use it: not by a form, a script or a WebSocket (cross-site
//!   WebSocket hijacking is refused by the same check). A preview, served on this
//!   origin, runs sandboxed (see [`crate::routes::previews`]) so its scripts are
//!   another origin too.
//! - **View links** (`sfl_…` secrets naming a session's view) authenticate with the
//!   `read` scope, and only for `GET` and `HEAD` of that one session's read routes:
//!   its summary, events, diffs, files, archive and tool outputs. Everything else is
//!   refused here, before any route sees the request.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use steadfast_world::World;

use crate::auth::LINK_PREFIX;
use crate::error::ApiError;
use crate::routes::preview_links::{live_link, opens};
use crate::routes::Shared;

/// The cookie that holds a console login's token.
pub(crate) const COOKIE: &str = "steadfast_token";

/// The read routes of a session a view link opens, after `/v1/sessions/{id}`.
const VIEW_ROUTES: [&str; 6] = ["", "/events", "/diff", "/files", "/archive", "/outputs"];

/// Turns a same-origin console cookie into the request's bearer token, and holds a
/// view link to its session's read routes.
pub(crate) async fn credentials<W: World + Clone>(
    State(state): State<Shared<W>>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if !headers.contains_key(header::AUTHORIZATION) {
        if let Some(token) = cookie(headers, COOKIE).filter(|_| same_origin(headers)) {
            if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
                request.headers_mut().insert(header::AUTHORIZATION, value);
            }
        }
    }
    if let Some(secret) = bearer(request.headers()).filter(|t| t.starts_with(LINK_PREFIX)) {
        let secret = secret.to_string();
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        if let Err(refused) = view_link_may(&state, &secret, &method, &path).await {
            return refused.into_response();
        }
    }
    next.run(request).await
}

/// Whether the link `secret` may call `method` on `path`: a live view link, a read,
/// and one of its session's read routes.
async fn view_link_may<W: World + Clone>(
    state: &Shared<W>,
    secret: &str,
    method: &Method,
    path: &str,
) -> Result<(), ApiError> {
    let unknown = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown, expired or revoked link",
        )
    };
    let link = live_link(state, secret).await?.ok_or_else(unknown)?;
    let Some((session, None)) = opens(&link.name) else {
        // A port's link opens its preview URL, never the API.
        return Err(unknown());
    };
    if !matches!(*method, Method::GET | Method::HEAD) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only",
            "a view link only reads: GET and HEAD",
        ));
    }
    if !view_route(session, path) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "outside_link",
            format!("a view link reads session {session}'s summary, events, diffs, files, archive and outputs, nothing else"),
        ));
    }
    Ok(())
}

/// Whether `path` is one of `session`'s read routes a view link opens.
fn view_route(session: &str, path: &str) -> bool {
    let Some(rest) = path
        .strip_prefix("/v1/sessions/")
        .and_then(|p| p.strip_prefix(session))
    else {
        return false;
    };
    VIEW_ROUTES.iter().any(|route| {
        rest == *route
            || (matches!(*route, "/files" | "/outputs")
                && rest.len() > route.len() + 1
                && rest.starts_with(route)
                && rest.as_bytes()[route.len()] == b'/')
    })
}

/// The bearer token of `headers`, if there is one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The value of cookie `name` in `headers`, if it is set.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// Whether a browser sent this request from this server's own pages (or typed it
/// in): what lets a cookie stand for its owner.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return false;
        }
    }
    match text(header::ORIGIN) {
        None => true,
        Some(origin) => {
            let Some(host) = text(header::HOST) else {
                return false;
            };
            let from = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            from == Some(host)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_cookie_counts_only_from_this_servers_own_pages() {
        let host = ("host", "console.example:8080");
        assert!(same_origin(&headers(&[host])));
        assert!(same_origin(&headers(&[
            host,
            ("origin", "https://console.example:8080"),
            ("sec-fetch-site", "same-origin"),
        ])));
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "none")])));
        for (origin, site) in [
            ("https://evil.example", "cross-site"),
            ("https://evil.example", "same-origin"),
            ("null", "cross-site"),
            ("https://console.example:8080", "same-site"),
            ("https://console.example", "same-origin"),
        ] {
            assert!(
                !same_origin(&headers(&[
                    host,
                    ("origin", origin),
                    ("sec-fetch-site", site)
                ])),
                "{origin} {site}"
            );
        }
        assert!(!same_origin(&headers(&[("origin", "https://a.example")])));
    }

    #[test]
    fn cookies_are_read_by_name_across_headers() {
        let h = headers(&[("cookie", "a=1; steadfast_token=sft_x"), ("cookie", "b=2")]);
        assert_eq!(cookie(&h, COOKIE), Some("sft_x"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "steadfast"), None);
        assert_eq!(
            cookie(&headers(&[("cookie", "steadfast_token=")]), COOKIE),
            None
        );
    }

    #[test]
    fn a_view_link_opens_its_sessions_read_routes_only() {
        let s = "ses_1";
        for path in [
            "/v1/sessions/ses_1",
            "/v1/sessions/ses_1/events",
            "/v1/sessions/ses_1/diff",
            "/v1/sessions/ses_1/files",
            "/v1/sessions/ses_1/files/src/main.rs",
            "/v1/sessions/ses_1/archive",
            "/v1/sessions/ses_1/outputs/12",
        ] {
            assert!(view_route(s, path), "{path}");
        }
        for path in [
            "/v1/sessions",
            "/v1/sessions/ses_12",
            "/v1/sessions/ses_12/events",
            "/v1/sessions/ses_1/shell",
            "/v1/sessions/ses_1/ports/8000/",
            "/v1/sessions/ses_1/messages",
            "/v1/sessions/ses_1/links",
            "/v1/sessions/ses_1/files/",
            "/v1/sessions/ses_1/filesx",
            "/v1/sessions/ses_1/audit",
            "/v1/sessions/ses_2/events",
            "/v1/vaults",
        ] {
            assert!(!view_route(s, path), "{path}");
        }
    }
}
