//! The web console at `/ui`: watch, inspect and steer sessions in a browser.
//!
//! Built into the binary and loading nothing from elsewhere: each page is a small
//! HTML shell rendered here, and one script and one style sheet
//! (`crates/server/console/`) draw it from the public API, as any client would. The
//! pages need no build step and no JavaScript toolchain.
//!
//! Auth is the API's: a login form takes a token and keeps it in an HTTP-only
//! cookie that only this server's own pages can use ([`credentials`]); owners see
//! only their sessions; a view link (`/ui/share/{secret}`) shows one session read-only
//! to whoever holds it. Every page is sent with a strict Content-Security-Policy (no
//! inline script, nothing from another origin, no framing) and a referrer only to
//! this server, so a view link's secret never leaves in a `Referer`. (`no-referrer`
//! would make browsers send `Origin: null` with the console's own form posts.)

pub(crate) mod credentials;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use steadfast_world::{Scope, World};

use crate::auth::LINK_PREFIX;
use crate::routes::preview_links::{live_link, opens};
use crate::routes::Shared;
use crate::AuthMode;

/// The console's script.
const SCRIPT: &str = include_str!("../../console/app.js");
/// The console's style sheet.
const STYLE: &str = include_str!("../../console/app.css");

/// What every console page may load and do: its own script, style and API, nothing
/// inline and nothing from elsewhere; no page may frame it.
const POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How long a console login lasts: 12 hours.
const LOGIN_LIFE_S: u64 = 12 * 3600;

/// The console's routes, served beside the API's.
pub(crate) fn router<W: World + Clone>(state: Shared<W>) -> Router {
    Router::new()
        .route("/ui", get(sessions_page::<W>))
        .route("/ui/", get(sessions_page::<W>))
        .route("/ui/sessions/{id}", get(session_page::<W>))
        .route("/ui/share/{secret}", get(share_page::<W>))
        .route("/ui/login", get(login_page::<W>).post(login::<W>))
        .route("/ui/logout", post(logout))
        .route(
            "/ui/assets/app.js",
            get(|| asset(SCRIPT, "text/javascript")),
        )
        .route("/ui/assets/app.css", get(|| asset(STYLE, "text/css")))
        .layer(axum::middleware::map_response(hardened))
        .with_state(state)
}

/// Adds the console's security headers to every answer under `/ui`.
async fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// Who is looking, for a page that needs a login: their owner name and whether they
/// may run sessions (or else only read them), or where to go instead.
async fn viewer<W: World + Clone>(
    state: &Shared<W>,
    headers: &HeaderMap,
) -> Result<(String, bool), Response> {
    if matches!(state.auth.mode, AuthMode::Public { .. }) {
        return Err(message_page(
            StatusCode::NOT_FOUND,
            "No console here",
            "This server runs in public mode, where a session's id is its capability: there is no console to list sessions.",
        ));
    }
    match state.auth.caller(headers, state.harness.world()).await {
        Ok(caller) => {
            let runs = caller.scopes.contains(&Scope::Run);
            if !runs && !caller.scopes.contains(&Scope::Read) {
                return Err(Redirect::to("/ui/login").into_response());
            }
            Ok((caller.owner, runs))
        }
        Err(_) => Err(Redirect::to("/ui/login").into_response()),
    }
}

/// `/ui`: the caller's sessions.
async fn sessions_page<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Response {
    match viewer(&state, &headers).await {
        Ok((owner, runs)) => page("Sessions", "sessions", &owner, runs, None, &state),
        Err(elsewhere) => elsewhere,
    }
}

/// `/ui/sessions/{id}`: one session, live.
async fn session_page<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    match viewer(&state, &headers).await {
        Ok((owner, runs)) => page("Session", "session", &owner, runs, Some(&id), &state),
        Err(elsewhere) => elsewhere,
    }
}

/// `/ui/share/{secret}`: one session, read-only, for whoever holds the link. The
/// page reads through the API with the link as its bearer token.
async fn share_page<W: World + Clone>(
    State(state): State<Shared<W>>,
    Path(secret): Path<String>,
) -> Response {
    let link = match live_link(&state, &secret).await {
        Ok(link) => link,
        Err(e) => return e.into_response(),
    };
    match link.as_ref().and_then(|l| opens(&l.name)) {
        Some((session, None)) => page("Shared session", "share", "", false, Some(session), &state),
        _ => message_page(
            StatusCode::NOT_FOUND,
            "Link not found",
            "This link is unknown, has expired or was revoked.",
        ),
    }
}

/// `/ui/login`: the form that takes a token (a development server needs none).
async fn login_page<W: World + Clone>(State(state): State<Shared<W>>) -> Response {
    if matches!(state.auth.mode, AuthMode::Development) {
        return Redirect::to("/ui").into_response();
    }
    login_form(StatusCode::OK, "")
}

/// What the login form sends.
#[derive(Deserialize)]
struct Login {
    token: String,
}

/// `POST /ui/login`: checks the token as the API would and keeps it in the console's
/// cookie.
async fn login<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Form(form): Form<Login>,
) -> Response {
    if !credentials::same_origin(&headers) {
        return login_form(StatusCode::FORBIDDEN, "Log in from this server's own page.");
    }
    let token = form.token.trim();
    let cookie_safe = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\'));
    if !cookie_safe || token.starts_with(LINK_PREFIX) {
        return login_form(StatusCode::UNAUTHORIZED, "That is not an API token.");
    }
    let mut bearer = HeaderMap::new();
    let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) else {
        return login_form(StatusCode::UNAUTHORIZED, "That is not an API token.");
    };
    bearer.insert(header::AUTHORIZATION, value);
    if let Err(e) = state.auth.caller(&bearer, state.harness.world()).await {
        return login_form(StatusCode::UNAUTHORIZED, &e.message);
    }
    let secure = secure_cookie(&headers);
    let cookie = format!(
        "{}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={LOGIN_LIFE_S}{secure}",
        credentials::COOKIE
    );
    see_other("/ui", &cookie)
}

/// `POST /ui/logout`: forgets the console's cookie.
async fn logout(headers: HeaderMap) -> Response {
    let cookie = format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        credentials::COOKIE,
        secure_cookie(&headers)
    );
    see_other("/ui/login", &cookie)
}

/// `; Secure` when the browser reached this server over HTTPS (through the TLS proxy
/// in front of it, which says so in `X-Forwarded-Proto`).
fn secure_cookie(headers: &HeaderMap) -> &'static str {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    if https {
        "; Secure"
    } else {
        ""
    }
}

fn see_other(to: &'static str, cookie: &str) -> Response {
    let mut response = Redirect::to(to).into_response();
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// Escapes `text` for HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page the script draws: `kind` says which, the rest is what it needs to know.
fn page<W: World + Clone>(
    title: &str,
    kind: &str,
    owner: &str,
    runs: bool,
    session: Option<&str>,
    state: &Shared<W>,
) -> Response {
    let auth = match state.auth.mode {
        AuthMode::Development => "none",
        _ => "login",
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · Steadfast</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
         <script src=\"/ui/assets/app.js\" defer></script></head>\
         <body data-page=\"{kind}\" data-owner=\"{owner}\" data-runs=\"{runs}\" \
         data-session=\"{session}\" data-auth=\"{auth}\">\
         <a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header class=\"top\"><a class=\"brand\" href=\"/ui\">Steadfast</a>\
         <span class=\"who\" id=\"who\"></span></header>\
         <main id=\"main\" tabindex=\"-1\"><p class=\"loading\">Loading…</p></main>\
         <noscript>The console needs JavaScript; the API at /openapi.json does not.</noscript>\
         </body></html>",
        title = escape(title),
        owner = escape(owner),
        session = escape(session.unwrap_or("")),
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

/// A page with a message and nothing to draw.
fn message_page(status: StatusCode, title: &str, text: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title} · Steadfast</title><link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
         </head><body><main id=\"main\"><h1>{title}</h1><p>{text}</p></main></body></html>",
        title = escape(title),
        text = escape(text),
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// The login form, with what went wrong last time.
fn login_form(status: StatusCode, problem: &str) -> Response {
    let problem = match problem {
        "" => String::new(),
        p => format!("<p class=\"problem\" role=\"alert\">{}</p>", escape(p)),
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Log in · Steadfast</title><link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
         </head><body><main id=\"main\" class=\"login\"><h1>Steadfast</h1>{problem}\
         <form method=\"post\" action=\"/ui/login\">\
         <label for=\"token\">API token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
         <button type=\"submit\">Log in</button></form>\
         <p class=\"hint\">The same token the API takes as <code>Authorization: Bearer</code>. \
         It is kept in a cookie only this server's pages can use, for 12 hours.</p>\
         </main></body></html>"
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn text_put_in_a_page_cannot_open_markup() {
        assert_eq!(
            escape(r#"<script>"a"&'b'</script>"#),
            "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;&lt;/script&gt;"
        );
    }
}
