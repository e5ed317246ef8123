//! The MCP server a wrapped agent gets its tools from: the sandbox's `bash`, `read`,
//! `write`, `edit`, `glob` and `grep`, and the tools of the session's own MCP servers
//! (`<server>__<tool>`, see [`steadfast_journal::remote`]), each call going through the [`Journal`]
//! (intent before, outcome after, replayed after a crash, never run twice). Served
//! over MCP's streamable HTTP transport (rmcp), stateless, at `/mcp`.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, Content, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerInfo, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler};
use steadfast_sandbox::{tool_specs, Sandbox};
use steadfast_world::World;

use steadfast_journal::Journal;

/// The name agents see the server under (Claude Code shows its tools as
/// `mcp__steadfast__bash`, ...).
pub const SERVER_NAME: &str = "steadfast";

/// One MCP session's handler over a shared journal.
pub struct JournalServer<W, S> {
    journal: Arc<Journal<W, S>>,
}

impl<W, S> Clone for JournalServer<W, S> {
    fn clone(&self) -> Self {
        JournalServer {
            journal: self.journal.clone(),
        }
    }
}

fn tools() -> Vec<Tool> {
    tool_specs()
        .into_iter()
        .map(|spec| {
            let schema = match spec.input_schema {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Tool::new(spec.name, spec.description, Arc::new(schema))
        })
        .collect()
}

impl<W: World + Clone, S: Sandbox> ServerHandler for JournalServer<W, S> {
    fn get_info(&self) -> ServerInfo {
        ServerInfo {
            capabilities: ServerCapabilities::builder().enable_tools().build(),
            server_info: Implementation {
                name: SERVER_NAME.into(),
                title: Some("Steadfast sandbox tools".into()),
                version: env!("CARGO_PKG_VERSION").into(),
                description: None,
                icons: None,
                website_url: None,
            },
            instructions: Some(
                "Tools that run in the session's sandbox on its workspace; every call is journaled."
                    .into(),
            ),
            ..ServerInfo::default()
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let remote = self.journal.remote_tools().iter().map(|t| {
            let schema = match &t.input_schema {
                serde_json::Value::Object(map) => map.clone(),
                _ => serde_json::Map::new(),
            };
            Tool::new(t.name.clone(), t.description.clone(), Arc::new(schema))
        });
        let push = self.journal.pushes().then(|| {
            let def = steadfast_journal::git::push_tool();
            let schema = match def.input_schema {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Tool::new(def.name, def.description, Arc::new(schema))
        });
        let explore = self.journal.explorers().map(|max| {
            let def = steadfast_journal::explore::explore_tool(max);
            let schema = match def.input_schema {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Tool::new(def.name, def.description, Arc::new(schema))
        });
        Ok(ListToolsResult {
            tools: tools()
                .into_iter()
                .chain(push)
                .chain(explore)
                .chain(remote)
                .collect(),
            ..ListToolsResult::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let input = serde_json::Value::Object(request.arguments.unwrap_or_default());
        match self.journal.call(&request.name, &input).await {
            Ok((text, false)) => Ok(CallToolResult::success(vec![Content::text(text)])),
            Ok((text, true)) => Ok(CallToolResult::error(vec![Content::text(text)])),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }
}

/// The MCP routes (`/mcp`) over `journal`.
pub fn router<W: World + Clone, S: Sandbox>(journal: Arc<Journal<W, S>>) -> axum::Router {
    let server = JournalServer { journal };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig {
            stateful_mode: false,
            ..StreamableHttpServerConfig::default()
        },
    );
    axum::Router::new().nest_service("/mcp", service)
}
