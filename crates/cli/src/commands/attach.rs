//! `steadfast attach <session> --server URL`: a shell in a session's sandbox, in this
//! terminal, through the server's `GET /v1/sessions/{id}/shell` WebSocket.
//!
//! The terminal is put in raw mode (every key goes to the shell, Ctrl-C included) and
//! given back as it was however the command ends. `Ctrl-]` detaches; so does leaving
//! the shell (`exit`, Ctrl-D). The window's size follows the terminal's. Standard input
//! that is no terminal is typed as it comes, and its end ends the shell's input (as
//! with `ssh`): `echo 'make test' | steadfast attach ...` runs a command as a person.

use std::process::ExitCode;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use std::io::Write;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::remote::{segment, Remote};

/// The key that detaches (Ctrl-], as telnet's escape).
const DETACH: u8 = 0x1d;

/// End of input at the start of a line (Ctrl-D): the shell exits.
const EOT: u8 = 0x04;

/// What a stream to the server is (plain TCP, or TLS over it).
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// Attaches this terminal to a shell in `session`'s sandbox; `force` takes it from a
/// running turn (interrupting it) rather than attach read-only. Exits with the shell's
/// exit code.
pub(crate) async fn attach(
    remote: &Remote,
    session: &str,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let size = window_size();
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
    let mut url = url::Url::parse(remote.base())?;
    let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
    url.set_scheme(scheme)
        .map_err(|()| anyhow::anyhow!("--server: cannot make a WebSocket URL of it"))?;
    url.set_path(&format!("/v1/sessions/{}/shell", segment(session)));
    url.query_pairs_mut()
        .append_pair("rows", &size.0.to_string())
        .append_pair("cols", &size.1.to_string())
        .append_pair("term", &term)
        .append_pair("force", &force.to_string())
        .append_pair("editing", &interactive.to_string());
    let mut request = url.as_str().into_client_request()?;
    if let Some(token) = remote.token() {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
    }
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the server at {}: {e}", remote.base()))?;
    let stream: Box<dyn Stream> = match scheme {
        "wss" => Box::new(tls(&host, tcp).await?),
        _ => Box::new(tcp),
    };
    let (socket, _) = match tokio_tungstenite::client_async(request, stream).await {
        Ok(connected) => connected,
        Err(tokio_tungstenite::tungstenite::Error::Http(answer)) => {
            let body = answer
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| body.to_string());
            anyhow::bail!("the server refused: {message} ({})", answer.status());
        }
        Err(e) => anyhow::bail!("the shell's WebSocket: {e}"),
    };
    let raw = RawTerminal::enter();
    let outcome = run(socket, interactive).await;
    drop(raw);
    let (code, changes) = outcome?;
    if !changes.is_empty() {
        eprintln!("steadfast: recorded what you changed:");
        for change in &changes {
            eprintln!("  {change}");
        }
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Carries the terminal and the socket until the shell ends or the person detaches.
/// Returns the shell's exit code and the changes recorded at the end.
async fn run(
    socket: tokio_tungstenite::WebSocketStream<Box<dyn Stream>>,
    interactive: bool,
) -> anyhow::Result<(i32, Vec<String>)> {
    let (mut to_server, mut from_server) = socket.split();
    let mut stdin = keystrokes();
    let mut stdout = std::io::stdout();
    let mut resized =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut detaching = false;
    loop {
        tokio::select! {
            read = stdin.recv(), if !detaching => {
                let keys = read.unwrap_or_default();
                if keys.is_empty() && !interactive {
                    // Piped input has ended: so does the shell's, as with `ssh`; it
                    // runs what it was given and exits.
                    to_server.send(Message::Binary(vec![EOT].into())).await?;
                    detaching = true;
                    continue;
                }
                let (typed, detach) = match keys.iter().position(|b| *b == DETACH && interactive) {
                    Some(at) => (&keys[..at], true),
                    None => (&keys[..], keys.is_empty()),
                };
                if !typed.is_empty() {
                    to_server.send(Message::Binary(typed.to_vec().into())).await?;
                }
                if detach {
                    // The server records the shell and says so before it closes.
                    let detach = serde_json::json!({"type": "detach"});
                    to_server.send(Message::Text(detach.to_string().into())).await?;
                    detaching = true;
                }
            }
            _ = resized.recv() => {
                let (rows, cols) = window_size();
                let resize = serde_json::json!({"type": "resize", "rows": rows, "cols": cols});
                to_server.send(Message::Text(resize.to_string().into())).await?;
            }
            message = from_server.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    stdout.write_all(&bytes)?;
                    stdout.flush()?;
                }
                Some(Ok(Message::Text(text))) => {
                    let notice: serde_json::Value = serde_json::from_str(text.as_str())?;
                    match notice["type"].as_str() {
                        Some("exit") => {
                            let code = notice["code"].as_i64().unwrap_or(0) as i32;
                            let changes = notice["changes"]
                                .as_array()
                                .map(|c| c.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
                                .unwrap_or_default();
                            return Ok((code, changes));
                        }
                        Some("attached") => {
                            let mode = notice["mode"].as_str().unwrap_or("");
                            let note = match mode {
                                "read-only" => "a turn is running: this shell is read-only \
                                                (attach --force to interrupt the turn); ",
                                _ => "",
                            };
                            stdout.write_all(format!("[steadfast: attached, {mode}; {note}Ctrl-] detaches]\r\n").as_bytes())?;
                        }
                        Some("leave") => {
                            let why = notice["reason"].as_str().unwrap_or("");
                            stdout.write_all(format!("\r\n[steadfast: {why}]\r\n").as_bytes())?;
                        }
                        _ => {}
                    }
                    stdout.flush()?;
                }
                Some(Ok(Message::Close(_))) | None => return Ok((0, Vec::new())),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
            }
        }
    }
}

/// What is typed, read on a thread of its own (a read of a terminal cannot be
/// cancelled, and must not keep the runtime from ending); an empty read is the end.
fn keystrokes() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut keys = vec![0u8; 4096];
        loop {
            let n = std::io::Read::read(&mut std::io::stdin(), &mut keys).unwrap_or(0);
            if tx.blocking_send(keys[..n].to_vec()).is_err() || n == 0 {
                return;
            }
        }
    });
    rx
}

/// The terminal's rows and columns (24×80 when stdout is not a terminal).
fn window_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(size) if size.ws_row > 0 && size.ws_col > 0 => (size.ws_row, size.ws_col),
        _ => (24, 80),
    }
}

/// The terminal in raw mode while this lives (nothing, when stdin is not one).
struct RawTerminal(Option<rustix::termios::Termios>);

impl RawTerminal {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        let Ok(before) = rustix::termios::tcgetattr(&stdin) else {
            return RawTerminal(None);
        };
        let mut raw = before.clone();
        raw.make_raw();
        match rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw) {
            Ok(()) => RawTerminal(Some(before)),
            Err(_) => RawTerminal(None),
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                before,
            );
        }
    }
}

/// A TLS connection to `host` over `tcp`, trusting the system's roots.
async fn tls(
    host: &str,
    tcp: tokio::net::TcpStream,
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string())?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?)
}
