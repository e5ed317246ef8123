//! The OpenAPI document types a real client: openapi-typescript (from npm) generates
//! TypeScript types from it, and a small program using sessions, their usage, the
//! event pages and a created session must type-check under `tsc --strict`. A document
//! that leaves fields out, or makes required ones optional, fails here. And the client
//! works: a program on openapi-fetch over the generated types, compiled by `tsc` and
//! run by Node.js against a live server, creates a session, streams the turn its
//! message starts (server-sent events, each typed by the document's union), pages
//! its events and finds it by label.

mod common;

use std::path::Path;
use std::process::Command;

use common::{dev, server};
use serde_json::json;

const PROGRAM: &str = r#"
import type { components, paths } from "./api";

type Session = components["schemas"]["Session"];
type Status = "new" | "idle" | "running" | "waiting" | "retrying" | "completed" | "failed" | "escalated" | "closed";
type Page = paths["/v1/sessions/{id}/events"]["get"]["responses"][200]["content"]["application/json"];
type Created = paths["/v1/sessions"]["post"]["responses"][201]["content"]["application/json"];
type Listing = paths["/v1/sessions"]["get"]["responses"][200]["content"]["application/json"];
type ApiError = components["schemas"]["Error"];

export function summarize(s: Session): string {
  const status: Status = s.status;
  const tokens: number = s.usage.input_tokens + s.usage.output_tokens + s.usage.cache_read_tokens;
  const waiting: string | null = s.waiting_for;
  const since: number | null = s.waiting_since;
  const reply: string | null = s.reply;
  return `${s.id} ${status} turn ${s.turn} at ${s.last_seq}: ${tokens} tokens, $${s.cost_usd.toFixed(4)} ${waiting ?? ""}${since ?? ""} ${reply ?? ""} ${s.priced}`;
}

export function follow(page: Page): string[] {
  const schema: number = page.schema;
  const next: number = page.has_more ? page.next_after : page.after;
  return page.events.map((e) => `${schema} ${next} ${e.seq}:${e.type}@${e.at_ms ?? 0}`);
}

type PublicEvent = components["schemas"]["PublicEvent"];

// Events are a union discriminated by `type`: each kind's fields are typed.
export function show(e: PublicEvent): string {
  switch (e.type) {
    case "tool_call_outcome":
      return `${e.seq} ${e.call_id} exit ${e.exit_code ?? "-"}: ${e.output.excerpt} (${e.output.bytes} bytes${e.output.blob ? ", blob " + e.output.blob.hash : ""})`;
    case "model_call_outcome":
      return `${e.call_id} ${e.text} ${e.usage.output_tokens} tokens $${e.cost_usd} ${e.tool_uses.map((u) => u.name).join(",")}`;
    case "tool_call_interrupted":
      return e.resolution.kind === "reconciled" ? `${e.resolution.done} ${e.resolution.evidence}` : e.resolution.kind;
    case "escalated":
      return `${e.breaker}: ${e.reason} ${e.diff.join(" ")}`;
    case "error":
      return `${e.error.code}: ${e.error.message} ${e.error.next_attempt_at_ms ?? ""}`;
    case "restart":
      return e.text;
    default:
      return `${e.seq} ${e.type} at ${e.at_ms}`;
  }
}

export function opened(c: Created, l: Listing, e: ApiError): string {
  const owners: string[] = l.sessions.map((s) => s.owner);
  return `${c.id} ${c.status} ${c.model} ${c.workspace} ${owners.join(",")} ${e.error.code}: ${e.error.message}`;
}
"#;

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (install Node.js and npm)"));
    assert!(
        out.status.success(),
        "{program} {args:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs openapi-typescript, TypeScript and `extra` in `dir`, and generates the
/// document's types there as `api.ts`.
fn generate(dir: &Path, extra: &[&str]) {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let mut install = vec![
        "install",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "openapi-typescript@7.13.0",
        "typescript@5.9",
    ];
    install.extend_from_slice(extra);
    run(dir, "npm", &install);
    run(
        dir,
        "npx",
        &["openapi-typescript", spec.to_str().unwrap(), "-o", "api.ts"],
    );
}

#[test]
fn a_typescript_client_generated_from_the_document_type_checks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("package.json"), r#"{"private": true}"#).unwrap();
    generate(dir.path(), &[]);
    std::fs::write(dir.path().join("client.ts"), PROGRAM).unwrap();
    run(
        dir.path(),
        "npx",
        &[
            "tsc",
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "client.ts",
        ],
    );
}

/// The live program: typed calls through openapi-fetch, and the turn's stream read
/// as a browser's fetch reads it.
const LIVE: &str = r#"
import createClient from "openapi-fetch";
import type { components, paths } from "./api.js";

type PublicEvent = components["schemas"]["PublicEvent"];
type PostMessage = components["schemas"]["PostMessage"];

const base = process.argv[2];
const client = createClient<paths>({ baseUrl: base });

async function main(): Promise<void> {
  const created = await client.POST("/v1/sessions", {
    body: { labels: { team: "ts" }, workspace: { kind: "empty", files: { "notes.txt": "hello" } } },
  });
  if (!created.data) throw new Error(`create: ${JSON.stringify(created.error)}`);
  const id: string = created.data.id;

  // Posting a message answers with the turn it starts, as server-sent events.
  const message: PostMessage = { text: "say hello" };
  const resp = await fetch(`${base}/v1/sessions/${id}/messages`, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify(message),
  });
  if (resp.status !== 200 || !resp.body) throw new Error(`stream: ${resp.status}`);
  const kinds: string[] = [];
  let reply = "";
  let ended = false;
  let buffer = "";
  const decoder = new TextDecoder();
  const reader = resp.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const lines = frame.split("\n");
      if (lines.some((l) => l === "event: end")) {
        ended = true;
        continue;
      }
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      const event = JSON.parse(data) as PublicEvent;
      kinds.push(event.type);
      if (event.type === "model_call_outcome") reply = event.text;
    }
  }
  if (!ended) throw new Error(`the stream did not end with end: ${kinds}`);
  if (kinds[0] !== "user_message" || !kinds.includes("turn_ended")) throw new Error(`kinds: ${kinds}`);
  if (reply !== "Hello from TypeScript's server.") throw new Error(`reply: ${reply}`);

  // The route answers a page (JSON) or a stream (SSE) as asked: the type says both.
  const page = await client.GET("/v1/sessions/{id}/events", {
    params: { path: { id }, query: { after: 0, limit: 1 } },
    headers: { accept: "application/json" },
  });
  if (!page.data || !("events" in page.data)) throw new Error(`not a page: ${JSON.stringify(page.data)}`);
  if (page.data.events[0].type !== "session_started" || !page.data.has_more)
    throw new Error(`page: ${JSON.stringify(page.data)}`);
  const listed = await client.GET("/v1/sessions", { params: { query: { label: "team=ts" } } });
  if (!listed.data || listed.data.sessions.map((s) => s.id).join() !== id)
    throw new Error(`listed: ${JSON.stringify(listed.data)}`);
  const shown = await client.GET("/v1/sessions/{id}", { params: { path: { id } } });
  if (!shown.data || shown.data.status !== "idle") throw new Error(`shown: ${JSON.stringify(shown.data)}`);
  console.log("ok", id, kinds.length);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_typescript_client_creates_streams_pages_and_lists() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("package.json"),
        r#"{"private": true, "type": "module"}"#,
    )
    .unwrap();
    generate(dir.path(), &["openapi-fetch@0.14", "@types/node@20"]);
    std::fs::write(dir.path().join("live.ts"), LIVE).unwrap();
    run(
        dir.path(),
        "npx",
        &[
            "tsc",
            "--strict",
            "--target",
            "es2022",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--types",
            "node",
            "--outDir",
            "out",
            "live.ts",
        ],
    );

    let srv = server(
        json!([{"text": "Hello from TypeScript's server."}]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let mut node = Command::new("node");
    node.arg("out/live.js")
        .arg(&srv.url)
        .current_dir(dir.path());
    common::run_client_program(node).await;
}
