//! The OpenAPI document types a real client: openapi-typescript (from npm) generates
//! TypeScript types from it, and a small program using sessions, their usage, the
//! event pages and a created session must type-check under `tsc --strict`. A document
//! that leaves fields out, or makes required ones optional, fails here.

use std::path::Path;
use std::process::Command;

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

#[test]
fn a_typescript_client_generated_from_the_document_type_checks() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    std::fs::write(dir.path().join("package.json"), r#"{"private": true}"#).unwrap();
    run(
        dir.path(),
        "npm",
        &[
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "openapi-typescript@7.13.0",
            "typescript@5.9",
        ],
    );
    run(
        dir.path(),
        "npx",
        &["openapi-typescript", spec.to_str().unwrap(), "-o", "api.ts"],
    );
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
