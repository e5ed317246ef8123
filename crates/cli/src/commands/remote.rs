//! `sessions`, `log`, `diff`, `stop`, `close`, `delete`, `signal` and `send` through
//! a server's HTTP API (`--server URL`), as the token's owner: the same commands and
//! output as on the local world, with no database credentials on the caller's machine.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use super::log::LogArgs;
use super::manage::{DiffArgs, ForkArgs, RewindArgs, SendArgs, SignalArgs, UpgradeArgs};
use super::sessions::SessionsArgs;
use crate::home::me;
use crate::remote::{segment, Remote};

/// How long `stop` waits to see the turn stopped.
const WAIT: Duration = Duration::from_secs(15);
/// A page of events or sessions asked for at once.
const PAGE: usize = 1000;

fn session_path(id: &str) -> String {
    format!("/v1/sessions/{}", segment(id))
}

/// `steadfast sessions --server`: every page the filters select (up to `--limit`).
pub async fn sessions(remote: &Remote, args: SessionsArgs) -> anyhow::Result<ExitCode> {
    let mut query: Vec<(&str, String)> = Vec::new();
    for (key, value) in [
        ("status", args.status),
        ("agent", args.agent),
        ("label", args.label),
        ("title", args.title),
    ] {
        if let Some(value) = value {
            query.push((key, value));
        }
    }
    let mut found: Vec<steadfast_world::SessionSummary> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let wanted = args.limit.map_or(PAGE, |l| (l - found.len()).min(PAGE));
        if wanted == 0 {
            break;
        }
        let mut page_query = query.clone();
        page_query.push(("limit", wanted.to_string()));
        if let Some(c) = &cursor {
            page_query.push(("cursor", c.clone()));
        }
        let page = remote
            .json(Method::GET, "/v1/sessions", &page_query, None)
            .await?;
        found.extend(serde_json::from_value::<Vec<_>>(page["sessions"].clone())?);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    super::sessions::print(&found, args.json)
}

/// `steadfast log --server`: the session's public events, `--follow` until it ends.
pub async fn log(remote: &Remote, args: LogArgs) -> anyhow::Result<ExitCode> {
    let path = format!("{}/events", session_path(&args.session));
    let mut after = 0u64;
    loop {
        let page = remote
            .json(
                Method::GET,
                &path,
                &[("after", after.to_string()), ("limit", PAGE.to_string())],
                None,
            )
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let mut ended = false;
        {
            let mut out = std::io::stdout().lock();
            for event in &events {
                if args.json {
                    writeln!(out, "{event}")?;
                } else {
                    writeln!(out, "{}", line(event))?;
                }
                after = after.max(event["seq"].as_u64().unwrap_or(after));
                ended |= event["type"] == "session_ended" && event["state"] != "escalated";
            }
            out.flush()?;
        }
        if page["has_more"] == true {
            continue;
        }
        if !args.follow || ended {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// One public event as a timeline line: its position, time, type and the gist.
fn line(event: &Value) -> String {
    let text = |key: &str| event[key].as_str().unwrap_or_default().to_string();
    let short = |s: String| -> String {
        let first = s.lines().next().unwrap_or_default();
        let mut cut: String = first.chars().take(100).collect();
        if cut.len() < s.len() {
            cut.push('…');
        }
        cut
    };
    let gist = match event["type"].as_str().unwrap_or_default() {
        "session_started" => format!("{} {}", text("agent"), text("model")),
        "user_message" | "steered" => short(text("text")),
        "model_call_outcome" => {
            let tools: Vec<&str> = event["tool_uses"]
                .as_array()
                .map(|t| t.iter().filter_map(|u| u["name"].as_str()).collect())
                .unwrap_or_default();
            match tools.is_empty() {
                true => short(text("text")),
                false => format!("calls {}", tools.join(", ")),
            }
        }
        "tool_call_intent" => format!("{} {}", text("tool"), short(event["input"].to_string())),
        "tool_call_outcome" => {
            let excerpt = event["output"]["excerpt"].as_str().unwrap_or_default();
            match event["exit_code"].as_i64() {
                Some(code) => format!("exit {code} {}", short(excerpt.to_string())),
                None => short(excerpt.to_string()),
            }
        }
        "wait_started" => format!("waits for {}: {}", text("signal"), short(text("reason"))),
        "signal_received" => text("signal"),
        "turn_ended" => short(text("reply")),
        "turn_interrupted" => format!("by {}", text("by")),
        "escalated" => format!("{}: {}", text("breaker"), short(text("reason"))),
        "session_ended" => format!("{}: {}", text("state"), short(text("reason"))),
        "error" => short(
            event["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
        _ => String::new(),
    };
    format!(
        "#{:<5} {} {:<20} {gist}",
        event["seq"],
        crate::render::time(event["at_ms"].as_u64().unwrap_or_default()),
        text("type")
    )
}

/// `steadfast diff --server`.
pub async fn diff(remote: &Remote, args: DiffArgs) -> anyhow::Result<ExitCode> {
    let mut query = Vec::new();
    if let Some(from) = args.from {
        query.push(("from", from.to_string()));
    }
    if let Some(to) = args.to {
        query.push(("to", to.to_string()));
    }
    let answer = remote
        .json(
            Method::GET,
            &format!("{}/diff", session_path(&args.session)),
            &query,
            None,
        )
        .await?;
    let diff: steadfast_harness::WorkspaceDiff = serde_json::from_value(answer)?;
    super::manage::print_diff(&diff, args.json)
}

/// The session's status as the server shows it.
async fn status(remote: &Remote, session: &str) -> anyhow::Result<(String, u64)> {
    let shown = remote
        .json(Method::GET, &session_path(session), &[], None)
        .await?;
    Ok((
        shown["status"].as_str().unwrap_or_default().to_string(),
        shown["last_seq"].as_u64().unwrap_or_default(),
    ))
}

/// Whether a session in this status has something running that `stop` can stop.
fn runs(status: &str) -> bool {
    steadfast_log::Status::parse(status).is_some_and(steadfast_log::Status::is_interruptible)
}

/// `steadfast stop --server`: interrupts the running turn and waits to see it stop.
pub async fn stop(remote: &Remote, session: &str) -> anyhow::Result<ExitCode> {
    let (now, _) = status(remote, session).await?;
    if !runs(&now) {
        eprintln!(
            "steadfast: session {session} is {now}; nothing runs, so there is nothing to stop"
        );
        return Ok(ExitCode::from(1));
    }
    let queued = remote
        .json(
            Method::POST,
            &format!("{}/interrupt", session_path(session)),
            &[],
            None,
        )
        .await?;
    let started = Instant::now();
    while started.elapsed() < WAIT {
        let (now, seq) = status(remote, session).await?;
        if !runs(&now) {
            eprintln!(
                "steadfast: session {session} stopped ({now}, #{seq}) in {} ms; carry on with: {} --server {} send {session} \"<what next>\"",
                started.elapsed().as_millis(),
                me(),
                remote.base()
            );
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "steadfast: interrupt #{} queued for {session}; no worker has taken it yet (is one running?)",
        queued["id"]
    );
    Ok(ExitCode::from(1))
}

/// `steadfast close --server`.
pub async fn close(remote: &Remote, session: &str) -> anyhow::Result<ExitCode> {
    let closed = remote
        .json(
            Method::POST,
            &format!("{}/close", session_path(session)),
            &[],
            None,
        )
        .await?;
    let how = match closed["status"].as_str() {
        Some("closed") => "closed".to_string(),
        other => format!("had already ended ({})", other.unwrap_or("?")),
    };
    eprintln!("steadfast: session {session} {how}; its log stays");
    Ok(ExitCode::SUCCESS)
}

/// `steadfast delete --server`.
pub async fn delete(remote: &Remote, session: &str) -> anyhow::Result<ExitCode> {
    remote
        .send(Method::DELETE, &session_path(session), &[], None)
        .await?;
    eprintln!("steadfast: session {session} deleted (its log and outputs)");
    Ok(ExitCode::SUCCESS)
}

/// `steadfast signal --server`.
pub async fn signal(remote: &Remote, args: SignalArgs) -> anyhow::Result<ExitCode> {
    let payload: Value = serde_json::from_str(&args.payload)
        .map_err(|e| anyhow::anyhow!("the payload is not JSON: {e}"))?;
    let mut query = vec![("queue", args.queue.to_string())];
    if let Some(wait) = args.wait {
        query.push(("wait", wait.to_string()));
    }
    let accepted = remote
        .json(
            Method::POST,
            &format!(
                "{}/signals/{}",
                session_path(&args.session),
                segment(&args.name)
            ),
            &query,
            Some(&payload),
        )
        .await?;
    let what = match accepted["answers"].as_u64() {
        Some(seq) => format!("answers the wait at #{seq}"),
        None => "queued for the next wait on it".to_string(),
    };
    eprintln!(
        "steadfast: signal {} for {} (#{}) {what}",
        args.name, args.session, accepted["id"]
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast fork --server`: the forks are the caller's; their ids are printed one a
/// line, and the server's workers drive them.
pub async fn fork(remote: &Remote, args: ForkArgs) -> anyhow::Result<ExitCode> {
    let made = remote
        .json(
            Method::POST,
            &format!("{}/fork", session_path(&args.session)),
            &[],
            Some(&json!({"at": args.at, "count": args.count, "title": args.title, "model": args.model})),
        )
        .await?;
    let forks = made["sessions"].as_array().cloned().unwrap_or_default();
    for fork in &forks {
        println!("{}", fork["id"].as_str().unwrap_or_default());
    }
    eprintln!(
        "steadfast: {} fork(s) of {}; give one a message with: {} --server {} send <fork> \"...\"",
        forks.len(),
        args.session,
        me(),
        remote.base()
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast rewind --server`: prints the fork that keeps what was set aside.
pub async fn rewind(remote: &Remote, args: RewindArgs) -> anyhow::Result<ExitCode> {
    let report = remote
        .json(
            Method::POST,
            &format!("{}/rewind", session_path(&args.session)),
            &[],
            Some(&json!({"to": args.to})),
        )
        .await?;
    println!("{}", report["branch"].as_str().unwrap_or_default());
    for fact in report["facts"].as_array().into_iter().flatten() {
        eprintln!(
            "steadfast: still standing (the model will be told): {}",
            fact.as_str().unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `steadfast upgrade --server`.
pub async fn upgrade(remote: &Remote, args: UpgradeArgs) -> anyhow::Result<ExitCode> {
    let changed = remote
        .json(
            Method::POST,
            &format!("{}/agent", session_path(&args.session)),
            &[],
            Some(&json!({"agent": args.agent})),
        )
        .await?;
    println!(
        "{} ({})",
        changed["agent"].as_str().unwrap_or_default(),
        changed["cli"].as_str().unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast send --server`: the message is queued once the server answers (its
/// stream of the turn is not waited for).
pub async fn send(remote: &Remote, args: SendArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.text.trim().is_empty(), "the text is empty");
    let kind = if args.steer { "steer" } else { "message" };
    remote
        .send(
            Method::POST,
            &format!("{}/messages", session_path(&args.session)),
            &[],
            Some(&json!({"text": args.text, "kind": kind})),
        )
        .await?;
    eprintln!(
        "steadfast: {kind} queued for {}; follow it with: {} --server {} log --follow {}",
        args.session,
        me(),
        remote.base(),
        args.session
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast ports --server`: what listens in a session's sandbox, one line each
/// (port, service or `-`, preview URL), starting the sandbox if it had stopped.
pub async fn ports(remote: &Remote, session: &str, json: bool) -> anyhow::Result<ExitCode> {
    let list = remote
        .json(
            Method::GET,
            &format!("{}/ports", session_path(session)),
            &[],
            None,
        )
        .await?;
    if json {
        println!("{list}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    for port in list["ports"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "{}\t{}\t{}{}",
            port["port"],
            port["service"].as_str().unwrap_or("-"),
            remote.base().trim_end_matches('/'),
            port["url"].as_str().unwrap_or_default()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `steadfast ports --share PORT`: makes a share link and prints its whole URL (its
/// id, for revoking it, on stderr).
pub async fn share(
    remote: &Remote,
    session: &str,
    port: u16,
    expires_in: u64,
) -> anyhow::Result<ExitCode> {
    let made = remote
        .json(
            Method::POST,
            &format!("{}/links", session_path(session)),
            &[],
            Some(&json!({"port": port, "expires_in_s": expires_in})),
        )
        .await?;
    eprintln!(
        "steadfast: link {} to port {port} of {session}, for {expires_in} s",
        made["link"]["id"].as_str().unwrap_or_default()
    );
    println!(
        "{}{}",
        remote.base().trim_end_matches('/'),
        made["url"].as_str().unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast ports --revoke LINK`: the link stops working at once.
pub async fn revoke_link(remote: &Remote, session: &str, link: &str) -> anyhow::Result<ExitCode> {
    remote
        .json(
            Method::DELETE,
            &format!("{}/links/{}", session_path(session), segment(link)),
            &[],
            None,
        )
        .await?;
    eprintln!("steadfast: link {link} of {session} revoked");
    Ok(ExitCode::SUCCESS)
}

/// `steadfast hooks`: a session's inbound hooks, made, listed and revoked through a
/// server's API (a hook's URL is the server's, so there is no local form).
#[derive(Debug, clap::Args)]
pub struct HooksArgs {
    #[command(subcommand)]
    action: HookAction,
}

#[derive(Debug, clap::Subcommand)]
enum HookAction {
    /// Make a hook: its URL and secret are printed once (secret on stdout, the rest on
    /// stderr), e.g. `hooks create $ID ci --check github`.
    Create {
        /// The session.
        session: String,
        /// The hook's name: the signal a delivery sends.
        name: String,
        /// How a delivery is checked: token (in the URL), github, slack, hmac.
        #[arg(long, default_value = "token")]
        check: String,
        /// What a delivery does: signal (answers a wait) or message (starts a turn).
        #[arg(long, default_value = "signal")]
        then: String,
        /// Read the signing key from stdin (Slack's signing secret) instead of having
        /// one made.
        #[arg(long)]
        secret_stdin: bool,
        /// Print the whole answer as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// List a session's hooks (never their secrets).
    List {
        /// The session.
        session: String,
    },
    /// Revoke a hook: its URL and secret stop working at once.
    Delete {
        /// The session.
        session: String,
        /// The hook.
        name: String,
    },
}

/// `steadfast hooks --server`.
pub async fn hooks(remote: &Remote, args: HooksArgs) -> anyhow::Result<ExitCode> {
    match args.action {
        HookAction::Create {
            session,
            name,
            check,
            then,
            secret_stdin,
            json,
        } => {
            let mut body = json!({"name": name, "check": check, "then": then});
            if secret_stdin {
                body["secret"] = Value::String(crate::read_secret()?);
            }
            let made = remote
                .json(
                    Method::POST,
                    &format!("{}/hooks", session_path(&session)),
                    &[],
                    Some(&body),
                )
                .await?;
            if json {
                println!("{made}");
            } else {
                eprintln!(
                    "steadfast: hook {name} ({check}, then {then}) for {session}: {}",
                    made["url"].as_str().unwrap_or_default()
                );
                println!("{}", made["secret"].as_str().unwrap_or_default());
            }
        }
        HookAction::List { session } => {
            let list = remote
                .json(
                    Method::GET,
                    &format!("{}/hooks", session_path(&session)),
                    &[],
                    None,
                )
                .await?;
            let mut out = std::io::stdout().lock();
            for hook in list["hooks"].as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}",
                    hook["name"].as_str().unwrap_or_default(),
                    hook["check"].as_str().unwrap_or_default(),
                    hook["then"].as_str().unwrap_or_default(),
                    hook["url"].as_str().unwrap_or_default()
                )?;
            }
        }
        HookAction::Delete { session, name } => {
            remote
                .json(
                    Method::DELETE,
                    &format!("{}/hooks/{}", session_path(&session), segment(&name)),
                    &[],
                    None,
                )
                .await?;
            eprintln!("steadfast: hook {name} of {session} revoked");
        }
    }
    Ok(ExitCode::SUCCESS)
}
