//! A user's MCP server for tests (rmcp, streamable HTTP, bearer-token auth): an issue
//! tracker with a read-only tool (`lookup_issue`), an idempotent one (`set_label`) and a
//! destructive one (`close_issue`), annotated as such. It counts every call by tool and
//! every request refused for a missing or wrong token, so a test can see what ran how
//! many times and that only the harness, with the token, reached it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, Content, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerInfo, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler};

#[derive(Default)]
struct Counts {
    calls: HashMap<String, u32>,
    refused: u32,
}

/// The tracker's tools, and what it has seen.
#[derive(Clone)]
struct Tracker {
    counts: Arc<Mutex<Counts>>,
}

fn tool(name: &'static str, description: &'static str, hints: ToolAnnotations) -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["id"]
    });
    let serde_json::Value::Object(schema) = schema else {
        unreachable!("an object")
    };
    let mut tool = Tool::new(name, description, Arc::new(schema));
    tool.annotations = Some(hints);
    tool
}

fn tools() -> Vec<Tool> {
    vec![
        tool(
            "lookup_issue",
            "Read an issue",
            ToolAnnotations {
                read_only_hint: Some(true),
                ..Default::default()
            },
        ),
        tool(
            "set_label",
            "Set an issue's label (setting it twice changes nothing)",
            ToolAnnotations {
                read_only_hint: Some(false),
                idempotent_hint: Some(true),
                destructive_hint: Some(false),
                ..Default::default()
            },
        ),
        tool(
            "close_issue",
            "Close an issue",
            ToolAnnotations {
                read_only_hint: Some(false),
                destructive_hint: Some(true),
                ..Default::default()
            },
        ),
    ]
}

impl ServerHandler for Tracker {
    fn get_info(&self) -> ServerInfo {
        ServerInfo {
            capabilities: ServerCapabilities::builder().enable_tools().build(),
            server_info: Implementation {
                name: "tracker".into(),
                title: None,
                version: "1.0.0".into(),
                description: None,
                icons: None,
                website_url: None,
            },
            ..ServerInfo::default()
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult {
            tools: tools(),
            ..ListToolsResult::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let id = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("id"))
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        *self
            .counts
            .lock()
            .unwrap()
            .calls
            .entry(request.name.to_string())
            .or_default() += 1;
        let text = match request.name.as_ref() {
            "lookup_issue" => format!("issue {id}: the parser drops trailing commas (open)"),
            "set_label" => format!("issue {id} labelled"),
            "close_issue" => format!("issue {id} closed"),
            other => {
                return Ok(CallToolResult::error(vec![Content::text(format!(
                    "no tool {other}"
                ))]))
            }
        };
        Ok(CallToolResult::success(vec![Content::text(text)]))
    }
}

/// A running tracker MCP server on loopback.
pub struct McpTracker {
    addr: SocketAddr,
    counts: Arc<Mutex<Counts>>,
    task: tokio::task::JoinHandle<()>,
}

impl McpTracker {
    /// Starts it, taking requests that carry `Authorization: Bearer <token>`.
    pub async fn start(token: &str) -> std::io::Result<Self> {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let tracker = Tracker {
            counts: counts.clone(),
        };
        let service = StreamableHttpService::new(
            move || Ok(tracker.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let expected = Arc::new(format!("Bearer {token}"));
        let guard = (expected, counts.clone());
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(guard, bearer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(McpTracker { addr, counts, task })
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// How many times tool `name` ran.
    pub fn calls(&self, name: &str) -> u32 {
        self.counts
            .lock()
            .unwrap()
            .calls
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// How many requests were refused for a missing or wrong token.
    pub fn refused(&self) -> u32 {
        self.counts.lock().unwrap().refused
    }
}

impl Drop for McpTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn bearer(
    State((expected, counts)): State<(Arc<String>, Arc<Mutex<Counts>>)>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get("authorization")
        .map(|v| v.as_bytes().to_vec());
    if given.as_deref() != Some(expected.as_bytes()) {
        counts.lock().unwrap().refused += 1;
        return (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response();
    }
    next.run(request).await
}
