//! The user's own MCP servers (a session's `mcp_servers`): the harness connects to each
//! over MCP's streamable HTTP (rmcp's client), with a vault credential in a header the
//! sandbox never sees, and offers their tools — to the native model directly, and to
//! wrapped CLIs through the journaled MCP server — as `<server>__<tool>`. Each call is
//! journaled like every other; its class comes from the tool's annotations
//! (`readOnlyHint` read, `idempotentHint` idempotent, otherwise external, as MCP's
//! defaults say a tool may be destructive and open-world) or the session's override,
//! so a call a crash cut off is run again or reported outcome-unknown as its class
//! says (invariant 4).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt as _;
use serde_json::Value;
use sse_stream::{Sse, SseStream};
use steadfast_log::{McpServer, ToolClass};
use steadfast_sandbox::ToolOutput;

/// Between a server's name and its tool's in the names agents see.
pub const SEPARATOR: &str = "__";
/// The longest server name (tool names must stay within the providers' 64).
const MAX_SERVER_NAME: usize = 24;
/// The longest tool name a model API takes.
const MAX_TOOL_NAME: usize = 64;
/// How long connecting to a server and listing its tools may take (servers connect
/// at once, so this is also the longest a session's first step waits for them all).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
/// The most MCP servers a session may name.
pub const MAX_SERVERS: usize = 16;
/// How long one tool call may take before it is answered with an error (a server
/// that never answers would hold the session's worker otherwise).
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// The most of a tool's result kept (as for the sandbox's tools' output).
const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;
/// The most of one answer from an MCP server that is read (a result's text escaped in
/// JSON, with room to spare): past it the answer is cut off and the call fails, rather
/// than a server's 200 MB reply being held in memory whole before the cap applies.
const MAX_ANSWER_BYTES: usize = 4 * MAX_RESULT_BYTES;

/// The bytes of one answer, ending with an error once past [`MAX_ANSWER_BYTES`]
/// (nothing more is read from the server).
fn capped(
    stream: impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send + 'static,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    let start = (Some(Box::pin(stream)), 0usize);
    futures_util::stream::unfold(start, |(stream, read)| async move {
        let mut stream = stream?;
        let item = match stream.next().await? {
            Err(e) => Err(std::io::Error::other(e)),
            Ok(chunk) => Ok(chunk),
        };
        let read = read + item.as_ref().map_or(0, bytes::Bytes::len);
        if read > MAX_ANSWER_BYTES {
            let cut = std::io::Error::other(format!(
                "the MCP server's answer is larger than {MAX_ANSWER_BYTES} bytes; it was cut off"
            ));
            return Some((Err(cut), (None, read)));
        }
        Some((item, (Some(stream), read)))
    })
}

/// Checks a session's MCP servers before anything is made: names that namespace tools
/// (unique, short, letters, digits and `-`), `http(s)` URLs, headers that are headers.
pub fn check_servers(servers: &[McpServer]) -> Result<(), String> {
    if servers.len() > MAX_SERVERS {
        return Err(format!(
            "mcp_servers: {} servers; a session may name at most {MAX_SERVERS}",
            servers.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for server in servers {
        let name = &server.name;
        let valid = !name.is_empty()
            && name.len() <= MAX_SERVER_NAME
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid {
            return Err(format!(
                "mcp_servers: `{}` is not a server name (letters, digits and -, at most {MAX_SERVER_NAME})",
                name.escape_debug()
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("mcp_servers: two servers are named `{name}`"));
        }
        let url = &server.url;
        let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
        if !scheme_ok || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "mcp_servers: `{name}`: url must be an http:// or https:// URL"
            ));
        }
        if HeaderName::from_bytes(server.header.as_bytes()).is_err() {
            return Err(format!(
                "mcp_servers: `{name}`: `{}` is not a header name",
                server.header.escape_debug()
            ));
        }
    }
    Ok(())
}

/// One tool of a user's server, as offered to agents.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    /// The name agents call it by: `<server>__<tool>`.
    pub name: String,
    /// The server's own name for it.
    pub remote_name: String,
    /// What it does.
    pub description: String,
    /// Its input's JSON Schema.
    pub input_schema: Value,
    /// How a call of it may affect the world.
    pub class: ToolClass,
    server: usize,
}

/// The class of a tool: the session's override, else its annotations.
fn class_of(
    tool: &rmcp::model::Tool,
    overrides: &std::collections::BTreeMap<String, ToolClass>,
) -> ToolClass {
    if let Some(class) = overrides.get(tool.name.as_ref()) {
        return *class;
    }
    let hints = tool.annotations.as_ref();
    // A tool that says it both only reads and destroys is taken at its worse word.
    let destructive = hints.and_then(|a| a.destructive_hint) == Some(true);
    if hints.and_then(|a| a.read_only_hint) == Some(true) && !destructive {
        ToolClass::Read
    } else if hints.and_then(|a| a.idempotent_hint) == Some(true) {
        ToolClass::Idempotent
    } else {
        ToolClass::External
    }
}

/// A session's connected MCP servers and their tools.
pub struct RemoteTools {
    clients: Vec<(String, RunningService<RoleClient, ()>)>,
    tools: Vec<RemoteTool>,
}

impl std::fmt::Debug for RemoteTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTools")
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl RemoteTools {
    /// Connects to each server (`secrets` has each one's credential, opened from the
    /// vault) and lists its tools. A server that cannot be reached is left out, with
    /// why, in the second value: its tools are not offered, and a call of one already
    /// in the conversation gets an error result. A server at an internal address is
    /// not connected to unless the operator opened it (`open`; see
    /// [`steadfast_sandbox::outbound`]): a session names the URL, and the harness would
    /// otherwise reach into its own network for it.
    pub async fn connect(
        servers: &[McpServer],
        secrets: &HashMap<String, String>,
        open: &[steadfast_sandbox::HostRule],
    ) -> (Self, Vec<String>) {
        let mut clients = Vec::new();
        let mut tools: Vec<RemoteTool> = Vec::new();
        let mut failures = Vec::new();
        // All at once: a slow server delays the session by its timeout, not the sum.
        let connecting = servers.iter().map(|server| async move {
            tokio::time::timeout(
                CONNECT_TIMEOUT,
                connect_one(server, secrets.get(&server.name).map(String::as_str), open),
            )
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())))
        });
        let connected_all = futures_util::future::join_all(connecting).await;
        for (server, connected) in servers.iter().zip(connected_all) {
            let (client, listed) = match connected {
                Ok(connected) => connected,
                Err(e) => {
                    failures.push(format!("MCP server `{}`: {e}", server.name));
                    continue;
                }
            };
            let index = clients.len();
            for tool in listed {
                let name = format!("{}{SEPARATOR}{}", server.name, tool.name);
                let valid = name.len() <= MAX_TOOL_NAME
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    failures.push(format!(
                        "MCP server `{}`: tool `{}` left out: its name is not one model APIs take",
                        server.name,
                        tool.name.escape_debug()
                    ));
                    continue;
                }
                if tools.iter().any(|t| t.name == name) {
                    failures.push(format!(
                        "MCP server `{}`: tool `{}` listed twice; offered once",
                        server.name,
                        tool.name.escape_debug()
                    ));
                    continue;
                }
                tools.push(RemoteTool {
                    class: class_of(&tool, &server.classes),
                    name,
                    remote_name: tool.name.to_string(),
                    description: tool.description.as_deref().unwrap_or("").to_string(),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                    server: index,
                });
            }
            clients.push((server.name.clone(), client));
        }
        (RemoteTools { clients, tools }, failures)
    }

    /// The tools offered.
    pub fn tools(&self) -> &[RemoteTool] {
        &self.tools
    }

    /// The tool agents call `name`, if a connected server has it.
    pub fn find(&self, name: &str) -> Option<&RemoteTool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Calls tool `name` with `input`: its text content (other content as JSON) and
    /// whether it failed. A tool no connected server has is an error result.
    pub async fn call(&self, name: &str, input: &Value) -> ToolOutput {
        let Some(tool) = self.find(name) else {
            return ToolOutput::error(format!(
                "[steadfast] `{name}`: its MCP server is not connected now"
            ));
        };
        let (server, client) = &self.clients[tool.server];
        let arguments = match input {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            _ => return ToolOutput::error(format!("`{name}`: the input must be an object")),
        };
        let params = CallToolRequestParams {
            meta: None,
            name: tool.remote_name.clone().into(),
            arguments,
            task: None,
        };
        let called = tokio::time::timeout(CALL_TIMEOUT, client.call_tool(params)).await;
        let Ok(called) = called else {
            return ToolOutput::error(format!(
                "MCP server `{server}`: no answer within {} s",
                CALL_TIMEOUT.as_secs()
            ));
        };
        match called {
            Ok(result) => {
                let text = result
                    .content
                    .iter()
                    .map(|c| match c.as_text() {
                        Some(t) => t.text.clone(),
                        None => serde_json::to_string(c).unwrap_or_default(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let mut text = match (&result.structured_content, text.is_empty()) {
                    (Some(structured), true) => structured.to_string(),
                    _ => text,
                };
                if text.len() > MAX_RESULT_BYTES {
                    let whole = text.len();
                    let mut cut = MAX_RESULT_BYTES;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push_str(&format!(
                        "\n[steadfast] the result was {whole} bytes; only the first {cut} are kept"
                    ));
                }
                ToolOutput {
                    text,
                    is_error: result.is_error == Some(true),
                    exit_code: None,
                }
            }
            Err(e) => ToolOutput::error(format!("MCP server `{server}`: {e}")),
        }
    }

    /// Closes every connection.
    pub async fn close(self) {
        for (_, client) in self.clients {
            let _ = client.cancel().await;
        }
    }
}

async fn connect_one(
    server: &McpServer,
    secret: Option<&str>,
    open: &[steadfast_sandbox::HostRule],
) -> Result<(RunningService<RoleClient, ()>, Vec<rmcp::model::Tool>), String> {
    // Connected to the addresses screened, and no other.
    let screened = steadfast_sandbox::outbound::screen_url(&server.url, open)
        .await
        .map_err(|e| format!("not connected: {e}"))?;
    let mut headers = HeaderMap::new();
    if let Some(secret) = secret {
        let value = HeaderValue::from_str(&format!("{}{secret}", server.prefix))
            .map_err(|_| "the credential cannot be sent as a header".to_string())?;
        let name = HeaderName::from_bytes(server.header.as_bytes()).map_err(|e| e.to_string())?;
        headers.insert(name, value);
    }
    let http = McpHttp {
        client: reqwest::Client::builder()
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .resolve_to_addrs(&screened.host, &screened.addrs)
            .build()
            .map_err(|e| e.to_string())?,
        headers: Arc::new(headers),
    };
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()),
    );
    let client = ().serve(transport).await.map_err(|e| e.to_string())?;
    let tools = client.list_all_tools().await.map_err(|e| e.to_string())?;
    Ok((client, tools))
}

/// MCP's streamable HTTP over our HTTP client (rmcp's own adapter is for another
/// major version of reqwest), sending the server's credential header with every
/// request and following no redirect (which would carry it elsewhere).
#[derive(Clone)]
struct McpHttp {
    client: reqwest::Client,
    headers: Arc<HeaderMap>,
}

const SESSION_HEADER: &str = "mcp-session-id";
const LAST_EVENT_HEADER: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

type HttpError = StreamableHttpError<reqwest::Error>;

impl McpHttp {
    fn request(&self, method: reqwest::Method, uri: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, uri)
            .headers((*self.headers).clone())
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"))
    }
}

fn content_type(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

impl StreamableHttpClient for McpHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let mut request = self.request(reqwest::Method::POST, &uri);
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        if let Some(session) = session_id {
            request = request.header(SESSION_HEADER, session.as_ref());
        }
        let response = request
            .json(&message)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if matches!(
            status,
            reqwest::StatusCode::ACCEPTED | reqwest::StatusCode::NO_CONTENT
        ) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let response = response
            .error_for_status()
            .map_err(StreamableHttpError::Client)?;
        let session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match content_type(&response) {
            Some(ct) if ct.starts_with(EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
                SseStream::from_bytes_stream(capped(response.bytes_stream())).boxed(),
                session,
            )),
            Some(ct) if ct.starts_with(JSON) => {
                let mut body = Vec::new();
                let mut chunks = std::pin::pin!(capped(response.bytes_stream()));
                while let Some(chunk) = chunks.next().await {
                    body.extend_from_slice(&chunk?);
                }
                let message: ServerJsonRpcMessage = serde_json::from_slice(&body)?;
                Ok(StreamableHttpPostResponse::Json(message, session))
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
    ) -> Result<(), HttpError> {
        let response = self
            .request(reqwest::Method::DELETE, &uri)
            .header(SESSION_HEADER, session_id.as_ref())
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        response
            .error_for_status()
            .map_err(StreamableHttpError::Client)?;
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let mut request = self
            .request(reqwest::Method::GET, &uri)
            .header(SESSION_HEADER, session_id.as_ref());
        if let Some(last) = last_event_id {
            request = request.header(LAST_EVENT_HEADER, last);
        }
        let response = request.send().await.map_err(StreamableHttpError::Client)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        let response = response
            .error_for_status()
            .map_err(StreamableHttpError::Client)?;
        match content_type(&response) {
            Some(ct) if ct.starts_with(EVENT_STREAM) || ct.starts_with(JSON) => {
                Ok(SseStream::from_bytes_stream(capped(response.bytes_stream())).boxed())
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, url: &str) -> McpServer {
        McpServer {
            name: name.into(),
            url: url.into(),
            credential: None,
            header: "Authorization".into(),
            prefix: "Bearer ".into(),
            classes: Default::default(),
        }
    }

    #[test]
    fn a_tool_is_classed_by_its_most_careful_hint() {
        let tool = |read_only: Option<bool>, destructive: Option<bool>| {
            let mut t = rmcp::model::Tool::new("t", "a tool", Arc::new(serde_json::Map::new()));
            t.annotations = Some(rmcp::model::ToolAnnotations {
                read_only_hint: read_only,
                destructive_hint: destructive,
                ..Default::default()
            });
            t
        };
        let none = Default::default();
        assert_eq!(class_of(&tool(Some(true), None), &none), ToolClass::Read);
        assert_eq!(
            class_of(&tool(Some(true), Some(false)), &none),
            ToolClass::Read
        );
        assert_eq!(
            class_of(&tool(Some(true), Some(true)), &none),
            ToolClass::External,
            "read-only and destructive at once is not read-only"
        );
        assert_eq!(class_of(&tool(None, None), &none), ToolClass::External);
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_is_cut_off_not_read_whole() {
        // An endless answer, 1 MiB at a time, counting what is pulled from it.
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = pulled.clone();
        let endless = futures_util::stream::repeat_with(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, reqwest::Error>(bytes::Bytes::from(vec![b'x'; 1 << 20]))
        });
        let items: Vec<_> = capped(endless).collect().await;
        let (kept, cut): (Vec<_>, Vec<_>) = items.into_iter().partition(Result::is_ok);
        assert_eq!(
            kept.len(),
            MAX_ANSWER_BYTES >> 20,
            "every chunk up to the cap"
        );
        assert_eq!(cut.len(), 1, "then one error, and the end");
        assert!(cut[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("larger than"));
        assert_eq!(
            pulled.load(std::sync::atomic::Ordering::SeqCst),
            (MAX_ANSWER_BYTES >> 20) + 1,
            "nothing read past the cap"
        );
    }

    #[test]
    fn servers_are_checked() {
        assert!(check_servers(&[server("tracker", "https://mcp.example.com/mcp")]).is_ok());
        for (servers, says) in [
            (vec![server("a b", "https://x/mcp")], "server name"),
            (vec![server("a__b", "https://x/mcp")], "server name"),
            (
                vec![server(&"x".repeat(25), "https://x/mcp")],
                "server name",
            ),
            (vec![server("a", "file:///etc/passwd")], "url"),
            (
                vec![server("a", "https://x/mcp"), server("a", "https://y/mcp")],
                "two servers",
            ),
            (
                (0..=MAX_SERVERS)
                    .map(|i| server(&format!("s{i}"), "https://x/mcp"))
                    .collect(),
                "at most",
            ),
        ] {
            let err = check_servers(&servers).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let mut bad_header = server("a", "https://x/mcp");
        bad_header.header = "Bad Header".into();
        assert!(check_servers(&[bad_header]).is_err());
    }

    #[test]
    fn classes_come_from_annotations_unless_overridden() {
        let tool = |read: Option<bool>, idem: Option<bool>| {
            let mut t = rmcp::model::Tool::new("t", "", Arc::new(serde_json::Map::new()));
            t.annotations = Some(rmcp::model::ToolAnnotations {
                read_only_hint: read,
                idempotent_hint: idem,
                ..Default::default()
            });
            t
        };
        let none = Default::default();
        assert_eq!(class_of(&tool(Some(true), None), &none), ToolClass::Read);
        assert_eq!(
            class_of(&tool(None, Some(true)), &none),
            ToolClass::Idempotent
        );
        assert_eq!(class_of(&tool(None, None), &none), ToolClass::External);
        let bare = rmcp::model::Tool::new("t", "", Arc::new(serde_json::Map::new()));
        assert_eq!(class_of(&bare, &none), ToolClass::External);
        let overrides = [("t".to_string(), ToolClass::Read)].into_iter().collect();
        assert_eq!(class_of(&tool(None, None), &overrides), ToolClass::Read);
    }
}
